"""What the C emitter needs to know about a program beyond its instructions: per function, the instructions in
order, the block labels, the registers it touches and writes, and interprocedural write summaries.

The register protocol of the translated code (see berm_host/aot/berm_rt.h and berm_aot/emit) keeps one
invariant: whenever a guest function starts or exits, ``ctx->regs`` holds the true value of every register. A
function therefore loads only the registers it touches itself, stores the ones it writes itself before each call
and at each exit, and after a call reloads the ones the callee may have written — ``writes_closure``, the fixpoint
over direct calls and direct tail transfers. Dynamic transfers (indirect calls and jumps to function entries) are
not in the summaries: they bump ``ctx->wild`` and every caller up the stack reloads all of its registers.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from berm_aot.isa import BRANCHES, Instruction
from berm_aot.program import Function, Program

LOADS = frozenset({"lb", "lh", "lw", "ld", "lbu", "lhu", "lwu"})
STORES = frozenset({"sb", "sh", "sw", "sd"})
_R_TYPE = frozenset("""add sub sll slt sltu xor srl sra or and addw subw sllw srlw sraw
    mul mulh mulhsu mulhu div divu rem remu mulw divw divuw remw remuw""".split())
_I_TYPE = frozenset("addi slti sltiu xori ori andi slli srli srai addiw slliw srliw sraiw".split()) | LOADS
#: Registers an ``ecall`` served through the generic path reads: the number and a0..a5.
ECALL_READS = frozenset({10, 11, 12, 13, 14, 15, 17})


def is_atomic(op: str) -> bool:
    return op.startswith(("lr.", "sc.", "amo"))


def reads(insn: Instruction) -> frozenset[int]:
    """Registers ``insn`` reads (x0 excluded)."""
    op = insn.op
    if op in _R_TYPE or op in STORES or op in BRANCHES or (is_atomic(op) and not op.startswith("lr.")):
        regs = {insn.rs1, insn.rs2}
    elif op in _I_TYPE or op == "jalr" or op.startswith("lr."):
        regs = {insn.rs1}
    elif op == "ecall":
        regs = set(ECALL_READS)
    else:
        regs = set()
    regs.discard(0)
    return frozenset(regs)


#: What ``writes`` answers, made once: the translator asks for every instruction several times.
_WRITES_NOTHING = STORES | BRANCHES | {"fence", "fence.i", "ebreak", "illegal", "unsupported"}
_WRITES_RD = (frozenset(),) + tuple(frozenset({r}) for r in range(1, 32))
_WRITES_A0 = frozenset({10})


def writes(insn: Instruction) -> frozenset[int]:
    """Registers ``insn`` writes (x0 excluded)."""
    op = insn.op
    if op == "ecall":
        return _WRITES_A0
    if op in _WRITES_NOTHING:
        return _WRITES_RD[0]
    return _WRITES_RD[insn.rd]


@dataclass
class FunctionInfo:
    func: Function
    insns: list[Instruction]
    labels: set[int] = field(default_factory=set)  # addresses jumped to inside the function
    local_targets: list[int] = field(default_factory=list)  # legal indirect targets strictly inside
    touched: frozenset[int] = frozenset()  # registers read or written by its own instructions
    written: frozenset[int] = frozenset()  # registers written by its own instructions
    callees: set[int] = field(default_factory=set)  # direct call and direct tail targets (function starts)
    #: ``jalr`` → its target, for the ``auipc r; jalr r`` pairs of unrelaxed ``call``/``tail`` (the target is
    #: known at translation time, so the CFI check is too)
    static_targets: dict[int, int] = field(default_factory=dict)
    writes_closure: frozenset[int] = frozenset()  # written by it or anything it reaches statically

    @property
    def start(self) -> int:
        return self.func.start

    @property
    def end(self) -> int:
        return self.func.end

    def contains(self, addr: int) -> bool:
        return self.func.start <= addr < self.func.end


@dataclass
class Analysis:
    program: Program
    functions: list[FunctionInfo]
    entries: list[int]  # legal indirect targets that are function starts: reachable by indirect calls
    by_start: dict[int, FunctionInfo]
    #: jump tables (and other tables of code addresses), for telling which one a ``jr`` reads
    #: (berm_aot.emit.sites): start → (entry width, entries)
    jump_tables: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    #: the link address of every call (``jal``/``jalr`` writing a register): with 0, where the host enters, every
    #: value a translated function's ``ret`` (the link its caller expects back) can hold
    links: frozenset[int] = frozenset()


_SLOT_WIDTHS = {"R_RISCV_64": 8, "R_RISCV_32": 4}
#: Relocations by which code takes an address (``lla``/``la``: ``auipc`` + ``addi``, or ``lui`` + ``addi``).
_ADDRESS_TAKEN = frozenset({"R_RISCV_PCREL_HI20", "R_RISCV_HI20"})


def jump_tables(program: Program) -> dict[int, tuple[int, tuple[int, ...]]]:
    """Every address code takes that starts a run of absolute relocation slots (8 or 4 bytes, as LLVM writes jump
    tables), with the code addresses of that run; a run ends at a gap, a slot of the other width, or the next
    address code takes (compilers place one function's tables side by side)."""
    slots = {r.offset: (r.target, _SLOT_WIDTHS[r.type_name]) for r in program.image.relocations
             if r.type_name in _SLOT_WIDTHS}
    taken = {r.target for r in program.image.relocations if r.type_name in _ADDRESS_TAKEN}
    tables = {}
    for start in taken & slots.keys():
        width = slots[start][1]
        entries, addr = [], start
        while (slot := slots.get(addr)) is not None and slot[1] == width and (addr == start or addr not in taken):
            entries.append(slot[0])
            addr += width
        if all(program.in_code(e) for e in entries):
            tables[start] = (width, tuple(entries))
    return tables


def analyse(program: Program) -> Analysis:
    """Group instructions by function, find labels and summaries; pure, deterministic."""
    code = program.code
    starts = program.function_starts
    addrs = sorted(code)
    #: legal indirect targets with code, sorted: each function takes the ones strictly inside it (a bisection, not a
    #: pass over all of them per function, which was a third of the translation time of a 360-function guest)
    targets = sorted(t for t in program.indirect_targets if t in code)
    infos: list[FunctionInfo] = []
    i = 0
    for func in program.functions:
        while i < len(addrs) and addrs[i] < func.start:
            i += 1
        j = i
        while j < len(addrs) and addrs[j] < func.end:
            j += 1
        info = FunctionInfo(func, [code[a] for a in addrs[i:j]])
        info.local_targets = targets[bisect.bisect_right(targets, func.start):bisect.bisect_left(targets, func.end)]
        _scan(info, program, starts)
        infos.append(info)
        i = j
    _close_writes(infos)
    entries = sorted(t for t in program.indirect_targets if t in starts)
    links = frozenset(i.next_pc for i in code.values() if i.op in ("jal", "jalr") and i.rd)
    return Analysis(program, infos, entries, {f.start: f for f in infos}, jump_tables(program), links)


def part_of(whole: FunctionInfo, program: Program, start: int, end: int, insns: list[Instruction],
            entries: list[int]) -> FunctionInfo:
    """The instructions ``insns`` of ``whole`` (those in [start, end)) as a function of their own, entered at each of
    ``entries`` (its local targets: where it starts knowing nothing), for translating ``whole`` in parts
    (berm_aot.emit.chunks). Its write summary is the whole function's, whose callers reload it."""
    info = FunctionInfo(Function(whole.func.name, start, end), insns, local_targets=sorted(entries))
    _scan(info, program, program.function_starts)
    info.writes_closure = whole.writes_closure
    return info


def _scan(info: FunctionInfo, program: Program, starts: frozenset[int]) -> None:
    touched: set[int] = set()
    written: set[int] = set()
    for insn in info.insns:
        touched |= reads(insn)
        w = writes(insn)
        touched |= w
        written |= w
        op = insn.op
        if op in BRANCHES or op == "jal":
            target = (insn.addr + insn.imm) & 0xFFFFFFFFFFFFFFFF
            if op == "jal" and insn.rd:
                if target in starts:
                    info.callees.add(target)
                if info.contains(insn.next_pc):
                    info.labels.add(insn.next_pc)
            elif info.contains(target):
                info.labels.add(target)
            elif target in starts:
                info.callees.add(target)
        elif op == "jalr" and insn.rd and info.contains(insn.next_pc):
            info.labels.add(insn.next_pc)
        # continuing past the function — off its end, out of an instruction that straddles it (another
        # function can start inside one), after a call whose link lies outside — is a tail transfer
        if insn.falls_through and not info.contains(insn.next_pc) and insn.next_pc in starts:
            info.callees.add(insn.next_pc)
    info.labels.update(info.local_targets)
    _static_jalrs(info, program)
    info.touched = frozenset(touched)
    info.written = frozenset(written)


def _static_jalrs(info: FunctionInfo, program: Program) -> None:
    """Find ``auipc r, hi; jalr rd, lo(r)`` pairs (nothing else reaches the ``jalr``: no jump, no other
    instruction falling through to it, as overlapping decodings could) and resolve their targets; a legal call or
    tail call becomes a static callee."""
    falls_into: dict[int, int] = {}
    for insn in info.insns:
        falls_into[insn.next_pc] = falls_into.get(insn.next_pc, 0) + 1
    prev: Instruction | None = None
    for insn in info.insns:
        if (insn.op == "jalr" and prev is not None and prev.op == "auipc" and prev.rd == insn.rs1 != 0
                and prev.next_pc == insn.addr and insn.addr not in info.labels and falls_into[insn.addr] == 1):
            target = (prev.addr + prev.imm + insn.imm) & 0xFFFFFFFFFFFFFFFE
            info.static_targets[insn.addr] = target
            if program.check_indirect(insn.addr, target, insn.rd != 0) in ("call", "tail"):
                info.callees.add(target)
        prev = insn


def _close_writes(infos: list[FunctionInfo]) -> None:
    """writes_closure = own writes ∪ writes_closure of every static callee, to a fixpoint: a worklist over the
    callers, each function's set growing at most 31 times (a pass over every function until nothing changed was
    quadratic on a call chain: 16,000 functions took 141 s)."""
    callers: dict[int, list[FunctionInfo]] = {f.start: [] for f in infos}
    for f in infos:
        f.writes_closure = f.written
        for c in f.callees:
            if c in callers:
                callers[c].append(f)
    work = list(infos)
    queued = {f.start for f in infos}
    while work:
        g = work.pop()
        queued.discard(g.start)
        for f in callers[g.start]:
            if not g.writes_closure <= f.writes_closure:
                f.writes_closure = f.writes_closure | g.writes_closure
                if f.start not in queued:
                    queued.add(f.start)
                    work.append(f)
