"""The checked runner: the slow path of every group of accesses (berm_aot.emit.groups).

A group's members take no check of their own: its first member checks the whole range once. When that check fails
(the range is in neither window: some member faults, or the members lie in two windows), the translated code hands
the rest of the group's run — every instruction from its first member to the end of its segment (the union of the
overlapping groups of its block: berm_aot.emit.groups), members or not — to ``<prefix>slow_run``, one C function per
image that executes a table of those instructions (``berm_uop``, made here at translation time: no decoding at run
time) on ``ctx->regs``, each access through the translated code's own
single-access macros (``BERM_LD``, ``BERM_ST``, ``BERM_ATOMIC_ADDR``: the same checks, marks and faults), and then
continues after the run, or traps where the runner stopped, with the registers of that instruction. Its arithmetic
is the emitter's own (``berm_aot.emit.insn``: the same C expressions over ``ctx->regs``), so the two paths cannot
disagree; tests/test_aot_slowrun.py compiles translations whose every group fails and holds them to the
interpreter.

Why not a checked slow path per member, in line: on the 98 KB compile guest (tools/bench_bigguest.py) those paths
were a fifth of gcc's time, each one an edge into the function's fault block carrying every register (gcc also
threaded them into a second copy of the run), while a run's one call costs a spill and a reload of the registers it
reads and writes. With runs gcc executes 12-13% fewer instructions per unit of that guest; the kernels' fast paths
are the same accesses, and fewer instructions overall (BENCHMARKS.md, session 13).
"""

from __future__ import annotations

from collections.abc import Iterable

from berm_aot.analysis import is_atomic, reads, writes
from berm_aot.disasm import disassemble
from berm_aot.isa import Instruction, checks_sp

from .insn import _AMO, _BIN, _IMM, LOAD_TYPES, STORE_TYPES, atomic, comment, lit

#: Every operation a run may hold: what follows a group's first member in a block (no branch, jump, call, ecall,
#: ebreak or undecodable instruction ends up in one: berm_aot.emit.groups). ``auipc`` becomes a ``lui`` of its
#: result.
RUN_OPS: tuple[str, ...] = (*_BIN, *_IMM, "lui", *LOAD_TYPES, *STORE_TYPES, "fence", "fence.i",
                            *(f"{base}.{w}" for w in "wd" for base in ("lr", "sc", *_AMO)))


def op_name(op: str) -> str:
    """The C enumerator of ``op`` (``BERM_OP_AMOADD_W``)."""
    return "BERM_OP_" + op.upper().replace(".", "_")


def declarations(prefix: str) -> list[str]:
    """The operations, the table's row type and the runner's prototype: in every unit."""
    return [
        "/* The checked runner's instructions (berm_aot/emit/slowrun.py): one row per guest instruction. */",
        f"enum {{ {', '.join(op_name(op) for op in RUN_OPS)} }};",
        "typedef struct { uint64_t pc, imm; uint8_t op, rd, rs1, rs2, check_sp; } berm_uop;",
        f"BERM_HIDDEN __attribute__((cold)) uint32_t {prefix}slow_run(berm_ctx *ctx, const berm_uop *u, uint32_t count);",
    ]


def row(insn: Instruction) -> str:
    """``insn`` as a row of a run's table."""
    op, imm = insn.op, insn.imm
    if op == "auipc":
        op, imm = "lui", insn.addr + insn.imm
    if op not in RUN_OPS:
        raise ValueError(f"{insn.addr:#x}: {op} cannot be in a group's run")
    return (f"{{{lit(insn.addr)}, {lit(imm)}, {op_name(op)}, {insn.rd}, {insn.rs1}, {insn.rs2}, "
            f"{int(checks_sp(insn))}}}, /* {comment(disassemble(insn))} */")


class RunTable:
    """A C function's runs, in one table before it (``static const berm_uop <name>_runs[]``): each segment's
    instructions once, every group of the segment entering at its own first member. Everything here is linear in
    the function: a segment's rows and its register sets are made once, not once per group (a block of overlapping
    groups chains one segment over its whole length; a table per group made the C quadratic in it, and register sets
    per group made the translation so: a review's crafted 9,606-instruction function took 76 s to emit)."""

    def __init__(self, function: str, segments: Iterable[tuple[Instruction, ...]]):
        self.name = f"{function}_runs"
        by_end = {segment[-1].addr: segment for segment in segments}
        self.rows: list[Instruction] = []
        self._first_row: dict[int, int] = {}  # by the segment's last address
        self._regs: dict[int, tuple[list[int], list[int]]] = {}  # (stored, reloaded) by the segment's last address
        for end in sorted(by_end):
            segment = by_end[end]
            self._first_row[end] = len(self.rows)
            self.rows += segment
            written = sorted(set().union(*map(writes, segment)))
            self._regs[end] = (sorted(set().union(*map(reads, segment)) | set(written)), written)

    def definition(self) -> list[str]:
        if not self.rows:
            return []
        return ["/* the runs of the function below (berm_aot/emit/slowrun.py): its groups' slow paths */",
                f"static const berm_uop {self.name}[] = {{",
                *(f"    {row(insn)}" for insn in self.rows),
                "};"]

    def slow_path(self, flag: str, segment: tuple[Instruction, ...], offset: int, written: Iterable[int],
                  prefix: str, end: str) -> list[str]:
        """The C after a group's check: when ``flag`` is 0, ``segment[offset:]`` (the group's first member to the
        end of its segment) goes through the runner, then the code continues at ``end``, or traps. The registers the
        segment reads or writes are stored first (those in ``written``: the function may have changed them since they
        were last in ctx->regs, berm_aot.emit.synced) — the written ones too, since a trap may stop the run before it
        writes them — and the written ones reloaded after it. (The whole segment's registers, not just the run's: no
        more than the run's is needed, and no harm done, since what is stored is each register's current value.)"""
        last = segment[-1].addr
        read, load = self._regs[last]
        store = sorted(set(read) & set(written))
        lines = [f"    if (BERM_UNLIKELY(!{flag})) {{ /* in no window: {segment[offset].addr:x}..{last:x}, "
                 "checked access by access */"]
        if store:
            lines.append("        " + " ".join(f"ctx->regs[{r}] = x{r};" for r in store))
        lines.append(f"        uint32_t t_ = {prefix}slow_run(ctx, {self.name} + {self._first_row[last] + offset}, "
                     f"{len(segment) - offset});")
        if load:
            lines.append("        " + " ".join(f"x{r} = ctx->regs[{r}];" for r in load))
        lines += ["        if (BERM_UNLIKELY(t_)) goto trap;", f"        goto {end};", "    }"]
        return lines


def runner(prefix: str) -> list[str]:
    """The runner, once per image (unit 0). Its accesses are the translated code's own single accesses (``BERM_LD``,
    ``BERM_ST``, ``BERM_ATOMIC_ADDR``: the same checks, marks and faults), its arithmetic the emitter's."""
    cases = []
    for op, expr in _BIN.items():
        cases.append(f"        case {op_name(op)}: v = {expr.format(a='a', b='b')}; break;")
    for op, expr in _IMM.items():
        cases.append(f"        case {op_name(op)}: v = {expr.format(a='a', i='i', s='(i & 63)')}; break;")
    cases.append(f"        case {op_name('lui')}: v = i; break;")
    for op, t in LOAD_TYPES.items():
        cases.append(f"        case {op_name(op)}: BERM_LD(v, {t}, a + i, u->pc); break;")
    for op, t in STORE_TYPES.items():
        cases.append(f"        case {op_name(op)}: BERM_ST({t}, a + i, b, u->pc); continue;")
    cases.append(f"        case {op_name('fence')}: case {op_name('fence.i')}: continue;")
    for op in filter(is_atomic, RUN_OPS):
        cases.append(f"        case {op_name(op)}: {atomic(op, 'a', 'b', 'v', 'u->pc')} break;")
    return [
        "/* The checked runner (berm_aot/emit/slowrun.py): the `count` instructions at u on ctx->regs, every access checked",
        "   on its own; 0 when all ran, else the trap of the one that could not (registers as it found them). */",
        f"BERM_HIDDEN __attribute__((cold, noinline)) uint32_t {prefix}slow_run(berm_ctx *ctx, const berm_uop *u, uint32_t count) {{",
        "    BERM_LOCALS;",
        "    uint64_t *const R = ctx->regs;",
        "    uint64_t fa_ = 0, jpc_ = 0; uint32_t fd_ = 0; /* a fault (BERM_FAULT) */",
        "    for (; count; count--, u++) {",
        "        const uint64_t a = u->rs1 ? R[u->rs1] : 0, b = u->rs2 ? R[u->rs2] : 0, i = u->imm;",
        "        uint64_t v = 0;",
        "        switch (u->op) {",
        *cases,
        "        default: berm_set_trap(ctx, BERM_TRAP_ILLEGAL, u->pc, 0, 0); return 1; /* never: rows are made by slowrun.py */",
        "        }",
        "        if (u->check_sp && v < BERM_STACK_LO) {",
        "            berm_set_trap(ctx, BERM_TRAP_STACK, u->pc, v, BERM_STACK_POINTER);",
        "            return 1;",
        "        }",
        "        if (u->rd) R[u->rd] = v;",
        "    }",
        "    return 0;",
        "fault:",
        "    berm_set_trap(ctx, BERM_TRAP_MEMORY, jpc_, fa_, fd_);",
        "    return 1;",
        "}",
        "",
    ]
