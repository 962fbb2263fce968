"""Stack accesses at the edges of the stack window, on both engines. Loads and stores through sp, or through a
register the translator knows holds a stack address (berm_aot/emit/stackptr.py), test the stack window first: with
sp at every edge of the window — and outside it, in the guard, at 0, near 2^64 — each access must end exactly as on
the reference interpreter (same result, same trap kind, address and pc), and a value stored must be gone in the
next run."""

from __future__ import annotations

import pytest

from berm_aot.elf import read_elf
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.layout import DEFAULT_MEMORY, stack_size
from tests.guests import guest_elf

TOP = DEFAULT_MEMORY
LOW = DEFAULT_MEMORY - stack_size(DEFAULT_MEMORY)

#: (name, the access through sp): each in a function of its own, at offsets from -2048 to 2047.
ACCESSES = [
    ("ld0", "ld t3, 0(sp)"),
    ("ldneg", "ld t3, -2048(sp)"),
    ("ldpos", "ld t3, 2040(sp)"),
    ("lwtop", "lw t3, 2044(sp)"),
    ("sd0", "sd a1, 0(sp)\\n ld t3, 0(sp)"),
    ("sdalone", "sd a1, 0(sp)\\n mv t3, a1"),  # the only access through sp: BERM_SP_ST, not a group
    ("sdwide", "sd a1, -2048(sp)\\n sd a1, 2040(sp)\\n ld t3, -2048(sp)"),
    ("sbpos", "sb a1, 2047(sp)\\n lbu t3, 2047(sp)"),
    ("csdsp", "c.sdsp a1, 504(sp)\\n c.ldsp t3, 504(sp)"),
    ("twice", "sd a1, 8(sp)\\n addi sp, sp, -16\\n sd a1, 8(sp)\\n ld t3, 24(sp)\\n addi sp, sp, 16"),
    # several accesses in one block, checked as a group (berm_aot/emit/groups.py), spread over two pages
    ("group", "sd a1, -2048(sp)\\n sw a1, 2000(sp)\\n sh a1, 8(sp)\\n ld t3, -2048(sp)\\n lhu t3, 8(sp)"),
    # a group whose members straddle an edge when sp is near one: the first member runs, a later one traps
    ("straddle", "sd a1, 0(sp)\\n sd a1, 16(sp)\\n ld t3, 0(sp)"),
]

#: A store and a load through a register the translator knows holds sp plus something (berm_aot/emit/stackptr.py).
STACK_POINTER_SOURCE = r"""
u64 data_slot = 7;
const volatile u64 ro_slot = 9;
u64 via_stack(u64 target, u64 value) {
    u64 out;
    __asm__ volatile("sub t1, %1, sp\n add t0, sp, t1\n sd %2, 0(t0)\n ld %0, 0(t0)"
                     : "=r"(out) : "r"(target), "r"(value) : "t0", "t1", "memory");
    return out;
}
u64 read_data_slot(u64 unused, u64 unused2) { return data_slot + ro_slot; }
__attribute__((noinline)) u64 keep(u64 x) { return x + 1; }
/* sp changes right before a dynamic jump to a label inside the same function, whose code stores through sp: what
   the translator knows about sp (or any register) before the jump must not be trusted after it. */
u64 jump_then_store(u64 sp_value, u64 value) {
    u64 out, steps = WALK_STEPS(sp_value), start = sp_value + steps * 2048;
    __asm__ volatile(".pushsection .data.jump_label, \"aw\"\n .globl jump_label\n jump_label: .dword 1f\n"
                     ".popsection\n" /* names the label: a legal target */
                     "mv t2, sp\n la t0, 1f\n" SET_SP "jr t0\n"
                     "1: sd %[value], 8(sp)\n ld t3, 8(sp)\n mv sp, t2\n mv %[out], t3"
                     : [out] "=r"(out), [steps] "+r"(steps) : [start] "r"(start), [value] "r"(value)
                     : "t0", "t2", "t3", "memory");
    return keep(out) - 1;
}
"""

#: Sets sp to %[start] minus %[steps] times 2048: ``mv sp`` to a value below the stack is the stack-exhausted trap
#: (docs/SEMANTICS.md), so sp reaches the guard, data or 0 as a hostile guest's would, walking down from a start at
#: or above the stack's lowest address with ``addi sp, sp, -2048``, which is not checked.
WALK = r"""
#define WALK_STEPS(target) ((target) < LOWEST ? (LOWEST - (target) + 2047) / 2048 : 0)
#define SET_SP "mv sp, %[start]\n beqz %[steps], 8f\n 9: addi sp, sp, -2048\n addi %[steps], %[steps], -1\n" \
               " bnez %[steps], 9b\n 8:\n"
"""

SOURCE = f"typedef unsigned long u64;\n#define LOWEST {LOW:#x}ul\n" + WALK + "\n".join(
    f"""u64 {name}(u64 sp_value, u64 value) {{
    u64 out, steps = WALK_STEPS(sp_value), start = sp_value + steps * 2048;
    __asm__ volatile("mv t2, sp\\n" SET_SP "li t3, 0\\n mv a1, %[value]\\n {body}\\n mv sp, t2\\n mv %[out], t3"
                     : [out] "=r"(out), [steps] "+r"(steps) : [start] "r"(start), [value] "r"(value)
                     : "t2", "t3", "a1", "memory");
    return out;
}}""" for name, body in ACCESSES) + STACK_POINTER_SOURCE + f"""
/* Takes every function's address, so the image carries relocations naming them (legal indirect targets). */
u64 pick(u64 i, u64 a, u64 b) {{
    static u64 (*const table[])(u64, u64) = {{{", ".join(name for name, _ in ACCESSES)}, via_stack, read_data_slot, jump_then_store}};
    return table[i](a, b);
}}
"""

#: sp values around both ends of the stack window, in the guard below it, and far outside guest memory.
SP_VALUES = sorted({LOW - 4096, LOW - 2056, LOW - 2048, LOW - 2040, LOW - 8, LOW, LOW + 8, LOW + 2048, LOW + 4096,
                    TOP - 4096, TOP - 2056, TOP - 2048, TOP - 2040, TOP - 512, TOP - 16, TOP - 8, TOP, TOP + 2048,
                    0, 2048, (1 << 64) - 8, (1 << 64) - 2048})


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    elf = guest_elf(SOURCE, keep=("pick", "via_stack", "read_data_slot", "jump_then_store", "jump_label", *(name for name, _ in ACCESSES)))
    symbols = {s.name: s.value for s in read_elf(elf).symbols}
    cache = tmp_path_factory.mktemp("cache")
    return symbols, {kind: Engine(kind=kind, cache_dir=cache).load(elf).backend for kind in ("aot", "interp")}


def outcome(result):
    trap = result.trap
    return (result.a0 if trap is None else None, trap and (trap.kind, trap.pc, trap.addr), result.failure)


@pytest.mark.parametrize("name", [name for name, _ in ACCESSES])
def test_sp_relative_access_at_every_edge_matches_the_interpreter(engines, name):
    symbols, backends = engines
    for sp in SP_VALUES:
        request = RunRequest(entry=symbols[name], int_args=(sp, 0x1122334455667788))
        got, want = (outcome(backends[k].run(request)) for k in ("aot", "interp"))
        assert got == want, f"{name} with sp={sp:#x}: aot {got} vs interp {want}"


def test_some_edges_trap_and_some_do_not(engines):
    """The edge list really straddles the window: the same access is fine at one sp and traps at another."""
    symbols, backends = engines
    results = [backends["aot"].run(RunRequest(entry=symbols["ld0"], int_args=(sp, 0))) for sp in SP_VALUES]
    assert any(r.trap is None for r in results) and any(r.trap is not None for r in results)


#: Where each storing function leaves its value, as (reading function, its sp relative to the storing sp).
READ_BACK = {
    "sd0": [("ld0", 0)],
    "sdalone": [("ld0", 0)],
    "sdwide": [("ldneg", 0), ("ldpos", 0)],
    "sbpos": [("lwtop", 3)],
    "csdsp": [("ld0", 504)],
    "twice": [("ld0", 8), ("ld0", -8)],
    "group": [("ldneg", 0), ("ld0", 2000), ("ld0", 8)],
    "straddle": [("ld0", 0), ("ld0", 16)],
}


@pytest.mark.parametrize("kind", ["aot", "interp"])
@pytest.mark.parametrize("name", sorted(READ_BACK))
def test_stored_through_sp_is_gone_in_the_next_run(engines, kind, name):
    """Store at sp values spread over the stack (across pages), then read each back in later runs: all zero."""
    symbols, backends = engines
    backend = backends[kind]
    spots = [TOP - 16 - 2048, TOP - 16 - 4100, LOW + 2048, LOW + 70000, (LOW + TOP) // 2 + 8]
    for sp in spots:
        stored = backend.run(RunRequest(entry=symbols[name], int_args=(sp, 0xFF)))
        assert stored.trap is None and stored.a0 == 0xFF
    for sp in spots:
        for reader, delta in READ_BACK[name]:
            result = backend.run(RunRequest(entry=symbols[reader], int_args=(sp + delta, 0)))
            assert result.trap is None and result.a0 == 0, f"{name}: stale stack at {sp:#x} read by {reader}"


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_a_lone_store_through_sp_into_data_is_gone_in_the_next_run(engines, kind):
    """sp may point anywhere: a store through it that misses the stack window and lands in .data (BERM_SP_ST's
    second window) must mark its page like any other store, or the next run would see the value."""
    symbols, backends = engines
    backend = backends[kind]
    stored = backend.run(RunRequest(entry=symbols["sdalone"], int_args=(symbols["data_slot"], 0xFF)))
    assert stored.trap is None and stored.a0 == 0xFF
    assert backend.run(RunRequest(entry=symbols["read_data_slot"], int_args=(0, 0))).a0 == 7 + 9


def test_a_register_holding_a_stack_address_may_point_anywhere(engines):
    """``add t0, sp, t1`` makes the translator test the stack window first for t0 (berm_aot/emit/stackptr.py); t0
    may still point into data, read-only data or nowhere: the outcome is the interpreter's, and a store into data
    made that way is gone in the next run."""
    symbols, backends = engines
    targets = [symbols["data_slot"], symbols["ro_slot"], LOW, TOP - 8, TOP, LOW - 8, 0, 8, (1 << 64) - 8]
    for target in targets:
        request = RunRequest(entry=symbols["via_stack"], int_args=(target, 0xAB))
        got, want = (outcome(backends[k].run(request)) for k in ("aot", "interp"))
        assert got == want, f"via_stack to {target:#x}: aot {got} vs interp {want}"
    for kind, backend in backends.items():
        assert backend.run(RunRequest(entry=symbols["via_stack"], int_args=(symbols["ro_slot"], 0xAB))).trap, kind
        assert backend.run(RunRequest(entry=symbols["via_stack"], int_args=(symbols["data_slot"], 0xAB))).a0 == 0xAB
        assert backend.run(RunRequest(entry=symbols["read_data_slot"], int_args=(0, 0))).a0 == 16, kind


def test_sp_changed_before_a_dynamic_jump_inside_the_function(engines):
    symbols, backends = engines
    for sp in [TOP - 64, LOW - 8, LOW - 4096, 0, 1 << 40, (1 << 64) - 8, TOP, LOW]:
        request = RunRequest(entry=symbols["jump_then_store"], int_args=(sp, 0x5A))
        got, want = (outcome(backends[k].run(request)) for k in ("aot", "interp"))
        assert got == want, f"jump_then_store with sp={sp:#x}: aot {got} vs interp {want}"
    assert outcome(backends["aot"].run(RunRequest(entry=symbols["jump_then_store"], int_args=(TOP - 64, 0x5A))))[0] == 0x5A
