"""One guest function as one C function: ``uint64_t <p>f_<addr>(berm_ctx *ctx, uint64_t ret, uint32_t depth)``.

Registers are C locals loaded at entry (those the function touches) and stored back at every exit (those it
writes). Direct branches are gotos; a back-edge polls the interrupt flag (``_jump``). Control leaving the function
returns the next pc to the caller's dispatch loop (``BERM_TAIL`` with ``ctx->next``), a return returns ``ret``, a
trap returns ``BERM_TRAPPED``. See berm_aot/analysis.py for the register protocol at call sites.

A direct call of the function by itself is no C call: the new frame runs in the same C frame, its registers stay in
the same locals, and the expected return address of the frame it interrupts goes to ``ctx->shadow[depth]``; a
return pops it and resumes after that call, a tail transfer out of such a frame runs as its continuation
(``_self_call``, ``_nested_exits``). Recursion then costs no register traffic through ctx->regs.

A counted loop (berm_aot.emit.loops) checks its accesses once at its head for all of its iterations and, when
they all passed, runs a second copy of itself (``LF_<head>``) in which they take no check.

An indirect jump branches directly only to the local targets berm_aot.emit.sites expects it to reach (its jump
table's cases); another local target ends this C frame in the function's resume copy (``resume=True``: the same
code, where every indirect jump may branch to every local target), which finishes the frame exactly. So does a
nested frame's tail transfer that comes back to its caller's link, when loads of the function rely on sp being
where a return left it (berm_aot.emit.frames: an epilogue's restores, unchecked after the prologue's check).

A function too large for one C function is translated in chunks (berm_aot.emit.chunks): the emitter then translates
one chunk (``chunks``, ``part``), entered at any of its entries, and leaves it for another chunk by a tail transfer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from berm_abi.names import core_number
from berm_aot.analysis import Analysis, FunctionInfo, writes
from berm_aot.isa import BRANCHES, Instruction, checks_sp
from berm_aot.disasm import disassemble

from .chunks import Chunks
from .consts import Constants, block_entry_constants
from .dataflow import components, control_edges
from .frames import frame_facts, same_at_each_depth, unchecked_loads
from .groups import SP, access_groups
from .loops import CountedLoop, counted_loops
from .sites import dynamic_jumps, jump_targets
from .stackptr import stack_pointers
from .synced import synced_registers
from .insn import BRANCH_CONDS, CHECKED, comment, compute, dst, lit, name_comment, reg
from .slowrun import RunTable

#: Core calls answered by a field of ctx, with no call at all when the number is known at translation time.
_INLINE_CALLS = {
    core_number("berm.args.len"): "ctx->args_len",
    core_number("berm.heap.start"): "ctx->heap_start",
    core_number("berm.heap.size"): "ctx->heap_size",
}
#: Core calls that use only a0 and a1.
_TWO_ARG_CALLS = frozenset(core_number(n) for n in ("berm.args.read", "berm.result.read", "berm.fail", "berm.log"))


#: Jumps expecting at most this many local targets get a dispatch switch of their own (berm_aot.emit.sites).
_OWN_SWITCH = 16


@dataclass(frozen=True)
class _Dispatch:
    """A dispatch block: where jumps expecting ``targets`` branch to them (``FunctionEmitter._indirect_jump``)."""
    targets: tuple[int, ...]
    label: str
    poll: bool  # it polls the interrupt flag: one of its jumps may close a loop
    cases_first: bool  # its jumps test their cases before ``t == ret`` (the test is then here, after the cases)


def fn_name(prefix: str, addr: int) -> str:
    return f"{prefix}f_{addr:x}"


def resume_name(prefix: str, addr: int) -> str:
    """The function's resume copy (``FunctionEmitter(resume=True)``)."""
    return f"{prefix}f_{addr:x}_r"


class FunctionEmitter:
    """``emit()`` translates one function. ``resume=True`` translates its resume copy instead: the same code, every
    indirect jump able to branch to every local target, entered at one of them (``at``) by a jump the function
    itself does not branch to directly (berm_aot.emit.sites); it finishes the function's C frame (its nested
    self-call frames included) and returns what the function would have. With ``chunks``, ``info`` is chunk
    ``part`` of a function translated in chunks, which translates like a resume copy (every indirect jump able to
    branch to every legal target, every entry knowing nothing) entered at ``ctx->next``, with no calls of itself in
    its C frame."""

    def __init__(self, analysis: Analysis, info: FunctionInfo, prefix: str, *, resume: bool = False,
                 stores_readable: bool = False, chunks: Chunks | None = None, part: int = 0):
        self.a = analysis
        self.f = info
        self.p = prefix
        self.chunks, self.part = chunks, part
        #: the legal targets of the function's indirect jumps (a chunk's local targets are its entries)
        self.legal = info.local_targets if chunks is None else chunks.whole.local_targets
        self.program = analysis.program
        self.starts = analysis.program.function_starts
        self.by_start = analysis.by_start
        self.consts = Constants(analysis.program.image)
        self.known_at = block_entry_constants(analysis.program.image, info.insns, info.start, info.local_targets)
        self.out: list[str] = []
        self.has_indirect = False
        self.resume = resume
        #: the C function starts inside the guest function (a resume copy, a chunk), at any of its local targets:
        #: nothing is known there, and every indirect jump may branch to every one of them
        self.entered_inside = resume or chunks is not None
        #: per indirect jump, the local targets it branches to directly (None: all, and no resume copy)
        self.expect = None if self.entered_inside else jump_targets(info, analysis.jump_tables,
                                                                    analysis.program.image)
        self.stack_at = stack_pointers(info.insns, info.start, info.local_targets, self.expect)
        #: the jumps whose target is decided at run time: the one definition, which the expectations also cover
        self.dynamic = {jump.addr for jump in dynamic_jumps(info)}
        #: ("jump", its address) for small sets, else ("set", id(expected set)) → its dispatch block
        self.dispatch: dict[tuple[str, int], _Dispatch] = {}
        self._first_by_set: dict[int, bool] = {}  # _cases_first, by the set's identity
        self.links = analysis.links
        insns = info.insns
        #: instructions emitted after one that does not fall through to them, and fall-through addresses that
        #: are not emitted next: both need a label
        self.labels = set(info.labels)
        for k, insn in enumerate(insns):
            if k + 1 == len(insns) or insns[k + 1].addr != insn.next_pc:
                self.labels.add(insn.next_pc)
                if k + 1 < len(insns):
                    self.labels.add(insns[k + 1].addr)
        self.follows = {insn.addr: k + 1 < len(insns) and insns[k + 1].addr == insn.next_pc
                        for k, insn in enumerate(insns)}
        #: the links of the function's direct calls to itself, whose frames run in this C frame (see _self_call)
        starts_here = bool(insns) and insns[0].addr == info.start and chunks is None
        #: (a set first: two call sites decoded from overlapping bytes may share a link, and a link is a `case`)
        self.self_calls = sorted({insn.next_pc for insn in insns
                                  if starts_here and self._call_target(insn) == info.start})
        if self.self_calls:
            self.labels.add(info.start)
        self.spins = self._cycles_without_self_calls() if self.self_calls else None
        #: where a return goes: the expected link of the current frame (a C expression), and the code that returns
        #: to it. With one self-call site every nested frame expects its link, so depth alone says which: no
        #: variable to keep (fib: 9% fewer instructions than keeping exp_)
        if not self.self_calls:
            self.ret, self.returns = "ret", "exit_ret"
        elif len(self.self_calls) == 1:
            self.ret, self.returns = f"(depth == depth0_ ? ret : {lit(self.self_calls[0])})", "do_ret"
        else:
            self.ret, self.returns = "exp_", "do_ret"
        self._synced: dict[int, frozenset[int]] | None = None  # see _unsynced
        self.loops = counted_loops(insns, self.labels, self.follows, self.stack_at)
        self.loop_branches = {loop.branch: loop for loop in self.loops.values()}
        self.labels.update(loop.after for loop in self.loops.values())
        self._fast: CountedLoop | None = None  # the counted loop whose second copy is being emitted
        self.in_loops = {addr: g for loop in self.loops.values() for g in loop.groups for addr in g.members}
        self.groups, self.grouped = access_groups(insns, self.labels, self.follows, self.stack_at, self.in_loops)
        #: where a group's segment ends: the label its slow path continues at follows that instruction
        self.run_ends = {g.segment[-1].addr for g in self.groups.values()}
        if chunks is not None:
            self.name = chunks.name(prefix, part)
        else:
            self.name = resume_name(prefix, info.start) if resume else fn_name(prefix, info.start)
        self.runs = RunTable(self.name, (g.segment for g in self.groups.values()))
        #: loads through sp whose bytes an earlier access of the frame checked (berm_aot.emit.frames; none in the
        #: resume copy, entered inside a frame), and the groups made of them only, which take no check
        self.unchecked, self.skipped = set(), set()
        #: groups through sp whose check passes once per depth of this C frame (none in the resume copy either), and
        #: the variable of each: the first depth not yet passed (berm_aot.emit.frames, BERM_GROUP_LEVEL)
        self.levels: dict[int, str] = {}
        #: a nested frame's tail transfer that comes back to its caller's link ends this C frame in the resume copy
        #: (``_nested_exits``): its sp is not one a return left, which the unchecked loads and the checks once per
        #: depth rely on
        self.tail_resumes = False
        if not self.entered_inside:
            calls = {i.addr for i in insns if starts_here and self._call_target(i) == info.start}
            facts, kept = frame_facts(insns, info.start, info.local_targets, calls, stores_readable)
            self.unchecked = unchecked_loads(insns, facts) - self.in_loops.keys()  # those take their loop's check
            members: dict[int, list[int]] = {}
            for addr, g in self.grouped.items():
                members.setdefault(id(g), []).append(addr)
            self.skipped = {addr for addr, g in self.groups.items()
                            if g.stores is None and self.unchecked.issuperset(members[id(g)])}
            heads = [addr for addr, g in self.groups.items()
                     if g.base == SP and g.windows[0] == "STACK" and addr not in self.skipped]
            once = same_at_each_depth(facts, calls, heads)  # none without calls of itself
            self.levels = {addr: f"lv{k}_" for k, addr in enumerate(sorted(once))}
            self.tail_resumes = kept and bool(self.unchecked or self.levels)
        self.needs_resume = self.expect is not None or self.tail_resumes
        self.callees: set[int] = set()  # the functions the emitted code calls by name (the unit declares them)

    # ---------------------------------------------------------------- helpers

    def _call_target(self, insn: Instruction) -> int | None:
        """The callee of a direct call (``jal`` with a link register, or an ``auipc``/``jalr`` pair whose target
        is a legal call), else None."""
        if insn.op == "jal" and insn.rd:
            return (insn.addr + insn.imm) & (2**64 - 1)
        if insn.op == "jalr" and insn.rd:
            target = self.f.static_targets.get(insn.addr)
            if target is not None and self.program.check_indirect(insn.addr, target, True) == "call":
                return target
        return None

    def _cycles_without_self_calls(self) -> dict[int, int]:
        """Each instruction on a cycle that passes none of the function's calls to itself, mapped to its cycles'
        strongly connected component. Only a back-edge inside one of them polls: every other cycle passes a
        self-call, whose check sees an interrupt (``BERM_SELF_CALL``: depth_limit drops to 0), or a return into a
        nested frame's caller, which only as many self-calls as came before it can feed. fib's loop calls fib
        once per iteration: without its poll, fib ran 2-10% faster (four processes, tools/kernels).

        An indirect jump counts as an edge to every local target: a jump table's dispatch branches to the cases it
        expects without a poll (a ``switch`` loop whose back-edge lost its poll once spun past every deadline)."""
        jumps = [insn.addr for insn in self.f.insns if insn.op == "jalr" and insn.rd == 0]
        graph = control_edges(self.f.insns, jumps, self.f.local_targets)
        for insn in self.f.insns:
            if self._call_target(insn) == self.f.start:
                graph[insn.addr] = []
        return {node: k for k, component in enumerate(components(graph)) for node in component}

    def _store(self, regs) -> str:
        return " ".join(f"ctx->regs[{r}] = x{r};" for r in sorted(regs))

    def _load(self, regs) -> str:
        return " ".join(f"x{r} = ctx->regs[{r}];" for r in sorted(regs))

    def _unsynced(self, insn: Instruction) -> frozenset[int]:
        """The registers this function wrote whose locals may differ from ctx->regs before ``insn``: what a call
        or a slow path stores (berm_aot.emit.synced; found at the first, since a function may have neither)."""
        if self._synced is None:
            entered = not self.entered_inside
            self._synced = {} if self.self_calls else synced_registers(self.f, self.expect, entered=entered)
        return self.f.written - self._synced.get(insn.addr, frozenset())

    def _leave_to(self, target: int) -> str:
        """Continue at ``target``, a direct transfer: a goto inside the function (the chunk), a tail transfer to
        another function start or to another chunk's entry, else the illegal-instruction trap there (no code)."""
        if self.f.contains(target) and target in self.program.code:
            return f"goto L_{target:x};"
        if target in self.starts:
            return f"{{ ctx->next = {lit(target)}; goto exit_tail; }}"
        if self.chunks is not None and target in self.chunks.home:
            return f"{{ ctx->next = {lit(target)}; goto exit_tail; }} /* in chunk {self.chunks.home[target]} */"
        return f"BERM_TRAP(BERM_TRAP_ILLEGAL, {lit(target)}, {lit(target)}, 0);"

    def _jump(self, insn: Instruction, target: int) -> str:
        """A direct jump or taken branch from ``insn`` to ``target``; a back-edge polls first."""
        loop = self.loop_branches.get(insn.addr)
        if loop is None:
            go = self._leave_to(target)
        else:
            go = f"goto {loop.fast_label if self._fast is loop else loop.body_label};"
        if target <= insn.addr and go.startswith("goto") and (
                self.spins is None or self.spins.get(insn.addr, -1) == self.spins.get(target)):
            return f"{{ BERM_POLL({lit(insn.addr)}); {go} }}"
        return go

    # ---------------------------------------------------------------- the function

    def emit(self) -> list[str]:
        f = self.f
        touched = sorted(f.touched)
        out = self.out
        out += self.runs.definition()
        if self.resume:
            out.append(f"/* {name_comment(f.func.name)} [{f.start:#x}, {f.end:#x}), resumed at a local target `at` */")
            out.append(f"static uint64_t {resume_name(self.p, f.start)}(berm_ctx *ctx, uint64_t ret, uint32_t depth, "
                       "uint64_t at, uint64_t exp, uint32_t depth0) {")
        elif self.chunks is not None:
            whole = self.chunks.whole
            out.append(f"/* {name_comment(f.func.name)} [{whole.start:#x}, {whole.end:#x}), its chunk {self.part} of "
                       f"{len(self.chunks.parts)}: [{f.start:#x}, {f.end:#x}), entered at ctx->next */")
            out.append(f"BERM_HIDDEN uint64_t {self.name}(berm_ctx *ctx, uint64_t ret, uint32_t depth) {{")
        else:
            out.append(f"/* {name_comment(f.func.name)} [{f.start:#x}, {f.end:#x}) */")
            out.append(f"BERM_HIDDEN uint64_t {fn_name(self.p, f.start)}(berm_ctx *ctx, uint64_t ret, uint32_t depth) {{")
        out.append("    BERM_LOCALS;")
        out.append("    uint64_t zz = 0, jt_ = 0, jpc_ = 0, fa_ = 0; uint32_t fd_ = 0; "
                   "(void)zz; (void)jt_; (void)jpc_; (void)fa_; (void)fd_;")
        if touched:
            out.append("    uint64_t " + ", ".join(f"x{r} = ctx->regs[{r}]" for r in touched) + ";")
        slots = 1 + max((g.slot for g in self.groups.values()), default=-1)
        if slots:
            flags = ", ".join(f"g{k}_ = 0" for k in range(slots))
            out.append(f"    int {flags}; /* per group of accesses through one register: the window holding it (0: none) */")
        loop_flags = [g.flag for loop in self.loops.values() for g in loop.groups]
        if loop_flags:
            out.append(f"    int {' = 0, '.join(loop_flags)} = 0; /* per counted loop's group: the same, for all its iterations */")
        depth0 = f"const uint32_t depth0_ = {'depth0' if self.resume else 'depth'};"
        if len(self.self_calls) == 1:
            out.append("    /* frames of this function's calls to itself run in this C frame: depth is the current frame's")
            out.append(f"       depth (depth0_ this C frame's own), each nested frame returns to {lit(self.self_calls[0])} */")
            out.append(f"    {depth0}")
        elif self.self_calls:
            out.append("    /* frames of this function's calls to itself run in this C frame: exp_ is the current frame's")
            out.append("       expected return address, depth its depth (depth0_ this C frame's own) */")
            out.append(f"    uint64_t exp_ = {'exp' if self.resume else 'ret'}; {depth0}")
        if self.levels:
            out.append("    /* per group through sp checked once per depth (BERM_GROUP_LEVEL): the first depth not yet passed */")
            out.append(f"    uint32_t {' = depth, '.join(self.levels.values())} = depth;")
        if self.resume:
            if not self.self_calls:
                out.append("    (void)exp; (void)depth0;")
            elif len(self.self_calls) == 1:
                out.append("    (void)exp;")
            out.append("    BERM_ENTRY(at);")
            out.append("    switch (at) {")
            # a self-call's link: where a nested frame's tail transfer came back to (``_nested_exits``); it may lie
            # outside the function (a call of itself as its last instruction), so it is left for as after the call
            out += [f"    case {lit(t)}: {self._leave_to(t)}" for t in sorted({*f.local_targets, *self.self_calls})]
            out += ["    default: break;", "    }",
                    "    BERM_TRAP(BERM_TRAP_ILLEGAL, at, at, 0); /* never: only those are resumed at */"]
        elif self.chunks is not None:
            out.append("    const uint64_t at_ = ctx->next;")
            out.append("    BERM_ENTRY(at_);")
            out.append("    switch (at_) {")
            out += [f"    case {lit(t)}: goto L_{t:x};" for t in f.local_targets]
            # the only other address a chunk is entered at: the function's start, when it holds no instruction
            out += ["    default: break;", "    }", "    BERM_TRAP(BERM_TRAP_ILLEGAL, at_, at_, 0);"]
        else:
            out.append(f"    BERM_ENTRY({lit(f.start)});")
        if (not f.insns or f.insns[0].addr != f.start) and self.chunks is None:
            out.append(f"    BERM_TRAP(BERM_TRAP_ILLEGAL, {lit(f.start)}, {lit(f.start)}, 0);")
        prev_next = f.start
        for insn in f.insns:
            if insn.addr != prev_next:
                # the previous instruction does not fall through to this one
                out.append("    __builtin_unreachable();")
            if insn.addr in self.labels:
                out.append(f"L_{insn.addr:x}:;")
                self.consts.enter(self.known_at.get(insn.addr, {}))
            if insn.addr in self.loops:
                out += self.loops[insn.addr].header()
            falls = self._emit_insn(insn)
            prev_next = insn.next_pc if falls else None
            if insn.addr in self.loop_branches:
                out.append("    " + self._leave_to(insn.next_pc))  # where the first copy ends
                self._fast_copy(self.loop_branches[insn.addr])
                prev_next = None
            elif falls and not self.follows[insn.addr]:
                out.append("    " + self._leave_to(insn.next_pc))
                prev_next = None
        if prev_next is not None:
            out.append("    " + self._leave_to(prev_next))
        if self.has_indirect:
            out += self._indirect_block()
        wb = self._store(f.written)
        out.append("fault: __attribute__((unused)); berm_set_trap(ctx, BERM_TRAP_MEMORY, jpc_, fa_, fd_); goto trap;")
        if self.self_calls:
            out += self._nested_exits()
        out.append(f"exit_ret: __attribute__((unused)); {wb} return ret;")
        nested = "if (depth != depth0_) goto nested_tail; " if self.self_calls else ""
        out.append(f"exit_tail: __attribute__((unused)); {nested}{wb} return BERM_TAIL;")
        out.append(f"trap: __attribute__((unused)); {wb} {self._trace()} return BERM_TRAPPED;")
        out.append("}")
        return out

    def _trace(self) -> str:
        """The trap block's record of the frames this C frame holds, innermost first (berm_code.h, berm_trace): its
        own, or with self-calls the nested frames down to its own (``_self_call``)."""
        if not self.self_calls:
            return "berm_trace(ctx, ret, 1);"
        if len(self.self_calls) == 1:
            return f"berm_trace(ctx, {lit(self.self_calls[0])}, depth - depth0_); berm_trace(ctx, ret, 1);"
        return "berm_trace(ctx, exp_, 1); berm_trace_shadow(ctx, depth, depth0_);"

    def _fast_copy(self, loop: CountedLoop) -> None:
        """The counted loop's second copy (berm_aot.emit.loops): the same instructions, every member of its groups
        unchecked; it leaves where the first copy does."""
        out = self.out
        out.append(f"{loop.fast_label}:; /* {loop.head:#x}: the loop again, every group's range in its window */")
        self.consts.enter(self.known_at.get(loop.head, {}))
        self._fast = loop
        for insn in loop.insns:
            self._emit_insn(insn)
        self._fast = None
        out.append("    " + self._leave_to(loop.after))

    # ---------------------------------------------------------------- one instruction

    def _emit_insn(self, insn: Instruction) -> bool:
        """``insn`` with its comment and, at the first member of a group, the group's check and slow path (in both
        copies of a counted loop: a group's flag is set afresh in every block, so the second copy must not reuse the
        value another block left in it); True when it may fall through."""
        self.out.append(f"    /* {insn.addr:x}: {comment(disassemble(insn))} */")
        group = self.groups.get(insn.addr)
        if insn.addr in self.skipped or (insn.addr in self.unchecked and insn.addr not in self.grouped):
            self.out.append("    /* no check: an earlier access of this frame found these bytes readable */")
        elif group is not None:
            self.out.append("    " + group.header(self.levels.get(insn.addr)))
            self.out += self.runs.slow_path(group.flag, group.segment, group.offset, self._unsynced(insn), self.p,
                                            self._run_end(group.segment[-1].addr))
        falls = self._insn(insn)
        if insn.addr in self.run_ends:
            self.out.append(f"{self._run_end(insn.addr)}:;")
        self.consts.step(insn)
        return falls

    def _run_end(self, addr: int) -> str:
        """The label after the group run that ends at ``addr`` (one per copy of a counted loop)."""
        return f"{'GF' if self._fast is not None else 'G'}_{addr:x}_end"

    def _insn(self, insn: Instruction) -> bool:
        """Emit ``insn``; True when it may fall through to ``insn.next_pc``."""
        out, op, pc = self.out, insn.op, lit(insn.addr)
        if insn.addr in self.grouped:
            flag = CHECKED  # its group's check passed, or the run went through the runner instead
        elif insn.addr in self.in_loops:
            # a member of the loop's groups: unchecked in the copy that runs only when all of them passed
            flag = CHECKED if self._fast is not None else self.in_loops[insn.addr].flag
        elif insn.addr in self.unchecked:
            flag = CHECKED  # the frame's earlier access proved its bytes readable (berm_aot.emit.frames)
        else:
            flag = None
        stmt = compute(insn, insn.rs1 in self.stack_at.get(insn.addr, ()), flag)
        if stmt is not None:
            out.append(f"    BERM_SP_WRITE({pc}, {stmt});" if checks_sp(insn) else "    " + stmt)
            return True
        if op in ("jal", "jalr") and checks_sp(insn):  # a link written to sp: below the stack, before the transfer
            out.append(f"    if ({lit(insn.next_pc)} < BERM_STACK_LO) "
                       f"BERM_TRAP(BERM_TRAP_STACK, {pc}, {lit(insn.next_pc)}, BERM_STACK_POINTER);")
        if op in BRANCHES:
            cond = BRANCH_CONDS[op].format(a=reg(insn.rs1), b=reg(insn.rs2))
            out.append(f"    if ({cond}) {self._jump(insn, (insn.addr + insn.imm) & (2**64 - 1))}")
            return True
        if op == "jal":
            target = (insn.addr + insn.imm) & (2**64 - 1)
            if insn.rd == 0:
                out.append("    " + self._jump(insn, target))
                return False
            self._direct_call(insn, target)
            return False
        if op == "jalr":
            if insn.rd != 0:
                self._indirect_call(insn)
            elif insn.addr in self.dynamic:
                self._indirect_jump(insn)
            else:
                self._static_jump(insn, self.f.static_targets[insn.addr])
            return False
        if op == "ecall":
            self._ecall(insn)
            return True
        if op == "ebreak":
            out.append(f"    BERM_TRAP(BERM_TRAP_BREAKPOINT, {pc}, 0, 0);")
            return False
        out.append(f"    BERM_TRAP(BERM_TRAP_ILLEGAL, {pc}, 0, 0);")  # illegal / unsupported encodings
        return False

    def _after_call(self, insn: Instruction, reload: set[int]) -> None:
        """The tail of every call site: finish the callee's tail-call chain, reload what it may have written
        (everything after a dynamic transfer), then trap or continue at the link address."""
        mine = self.f.touched
        out = self.out
        out.append(f"        t_ = {self.p}finish(ctx, t_, {lit(insn.next_pc)}, depth + 1);")
        if reload & mine:
            out.append("        " + self._load(reload & mine))
        if mine - reload:
            out.append(f"        if (BERM_UNLIKELY(ctx->wild != w_)) {{ {self._load(mine - reload)} }}")
        out.append("        if (BERM_UNLIKELY(t_ == BERM_TRAPPED)) goto trap;")
        out.append("    }")
        out.append("    " + self._leave_to(insn.next_pc))

    def _call_prologue(self, insn: Instruction) -> None:
        """Push a frame (or trap), write the link register, store what this function wrote since its registers
        were last in ctx->regs (berm_aot.emit.synced) so the callee sees every register's true value."""
        out = self.out
        out.append(f"        BERM_PUSH({lit(insn.addr)});")
        out.append(f"        {dst(insn.rd)} = {lit(insn.next_pc)};")
        stores = self._store(self._unsynced(insn) | writes(insn))
        if stores:
            out.append("        " + stores)
        out.append("        uint64_t w_ = ctx->wild;")

    def _direct_call(self, insn: Instruction, target: int) -> None:
        out = self.out
        out.append("    {")
        if target not in self.starts or target not in self.by_start:
            # a call to no code: the frame is pushed (on the trap's call chain) and the link written, then execution
            # traps there
            out.append(f"        BERM_PUSH({lit(insn.addr)});")
            out.append(f"        {dst(insn.rd)} = {lit(insn.next_pc)};")
            out.append(f"        berm_trace(ctx, {lit(insn.next_pc)}, 1);")
            out.append(f"        BERM_TRAP(BERM_TRAP_ILLEGAL, {lit(target)}, {lit(target)}, 0);")
            out.append("    }")
            return
        if self.self_calls and target == self.f.start:
            self._self_call(insn)
            return
        self._call_prologue(insn)
        self.callees.add(target)
        out.append(f"        uint64_t t_ = {fn_name(self.p, target)}(ctx, {lit(insn.next_pc)}, depth + 1); "
                   f"/* {name_comment(self.by_start[target].func.name)} */")
        self._after_call(insn, set(self.by_start[target].writes_closure))

    def _self_call(self, insn: Instruction) -> None:
        """A direct call of this function by itself: the new frame runs in this C frame (no C call, no register
        traffic through ctx->regs), and the return (``do_ret``) resumes after the call. The expected return
        address of the interrupted frame is kept at ctx->shadow[depth] — unless this is the function's only
        self-call site: then every nested frame expects its link, and depth alone tells the frames apart."""
        out, start = self.out, lit(self.f.start)
        out.append("        /* a call of this function by itself: the new frame runs in this C frame */")
        link = lit(insn.next_pc)
        enter = "depth++" if len(self.self_calls) == 1 else f"(ctx->shadow[depth] = exp_, exp_ = {link}, depth++)"
        out.append(f"        BERM_SELF_CALL({lit(insn.addr)}, {start}, {dst(insn.rd)} = {link}, {enter});")
        out.append(f"        goto L_{self.f.start:x};")
        out.append("    }")

    def _nested_exits(self) -> list[str]:
        """How a frame started by ``_self_call`` ends: a return resumes after the call that started it; a tail
        transfer out of it (``exit_tail`` with ctx->next) runs here, as that frame's continuation."""
        f = self.f
        lines = ["do_ret: __attribute__((unused)); /* the current frame returns to its expected link (in jt_) */",
                 "    if (depth == depth0_) goto exit_ret;",
                 "    depth--;"]
        links = self.self_calls
        if len(links) == 1:  # every nested frame expects this link: no shadow, no compare (fib: 7% fewer instructions)
            lines.append(f"    {self._leave_to(links[0])}")
        else:
            lines.append("    exp_ = ctx->shadow[depth];")
            lines.append("    switch (jt_) {")
            lines += [f"    case {lit(link)}: {self._leave_to(link)}" for link in links]
            lines += ["    default: break;", "    }",
                      "    BERM_TRAP(BERM_TRAP_ILLEGAL, jt_, jt_, 0); /* never: exp_ is always one of those links */"]
        lines += ["nested_tail: __attribute__((unused)); /* ctx->next runs as the continuation of a nested frame */",
                  "    {"]
        if f.written:
            lines.append("        " + self._store(f.written))
        lines.append(f"        uint64_t link_ = {self.ret};")
        lines.append(f"        uint64_t t_ = {self.p}finish(ctx, {self.p}dispatch(ctx, ctx->next, link_, depth), link_, depth);")
        if f.touched:
            lines.append("        " + self._load(f.touched))
        # the continuation recorded the frame it replaced: the trap block records the ones below it
        below = "depth--;" if len(links) == 1 else "depth--; exp_ = ctx->shadow[depth];"
        lines += [f"        if (BERM_UNLIKELY(t_ == BERM_TRAPPED)) {{ {below} goto trap; }}",
                  "    }",
                  f"    jt_ = {self.ret};"]
        if not self.tail_resumes:
            return lines + ["    goto do_ret;"]
        # the chain may have come back with any sp: the caller's frame goes on in the resume copy, where every
        # load and group is checked (berm_aot.emit.frames); its registers are in ctx->regs already
        return lines + ["    /* the caller's frame goes on in the resume copy: sp is not one a return of this",
                        "       function left, which its unchecked loads and checks once per depth rely on */",
                        f"    {below}",
                        f"    return {resume_name(self.p, f.start)}(ctx, ret, depth, jt_, {self.ret}, depth0_);"]

    def _target_expr(self, insn: Instruction) -> str:
        return f"({reg(insn.rs1)} + {lit(insn.imm)}) & ~1ull"

    def _indirect_call(self, insn: Instruction) -> None:
        out = self.out
        target = self.f.static_targets.get(insn.addr)
        if target is not None:  # an unrelaxed call: checked now, called directly
            if self.program.check_indirect(insn.addr, target, True) == "call":
                self._direct_call(insn, target)
            else:
                out.append(f"    BERM_TRAP(BERM_TRAP_BAD_TARGET, {lit(insn.addr)}, {lit(target)}, 0);")
            return
        out.append("    {")
        out.append(f"        uint64_t t_ = {self._target_expr(insn)};")
        out.append(f"        berm_fn fn_ = {self.p}entry_fn(t_);")
        out.append(f"        if (BERM_UNLIKELY(!fn_)) BERM_TRAP(BERM_TRAP_BAD_TARGET, {lit(insn.addr)}, t_, 0);")
        self._call_prologue(insn)
        out.append("        ctx->wild++;")
        out.append(f"        t_ = fn_(ctx, {lit(insn.next_pc)}, depth + 1);")
        self._after_call(insn, set())

    def _static_jump(self, insn: Instruction, target: int) -> None:
        """A ``jalr x0`` whose target is known at translation time (an unrelaxed ``tail``): checked now."""
        kind = self.program.check_indirect(insn.addr, target, False)
        go = {"local": f"{{ BERM_POLL({lit(insn.addr)}); {self._leave_to(target)} }}",
              "tail": f"{{ ctx->next = {lit(target)}; goto exit_tail; }}"}.get(
            kind, f"BERM_TRAP(BERM_TRAP_BAD_TARGET, {lit(insn.addr)}, {lit(target)}, 0);")
        self.out.append(f"    if (BERM_UNLIKELY({lit(target)} == {self.ret})) {{ jt_ = {lit(target)}; goto {self.returns}; }}")
        self.out.append(f"    {go}")

    def _indirect_jump(self, insn: Instruction) -> None:
        """One of ``sites.dynamic_jumps``: ``t == ret`` returns; anything else goes to a dispatch block: without
        expectations (berm_aot.emit.sites) the function's one block (a switch at every ``ret`` makes gcc's range
        propagation quadratic); with them, a block of its own for a jump expecting a few targets, else one shared by
        every jump expecting the same set (many jumps through one big table would multiply the C)."""
        self.has_indirect = True
        label, cases_first = ("indirect", False) if self.expect is None else self._dispatch_block(insn)
        if cases_first:
            self.out.append(f"    jt_ = {self._target_expr(insn)}; jpc_ = {lit(insn.addr)}; goto {label};")
            return
        ret = f"{{ jt_ = t_; goto {self.returns}; }}" if self.self_calls else f"goto {self.returns};"
        # every link is even (an instruction's address, or the host's 0), so an even sum equal to it needs no mask
        self.out.append(f"    {{ uint64_t t_ = {reg(insn.rs1)} + {lit(insn.imm)}; if (BERM_LIKELY(t_ == {self.ret})) {ret} "
                        f"t_ &= ~1ull; if (t_ == {self.ret}) {ret} jt_ = t_; jpc_ = {lit(insn.addr)}; goto {label}; }}")

    def _dispatch_block(self, insn: Instruction) -> tuple[str, bool]:
        """The label of the dispatch block for ``insn``'s expected targets (every jump sites.dynamic_jumps names has
        its set, one object per distinct set), and whether it tests them before ``t == ret``. A small switch of its
        own per jump predicts better (tokenize: 1.35x native against 1.64x with one block per table); a big one is
        shared, so the C stays linear in the image."""
        targets = self.expect[insn.addr]
        if len(targets) <= _OWN_SWITCH:
            key, poll = ("jump", insn.addr), any(t <= insn.addr for t in targets)
        else:
            key, poll = ("set", id(targets)), True
        if key not in self.dispatch:
            self.dispatch[key] = _Dispatch(targets, f"dispatch{len(self.dispatch)}", poll, self._cases_first(targets))
        return self.dispatch[key].label, self.dispatch[key].cases_first

    def _cases_first(self, targets: tuple[int, ...]) -> bool:
        """Whether jumps expecting ``targets`` test them before ``t == ret``: for a table's cases (not a return's
        empty set, not every local target), when no case is a call's link, so none can be what ret holds and the
        order changes no outcome (tokenize's per-character switch: no compare with ret before its case)."""
        if id(targets) not in self._first_by_set:
            self._first_by_set[id(targets)] = (0 < len(targets) < len(self.f.local_targets)
                                               and self.links.isdisjoint(targets))
        return self._first_by_set[id(targets)]

    def _indirect_block(self) -> list[str]:
        """Where an indirect jump goes: a local target (a goto), a function entry (a tail transfer), else a trap.
        With expectations (berm_aot.emit.sites), each jump first tries the local targets it expects; another
        local target leaves this C frame for the resume copy."""
        if self.chunks is not None:  # its own targets here; the function's other legal targets through its loop
            own = [t for t in self.legal if self.f.contains(t) and t in self.program.code]
            return ["indirect:", "    BERM_POLL(jpc_);", *self._local_switch(own, self._leave_to),
                    f"    if ({self.chunks.legal_name(self.p)}(jt_)) {{ ctx->next = jt_; goto exit_tail; }}"
                    " /* another chunk's: the function's loop enters it, or traps there as at a branch */",
                    *self._not_local()]
        if self.expect is None:
            return ["indirect:", "    BERM_POLL(jpc_);", *self._local_switch(self.legal, self._leave_to),
                    *self._not_local()]
        lines = []
        for block in self.dispatch.values():
            lines.append(f"{block.label}:")
            if block.poll:  # a jump whose cases all lie ahead of it closes no loop
                lines.append("    BERM_POLL(jpc_);")
            lines += self._local_switch(block.targets, self._leave_to)
            if block.cases_first:
                lines.append(f"    if (jt_ == {self.ret}) goto {self.returns};")
            lines.append("    goto indirect;")
        exp, depth0 = (self.ret, "depth0_") if self.self_calls else ("ret", "depth")
        lines += ["indirect: /* not a local target this jump expects */",
                  *self._local_switch(self.f.local_targets, lambda t: "goto resume;"), *self._not_local(),
                  f"resume: /* the rest of this C frame runs in the resume copy, from jt_ */ {self._store(self.f.written)}",
                  f"    return {resume_name(self.p, self.f.start)}(ctx, ret, depth, jt_, {exp}, {depth0});"]
        return lines

    @staticmethod
    def _local_switch(targets, go: Callable[[int], str]) -> list[str]:
        if not targets:
            return []
        return ["    switch (jt_) {", *(f"    case {lit(t)}: {go(t)}" for t in targets),
                "    default: break;", "    }"]

    def _not_local(self) -> list[str]:
        return [f"    if ({self.p}entry_fn(jt_)) {{ ctx->next = jt_; ctx->wild++; goto exit_tail; }}",
                "    BERM_TRAP(BERM_TRAP_BAD_TARGET, jpc_, jt_, 0);"]

    def _ecall(self, insn: Instruction) -> None:
        number = self.consts.get(17)
        pc = lit(insn.addr)
        if number in _INLINE_CALLS:
            self.out.append(f"    x10 = {_INLINE_CALLS[number]};")
            return
        call = "{{ uint64_t r_ = ctx->{entry}(ctx, {pc}, {args}); if (BERM_UNLIKELY(ctx->trap_kind)) goto trap; x10 = r_; }}"
        if number in _TWO_ARG_CALLS:
            self.out.append("    " + call.format(entry="ecall2", pc=pc, args=f"{lit(number)}, x10, x11"))
            return
        # the number is only known at run time: the calls answered by a field still need no call
        for n, field in _INLINE_CALLS.items():
            self.out.append(f"    if (x17 == {lit(n)}) x10 = {field}; else")
        self.out.append("    " + call.format(entry="ecall", pc=pc, args="x17, x10, x11, x12, x13, x14, x15"))
