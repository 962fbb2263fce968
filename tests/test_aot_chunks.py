"""Functions translated in chunks (berm_aot/emit/chunks.py): a function over CHUNKED_ABOVE instructions becomes
several C functions that hand control to each other by tail transfers.

Real functions that large are rare and slow to compile, so most tests lower the thresholds: every function of more
than a few instructions is then cut into chunks of a few, and random programs, whole C guests and the Rust guest
must end exactly as on the interpreter or natively. Every translation goes to a cache of its own (the thresholds
are not in the cache key)."""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path

import pytest

from berm_aot.analysis import analyse
from berm_aot.elf import read_elf
from berm_aot.emit import chunks
from berm_aot.emit.dataflow import successors
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.traps import TrapKind
from tests import progen
from tests.bounded import GRACE, ends_within
from tests.guests import guest_elf
from tests.test_aot_diff import assert_same, collect, run_both
from tests.test_aot_guests import FUNCS, SOURCE, native_library
from tests.test_rust_guest import ELF as RUST_ELF

MEMORY = 1 << 20


@contextlib.contextmanager
def in_chunks(above: int, size: int):
    """Translations made meanwhile cut every function of more than ``above`` instructions into chunks of at most
    ``size`` (tools/fuzz_diff.py --chunks runs its campaign in this too)."""
    saved = chunks.CHUNKED_ABOVE, chunks.CHUNK_INSNS
    chunks.CHUNKED_ABOVE, chunks.CHUNK_INSNS = above, size
    try:
        yield
    finally:
        chunks.CHUNKED_ABOVE, chunks.CHUNK_INSNS = saved


@pytest.fixture
def tiny_chunks():
    """Every function of more than 3 instructions in chunks of at most 4."""
    with in_chunks(3, 4):
        yield


def plans(program: Program) -> list[chunks.Chunks]:
    return [plan for info in analyse(program).functions if (plan := chunks.chunk_plan(info, program)) is not None]


def test_random_programs_in_chunks_match_the_interpreter(tiny_chunks):
    gens = collect(progen.programs(), 60)
    cut = [plan for gen in gens for plan in plans(Program.from_image(gen.image))]
    assert len(cut) >= len(gens) and sum(len(plan.parts) for plan in cut) >= 10 * len(gens)
    for gen, expected, results in run_both(gens, repeat=2):  # the second run also checks the memory reset
        for got in results:
            assert_same(gen, expected, got)


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return native_library(tmp_path_factory.mktemp("native"))


@pytest.mark.parametrize("opt", ["-O2", "-O0"])
def test_c_guest_in_chunks_matches_native(tiny_chunks, native, opt, tmp_path):
    elf = guest_elf(SOURCE, opt=opt, keep=tuple(FUNCS))
    guest = Engine(cache_dir=tmp_path).load(elf)
    assert len(plans(guest.program)) >= len(FUNCS)
    for name, calls in sorted(FUNCS.items()):
        entry = guest.program.symbol(name)
        for args in calls:
            got = guest.backend.run(RunRequest(entry=entry, int_args=args))
            assert got.trap is None, (name, args, got.trap)
            assert got.a0 == getattr(native, name)(*args), (name, args)


def test_rust_guest_in_chunks_matches_the_interpreter(tmp_path):
    """rust-probe with every function over 64 instructions in chunks of at most 48 (smaller chunks would make a
    compile of minutes): its formatting, match tables, trait objects, B-tree and soft floats cross chunks."""
    with in_chunks(64, 48):
        harnesses = {kind: Engine(kind=kind, cache_dir=tmp_path).load(RUST_ELF).harness(name="probe")
                     for kind in ("aot", "interp")}
        assert sum(len(plan.parts) for plan in plans(harnesses["aot"].image.program)) >= 200
    for tool, args in [("format", b"hi"), ("classify", bytes(range(256))), ("shapes", b""), ("check", b"abc"),
                       ("numbers", b"abcdefg"), ("words", "The cat and the hat. Ärger ärger δέλτα 42".encode()),
                       ("parse", b"[1.5, -2e3, 7]")]:
        outcomes = {}
        for kind, harness in harnesses.items():
            try:
                outcomes[kind] = ("ok", harness.call(tool, args))
            except Exception as exc:  # a tool failure or a trap: both engines must end the same way
                outcomes[kind] = (type(exc).__name__, str(exc))
        assert outcomes["aot"] == outcomes["interp"], tool


def _branchy_function(n: int) -> str:
    """One function of 4n + 2 instructions: n steps, each a loop of three instructions after a fourth (a cut
    between two steps or before a loop crosses one edge, one inside a loop two)."""
    steps = "".join(f".Ls{k}:\n    addi t0, t0, 3\n.Ll{k}:\n    addi a0, a0, 1\n    addi t0, t0, -1\n"
                    f"    bnez t0, .Ll{k}\n" for k in range(n))
    return f"""
    .globl _start
    .type _start, @function
_start:
    li t0, 0
{steps}    ret
    .data
    .globl table
table:
    .dword _start
"""


def test_a_plan_cuts_where_few_edges_cross_and_enters_wherever_control_crosses():
    program = Program.from_image(read_elf(guest_elf(_branchy_function(200), suffix=".S", keep=("table",))))
    with in_chunks(100, 64):
        (plan,) = plans(program)
    whole = plan.whole
    assert [i.addr for part in plan.parts for i in part.insns] == [i.addr for i in whole.insns]
    assert all(len(part.insns) <= 64 for part in plan.parts) and len(plan.parts) >= len(whole.insns) // 64
    chunk_of = {i.addr: k for k, part in enumerate(plan.parts) for i in part.insns}
    loops = [(i.addr, i.addr + i.imm) for i in whole.insns if i.op == "bne"]
    assert len(loops) == 200 and all(chunk_of[head] == chunk_of[end] for end, head in loops)  # no loop is cut
    for k, part in enumerate(plan.parts):
        assert set(part.local_targets) == {t for t, home in plan.home.items() if home == k}
        for insn in part.insns:
            for target in successors(insn):
                if target in chunk_of and chunk_of[target] != k:
                    assert plan.home[target] == chunk_of[target], (hex(insn.addr), hex(target))
    assert plan.home[whole.start] == 0


SPIN = """
    .globl _start
    .type _start, @function
_start:
1:
    .rept 7
    addi a0, a0, 1
    .endr
    j 1b
    .data
    .globl table
table:
    .dword _start
"""


def test_a_loop_across_chunks_hits_the_deadline(tiny_chunks, tmp_path):
    """Its back-edge is a transfer to another chunk, which no back-edge poll sees: the chunk's entry polls."""
    image = Engine(kind="aot", memory_size=MEMORY, cache_dir=tmp_path).load(guest_elf(SPIN, suffix=".S",
                                                                                      keep=("table",)))
    assert len(plans(image.program)[0].parts) == 2
    run = RunRequest(entry=image.program.image.entry, deadline=time.monotonic() + 0.2)
    r = ends_within(GRACE, lambda: image.backend.run(run))
    assert r.trap is not None and r.trap.kind is TrapKind.INTERRUPTED and "_start" in r.trap.where


def test_a_chunk_entry_is_no_entry_for_the_host(tiny_chunks, tmp_path):
    """The host enters functions only (docs/SEMANTICS.md): the lookup that finds a chunk by its entry is not one
    the host's entry goes through."""
    elf = guest_elf(SPIN, suffix=".S", keep=("table",))
    image = Engine(kind="aot", memory_size=MEMORY, cache_dir=tmp_path).load(elf)
    middle = plans(image.program)[0].parts[1].insns[0].addr
    interp = Engine(kind="interp", memory_size=MEMORY).load(elf)
    got, expected = (i.backend.run(RunRequest(entry=middle)) for i in (image, interp))
    assert got.trap == expected.trap and got.trap.kind is TrapKind.ILLEGAL_INSTRUCTION and got.trap.pc == middle


def _straight_function(n: int) -> str:
    return f"""
    .globl _start
    .type _start, @function
_start:
    .rept {n}
    addi a0, a0, 1
    .endr
    ret
    .data
    .globl table
table:
    .dword _start
"""


def test_a_function_too_large_for_one_c_function_runs_in_chunks():
    """At the real thresholds: one function of CHUNKED_ABOVE + 2 instructions (a 129 KB image of one function
    took gcc 110 s and 1.85 GB as one C function)."""
    n = chunks.CHUNKED_ABOVE + 1
    elf = guest_elf(_straight_function(n), suffix=".S", keep=("table",))
    with tempfile.TemporaryDirectory() as tmp:
        image = Engine(kind="aot", memory_size=MEMORY, cache_dir=Path(tmp)).load(elf)
        (plan,) = plans(image.program)
        assert len(plan.parts) == -(-(n + 1) // chunks.CHUNK_INSNS)
        assert image.backend.run(RunRequest(entry=image.program.image.entry)).regs[10] == n


def _jump_table(n: int) -> str:
    """``_start(i)``: through a table of ``n`` cases, case i adds i + 1 to a1 and returns; i past the table jumps to
    whatever address follows it (``after``: the end of the table's section, no legal target)."""
    cases = "".join(f".Lc{i}:\n    addi a1, a1, {i + 1}\n    ret\n" for i in range(n))
    entries = "".join(f"    .dword .Lc{i}\n" for i in range(n))
    return f"""
    .globl _start
    .type _start, @function
_start:
    lla t0, .Ltab
    slli a0, a0, 3
    add t0, t0, a0
    ld t0, 0(t0)
    jr t0
{cases}
    .section .rodata
    .p2align 3
.Ltab:
{entries}
    .dword 0x10
    .data
    .globl table
table:
    .dword _start
"""


def test_a_jump_table_in_chunks_lists_each_target_once_and_runs_as_on_the_interpreter(tmp_path):
    """Every chunk's indirect jump listed every legal target of the function, a case apiece: the C of a function with
    a table of n entries grew as n times its chunks (15,000 entries: 75 s of gcc, 50,000: past the compile timeout).
    A chunk branches to its own targets and leaves for the others through one check of the function's."""
    n = 120
    with in_chunks(3, 8):
        elf = guest_elf(_jump_table(n), suffix=".S", keep=("table",))
        program = Program.from_image(read_elf(elf))
        [plan] = plans(program)
        assert len(plan.parts) > 20
        from berm_aot.emit import emit_program
        from berm_host.layout import layout_for
        units = emit_program(program, windows=layout_for(program.image, MEMORY).windows())
        assert sum(u.count("    case 0x") for u in units) < 6 * n  # about one entry and one jump case per target
        image = Engine(kind="aot", memory_size=MEMORY, cache_dir=tmp_path).load(elf)
    interp = Engine(kind="interp", memory_size=MEMORY).load(elf)
    for i in (0, 1, 57, n - 1, n, n + 5):  # n: the table's last word (0x10, no code); past it, zeros
        got, expected = (e.backend.run(RunRequest(entry=program.image.entry, int_args=(i,))) for e in (image, interp))
        assert (got.trap, got.regs[11]) == (expected.trap, expected.regs[11]), i
        if i < n:
            assert got.trap is None and got.regs[11] == i + 1
