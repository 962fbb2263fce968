"""Hostile guests: every escape attempt ends in a trap (or a HostError for a bad result) with the host alive.

One guest image holds every attempt as its own function (compiled and translated once for the module); each
test runs one of them on the translated code and, where the run is bounded, on the interpreter too, which must
agree exactly (trap kind, pc, address, detail, registers).
"""

from __future__ import annotations

import re
import time

import pytest

from berm_abi.names import fnv1a64
from berm_aot.analysis import analyse
from berm_aot.elf import read_elf
from berm_aot.emit import emit_program
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.layout import DEPTH_DETAIL, SP_BELOW_STACK, layout_for
from berm_host.linker import Linker
from berm_host.traps import HostError, TrapKind
from tests.bounded import GRACE, ends_within
from tests.elf_samples import ASM_PRELUDE
from tests.guests import guest_elf, raw_harness_elf

MEMORY = 1 << 20

HOSTILE = r"""
static volatile u64 v;
static const volatile u64 ro_word = 7;
u64 data_word = 5;

u64 load_at(u64 addr) { return *(volatile u64 *)addr; }
u64 load_byte_at(u64 addr) { return *(volatile unsigned char *)addr; }
u64 store_at(u64 addr) { *(volatile u64 *)addr = 0x1122334455667788ul; return 1; }
u64 store_rodata(void) { *(volatile u64 *)&ro_word = 1; return ro_word; }
u64 rodata_addr(void) { return (u64)&ro_word; }
u64 data_addr(void) { return (u64)&data_word; }

__attribute__((noinline)) u64 target(u64 x) { return x * 3 + v; }
u64 call_at(u64 addr) { return ((u64 (*)(u64))addr)(1); }  /* a tail call at -O1: an indirect jump */
u64 call_back_at(u64 addr) { return ((u64 (*)(u64))addr)(1) + v; }  /* an indirect call (jalr ra) */
u64 target_addr(void) { return (u64)&target; }
u64 jump_mid(void) { volatile u64 off = 2; return call_at((u64)&target + off); }
u64 jump_data(void) { return call_at((u64)&data_word); }

u64 forged_return(u64 addr) {
    __asm__ volatile("mv ra, %0\n\tret" : : "r"(addr));
    return 0;
}

u64 spin(void) { for (;;) v++; }
__attribute__((noinline)) u64 recurse(u64 n) { return recurse(n + 1) + v; }
u64 deep(u64 n) { return recurse(n); }
u64 tail_a(u64 n);
u64 (*volatile tail_slot)(u64) = tail_a;
u64 tail_a(u64 n) { v = n; return tail_slot(n + 1); }

/* A frame larger than the stack (256 KiB here) skipped the 4 KiB guard page and wrote the heap. */
u64 big_frame(u64 i) { volatile char buf[300u << 10]; buf[i] = 1; return buf[i + 1] + 2; }
u64 fitting_frame(u64 i) { volatile char buf[200u << 10]; buf[i] = 1; return buf[i] + 2; }

u64 unknown_call(u64 n) { return ecall2(n, 0, 0); }
u64 breakpoint(void) { __asm__ volatile("ebreak"); return 0; }
u64 illegal(void) { __asm__ volatile(".4byte 0xffffffff"); return 0; }

Pair berm_tool_outside(void) { Pair p = { 0x10, 4 }; return p; }
Pair berm_tool_not_utf8(void) { static char bad[2] = { (char)0xff, (char)0xfe }; Pair p = { (u64)bad, 2 }; return p; }
Pair berm_tool_huge(void) { Pair p = { 0x1000, ~0ul }; return p; }
Pair berm_tool_hello(void) { static char s[] = "hello"; Pair p = { (u64)s, 5 }; return p; }
"""

NAMES = ("load_at", "load_byte_at", "store_at", "store_rodata", "rodata_addr", "data_addr", "call_at", "call_back_at",
         "target_addr", "jump_mid", "jump_data", "forged_return", "spin", "deep", "tail_a", "big_frame",
         "fitting_frame", "unknown_call",
         "breakpoint", "illegal")
TOOLS = ("outside", "not_utf8", "huge", "hello")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    elf = raw_harness_elf(HOSTILE, TOOLS, opt="-O1", keep=NAMES)
    cache = tmp_path_factory.mktemp("cache")
    aot = Engine(memory_size=MEMORY, cache_dir=cache, deadline=0.3).load(elf)
    interp = Engine(kind="interp", memory_size=MEMORY, deadline=0.3).load(elf)
    return aot, interp


def run(image, name, *args, deadline=None):
    entry = image.program.symbol(name)
    assert entry is not None, name
    return image.backend.run(RunRequest(entry=entry, int_args=args, deadline=deadline))


def both(images, name, *args):
    """Run on both engines; they must agree exactly. Returns the translated run."""
    aot, interp = images
    got, expected = run(aot, name, *args), run(interp, name, *args)
    assert got.trap == expected.trap
    assert got.regs == expected.regs
    assert got.pc == expected.pc
    return got


def fault(images, name, *args, addr):
    r = both(images, name, *args)
    assert r.trap is not None and r.trap.kind is TrapKind.MEMORY_FAULT, r.trap
    assert r.trap.addr == addr & (2**64 - 1)
    return r.trap


def layout(images):
    return images[0].backend.layout


def test_load_at_zero(images):
    assert "load 8 bytes" in str(fault(images, "load_at", 0, addr=0))


def test_load_just_below_the_image(images):
    lo = layout(images).image_lo
    fault(images, "load_byte_at", lo - 1, addr=lo - 1)
    fault(images, "load_at", lo - 4, addr=lo - 4)  # straddles into the image: still a fault
    assert both(images, "load_byte_at", lo).trap is None


def test_store_into_rodata(images):
    ro = both(images, "rodata_addr").a0
    t = fault(images, "store_rodata", addr=ro)
    assert "store 8 bytes" in t.detail
    assert both(images, "load_at", ro).a0 == 7  # reading it is fine


def test_guard_page(images):
    lay = layout(images)
    fault(images, "load_at", lay.guard_lo, addr=lay.guard_lo)
    fault(images, "store_at", lay.stack_lo - 8, addr=lay.stack_lo - 8)
    fault(images, "load_at", lay.guard_lo - 4, addr=lay.guard_lo - 4)  # straddles into the guard
    assert both(images, "load_at", lay.guard_lo - 8).trap is None
    assert both(images, "store_at", lay.stack_lo).trap is None


def test_past_the_end(images):
    fault(images, "load_at", MEMORY, addr=MEMORY)
    fault(images, "store_at", MEMORY - 4, addr=MEMORY - 4)
    fault(images, "load_at", 1 << 40, addr=1 << 40)
    assert both(images, "load_at", MEMORY - 8).trap is None


def test_wrapping_near_2_64(images):
    fault(images, "load_at", 2**64 - 4, addr=2**64 - 4)
    fault(images, "store_at", 2**64 - 1, addr=2**64 - 1)
    fault(images, "load_byte_at", 2**64 - 1, addr=2**64 - 1)


def test_the_host_bytes_just_below_guest_memory_are_out_of_reach(images):
    """Guest address 2**64 - k is host address mem - k: the interrupt flag (mem - 8, berm_rt.h) and the dirty
    maps below it. A store there faults, and a run after it is neither interrupted nor restores differently."""
    for k in (8, 16, 4096, 65536):
        fault(images, "store_at", 2**64 - k, addr=2**64 - k)
        fault(images, "load_at", 2**64 - k, addr=2**64 - k)
    data = both(images, "data_addr").a0
    assert both(images, "store_at", data).a0 == 1
    assert both(images, "load_at", data).a0 == 5  # the store before is gone: fresh memory per run


def bad_target(images, name, *args, addr):
    r = both(images, name, *args)
    assert r.trap is not None and r.trap.kind is TrapKind.BAD_INDIRECT_TARGET, r.trap
    assert r.trap.addr == addr
    return r


def test_jump_into_the_middle_of_an_instruction(images):
    t = both(images, "target_addr").a0
    bad_target(images, "jump_mid", addr=t + 2)
    for how in ("call_at", "call_back_at"):  # the address known only at run time: by jump, then by call
        bad_target(images, how, t + 2, addr=t + 2)


def test_jump_to_data(images):
    d = both(images, "data_addr").a0
    bad_target(images, "jump_data", addr=d)  # clang folds the address in: the translator traps statically
    for how in ("call_at", "call_back_at"):
        bad_target(images, how, d, addr=d)


def test_jump_to_an_unnamed_code_address(images):
    deep = images[0].program.symbol("deep")
    for how in ("call_at", "call_back_at"):
        bad_target(images, how, deep + 4, addr=deep + 4)
        assert both(images, how, both(images, "target_addr").a0).a0 == 3  # a named entry is fine


def test_an_entry_inside_a_function_traps_alike_on_both_engines(images):
    """The translated code enters functions only; the interpreter once ran from any address (a global label
    inside a function ran on one engine and trapped on the other). Both now trap before the first instruction."""
    deep = images[0].program.symbol("deep")
    for entry, detail in ((deep + 4, f"entered at {deep + 4:#x}, which is not the start of a function"),
                          (0x12, "no code at 0x12")):
        aot, interp = (image.backend.run(RunRequest(entry=entry)) for image in images)
        assert aot.trap == interp.trap and aot.regs == interp.regs and aot.pc == interp.pc == entry
        assert aot.trap.kind is TrapKind.ILLEGAL_INSTRUCTION and aot.trap.addr == entry
        assert aot.trap.detail == detail


def test_the_call_guests_call_and_jump_as_named(images):
    """call_back_at's indirect transfer is a call (jalr with a link), call_at's a tail jump: the tests above
    cover both run-time checks."""
    program = images[0].program
    by_start = analyse(program).by_start
    for name, link in (("call_at", False), ("call_back_at", True)):
        jalrs = [i for i in by_start[program.symbol(name)].insns if i.op == "jalr" and i.rs1 != 1]
        assert [i.rd != 0 for i in jalrs] == [link], name


def test_return_to_a_forged_address(images):
    t = both(images, "target_addr").a0
    bad_target(images, "forged_return", t + 4, addr=t + 4)
    bad_target(images, "forged_return", 0x1234, addr=0x1234)


@pytest.mark.parametrize("engine", [0, 1], ids=["aot", "interp"])  # a review: the interpreter's went untried
def test_infinite_loop_hits_the_deadline(images, engine):
    r = ends_within(GRACE, lambda: run(images[engine], "spin", deadline=time.monotonic() + 0.2))
    assert r.trap is not None and r.trap.kind is TrapKind.INTERRUPTED
    assert "spin" in r.trap.where


def test_unbounded_recursion_is_stack_exhausted(images):
    r = both(images, "deep", 0)
    assert r.trap.kind is TrapKind.STACK_EXHAUSTED
    assert r.trap.detail == DEPTH_DETAIL


def test_a_frame_larger_than_the_stack_is_stack_exhausted_not_a_write_into_the_heap(images):
    t = both(images, "big_frame", 0).trap
    assert t is not None and t.kind is TrapKind.STACK_EXHAUSTED and t.detail == SP_BELOW_STACK
    assert t.addr < layout(images).guard_lo and t.where.startswith("big_frame")
    assert both(images, "fitting_frame", 0).a0 == 3


@pytest.mark.parametrize("engine", [0, 1], ids=["aot", "interp"])
def test_unbounded_tail_recursion_hits_the_deadline(images, engine):
    r = ends_within(GRACE, lambda: run(images[engine], "tail_a", 0, deadline=time.monotonic() + 0.2))
    assert r.trap is not None and r.trap.kind is TrapKind.INTERRUPTED


def test_unknown_host_call_names_an_ungranted_capability(images):
    n = fnv1a64("berm.fs.read")
    r = both(images, "unknown_call", n)
    assert r.trap.kind is TrapKind.UNKNOWN_HOST_CALL and r.trap.addr == n
    assert "berm.fs.read, not granted" in str(r.trap)
    r = both(images, "unknown_call", 12345)
    assert r.trap.kind is TrapKind.UNKNOWN_HOST_CALL and "12345" in str(r.trap)


def test_ebreak(images):
    assert both(images, "breakpoint").trap.kind is TrapKind.BREAKPOINT


def test_illegal_instruction(images):
    assert both(images, "illegal").trap.kind is TrapKind.ILLEGAL_INSTRUCTION


@pytest.mark.parametrize("engine", [0, 1], ids=["aot", "interp"])
def test_result_outside_memory(images, engine):
    h = images[engine].harness(Linker(), name="hostile")
    with pytest.raises(HostError, match="not inside guest memory"):
        h.call("outside")
    with pytest.raises(HostError, match="not inside guest memory"):
        h.call("huge")
    assert h.call("hello") == "hello"  # the host is fine afterwards


@pytest.mark.parametrize("engine", [0, 1], ids=["aot", "interp"])
def test_result_not_utf8(images, engine):
    with pytest.raises(HostError, match="not UTF-8"):
        images[engine].harness(Linker(), name="hostile").call("not_utf8")


#: A function whose symbol name closes a C comment and opens a preprocessor line: the translator wrote names into
#: comments verbatim, so this name put its own C into the object the host loads (a constructor calling system()
#: ran in the host process).
INJECTING = r"""
__attribute__((noinline)) long weird(long a) __asm__("x */ int berm_injected = 1; /*\n#error injected\n");
long weird(long a) { return a * 3 + 1; }
long _start(long a) { return weird(a) + 2; }
"""


def test_a_symbol_name_cannot_write_c_into_the_translation(tmp_path):
    elf = guest_elf(INJECTING, keep=("_start",))
    program = Program.from_image(read_elf(elf))
    assert any("*/" in f.func.name for f in analyse(program).functions)
    units = emit_program(program, windows=layout_for(program.image, MEMORY).windows())
    # what the C compiler reads as code: comments and string literals (the locator's names) taken out, left to right
    code = [re.sub(r'/\*.*?\*/|"(?:[^"\\\n]|\\.)*"', "", unit, flags=re.S) for unit in units]
    assert not any("berm_injected" in c or "#error" in c for c in code)
    image = Engine(kind="aot", memory_size=MEMORY, cache_dir=tmp_path).load(elf)
    assert image.backend.run(RunRequest(entry=program.image.entry, int_args=(5,))).regs[10] == 18




def test_a_long_name_is_written_into_the_translation_cut():
    """Found by a review: each function's comments held its whole name, and 1,000 functions whose symbols shared one
    300 KB name made 600 MB of C (1.5 GB of host memory) from a 400 KB image. Comments show names as messages do."""
    long_name = "L" * 20_000
    elf = guest_elf(f"""
__attribute__((noinline)) long longly(long a) __asm__("{long_name}");
long longly(long a) {{ return a + 1; }}
long _start(long a) {{ return longly(a) * 2; }}
""", keep=("_start",))
    program = Program.from_image(read_elf(elf))
    assert any(f.func.name == long_name for f in analyse(program).functions)
    units = emit_program(program, windows=layout_for(program.image, MEMORY).windows())
    comments = [c for unit in units for c in re.findall(r"/\*.*?\*/", unit, flags=re.S)]
    assert max(len(c) for c in comments) < 1000 and any("L" * 256 in c for c in comments)


#: A child process that runs guests that fault and recurse without bound, and prints which of SIGSEGV and SIGBUS
#: it catches (/proc's SigCgt: the handlers installed in C too, which signal.getsignal would not see), before and
#: after, with the trap each run ended in.
_SIGNALS_CAUGHT = r"""
import sys
from berm_host.engine import Engine
from berm_host.traps import Trap

def caught():
    mask = next(int(line.split()[1], 16) for line in open("/proc/self/status") if line.startswith("SigCgt:"))
    return [name for name, number in (("SIGSEGV", 11), ("SIGBUS", 7)) if mask >> (number - 1) & 1]

print(caught())
harness = Engine(cache_dir=sys.argv[2], memory_size=1 << 20).load(open(sys.argv[1], "rb").read()).harness()
for tool in ("fault", "deep"):
    try:
        harness.call(tool)
    except Trap as trap:
        print(trap.kind.name)
print(caught())
"""


def test_no_signal_handler_is_installed(tmp_path):
    """DESIGN.md: translated code checks every access and its own depth, and no signal handler is installed. A
    process that never caught SIGSEGV or SIGBUS catches neither after guests that fault and that recurse until
    their stack is gone: the traps come from the checks (found missing by a review of the tests)."""
    import os
    import subprocess
    import sys

    elf = tmp_path / "signals.elf"
    elf.write_bytes(raw_harness_elf(r"""
        static Pair none(void) { Pair p = {0, 0}; return p; }
        Pair berm_tool_fault(void) { *(volatile u64 *)8 = 1; return none(); }
        __attribute__((noinline)) u64 down(u64 n) {
            volatile char frame[512];
            frame[0] = (char)n;
            return down(n + 1) + frame[0];
        }
        Pair berm_tool_deep(void) { down(0); return none(); }
        """, ("fault", "deep")))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}  # faulthandler catches SIGSEGV
    out = subprocess.run([sys.executable, "-c", _SIGNALS_CAUGHT, str(elf), str(tmp_path / "cache")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.split("\n") == ["[]", "MEMORY_FAULT", "STACK_EXHAUSTED", "[]", ""], out.stderr


ODD_FUNCTION = ASM_PRELUDE + r"""
    .globl oddf, oddg
    .p2align 2
    .byte 0
    .type oddf, @function
oddf:
    addi sp, sp, -16
    sd ra, 8(sp)
    jal oddg
    addi a0, a0, 100
    ld ra, 8(sp)
    addi sp, sp, 16
    ret
    .type oddg, @function
oddg:
    addi a0, a0, 1
    ret
"""


def test_a_function_symbol_at_an_odd_address_is_no_function(tmp_path):
    """Found by a review: code entered at an odd FUNC symbol made a call whose link was odd; the callee's ret went
    back there on translated code (its return compared the unmasked sum with the link) and trapped on the
    interpreter (the target's bit 0 cleared, it was no frame's return address). No jump reaches an odd address (a
    jalr clears bit 0) and no instruction starts at one: it starts no function, and entering there traps alike."""
    elf = guest_elf(ODD_FUNCTION, suffix=".S", keep=("oddf", "oddg"))
    program = Program.from_image(read_elf(elf))
    odd = program.symbol("oddf")
    assert odd & 1 and odd not in program.function_starts and not any(a & 1 for a in program.code)
    images = (Engine(memory_size=MEMORY, cache_dir=tmp_path).load(elf),
              Engine(kind="interp", memory_size=MEMORY).load(elf))
    aot, interp = (image.backend.run(RunRequest(entry=odd, int_args=(5,))) for image in images)
    assert aot.trap == interp.trap and aot.regs == interp.regs
    assert aot.trap.kind is TrapKind.ILLEGAL_INSTRUCTION
    assert aot.trap.detail == f"entered at {odd:#x}, which is not the start of a function"
