"""Emit C for a whole program: several translation units that compile in parallel into one shared object.

Unit 0 holds the lookups (function start → C function; entry of a chunk of a function translated in chunks → C
function; legal indirect entry → C function), the export
``<prefix>berm_enter``, the memory layout the code is specialised to, ``<prefix>berm_layout`` (the uint64_t
fields of ``berm_aot.windows.Windows``), and the program's functions by name, ``<prefix>berm_locator``
(``berm_aot.locator``: a trap is named without the program model); every unit holds some of the guest functions
(``berm_aot.emit.function``) and declares all of them. ``prefix`` namespaces every global symbol, so several
programs can share one object (tests batch many random programs into one compile)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from berm_aot.analysis import Analysis, FunctionInfo, analyse
from berm_aot.program import Program

from .chunks import Chunks, chunk_plan
from .function import FunctionEmitter, fn_name
from .insn import lit, name_comment
from .slowrun import declarations, runner
from berm_aot.windows import C_NAMES, Windows

#: Bumped whenever the emitted code changes meaning or shape: part of the cache key.
TRANSLATOR_VERSION = "2"

#: Guest instructions per translation unit, and the most units of that size (``unit_shares``): the split depends
#: only on the program (so it needs no place in the cache key); how many compile at once is the compiler driver's
#: business.
_UNIT_INSNS = 1500
MAX_UNITS = 8
#: The most guest instructions in one unit, though the program has more than MAX_UNITS units of it: the C compiler
#: holds a whole unit in memory, ~10 KB per guest instruction (gcc -O1 on the 98 KB guest's 30,000 instructions as
#: one unit: 320 MB), so eight units of an image at berm_aot.elf.MAX_CODE_BYTES (about 1.4 million instructions)
#: would each have taken ~2 GB, and ``--jobs`` of them at once.
MAX_UNIT_INSNS = 16_384


def prototype(name: str) -> str:
    """The declaration of a translated function (or chunk) called ``name``."""
    return f"BERM_HIDDEN uint64_t {name}(berm_ctx *ctx, uint64_t ret, uint32_t depth);"


def _header(prefix: str, windows: Windows, functions: Iterable[int]) -> list[str]:
    """What a unit starts with: the layout, the runtime's macros, and the prototypes of ``functions`` (by start) and
    of the shared helpers. A unit declares only the functions it defines or calls (unit
    0: all, for its lookups): every unit declaring every function made each unit as large as the program has
    functions (75 MB each for a million)."""
    p = prefix
    lines = ["/* The guest memory layout this code is translated for (berm_code.h). */", *windows.defines(),
             '#include "berm_code.h"', ""]
    lines += [prototype(fn_name(p, start)) for start in sorted(functions)]
    lines += [
        f"BERM_HIDDEN berm_fn {p}entry_fn(uint64_t t);",
        f"BERM_HIDDEN uint64_t {p}dispatch(berm_ctx *ctx, uint64_t t, uint64_t link, uint32_t depth);",
        *declarations(p),
        "",
        "/* Run the tail-call chain a callee started until it returns to `link` or traps; every function of the chain",
        "   runs with the callee's `depth` (frames on the shadow call stack, its own included). */",
        f"static inline uint64_t {p}finish(berm_ctx *ctx, uint64_t t, uint64_t link, uint32_t depth) {{",
        "    while (BERM_UNLIKELY(t != link)) {",
        "        if (t == BERM_TRAPPED) return t;",
        f"        t = {p}dispatch(ctx, ctx->next, link, depth);",
        "    }",
        "    return t;",
        "}",
        "",
    ]
    return lines


def _lookups(analysis: Analysis, prefix: str) -> list[str]:
    p = prefix
    lines = ["/* The layout the code is specialised to: the core refuses to run it on other memory. */",
             f"BERM_EXPORT const uint64_t {p}berm_layout[{len(C_NAMES)}] = {{{', '.join(C_NAMES)}}};", ""]
    lines += ["/* The executable sections and functions, for naming where a trap happened (berm_aot.locator). */",
              f"BERM_EXPORT const char {p}berm_locator[] =",
              *(f'    "{_c_text(line)}\\n"' for line in analysis.program.locator.dumps()), "    ;", ""]
    lines += [f"static berm_fn {p}start_fn(uint64_t t) {{", "    switch (t) {"]
    lines += [f"    case {lit(f.start)}: return {fn_name(p, f.start)};" for f in analysis.functions]
    lines += ["    default: return 0;", "    }", "}", ""]
    lines += ["/* Legal indirect targets that are function starts (ABI §6). */",
              f"BERM_HIDDEN berm_fn {p}entry_fn(uint64_t t) {{", "    switch (t) {"]
    lines += [f"    case {lit(t)}: return {fn_name(p, t)};" for t in analysis.entries]
    lines += ["    default: return 0;", "    }", "}", ""]
    lines += [f"BERM_HIDDEN uint64_t {p}dispatch(berm_ctx *ctx, uint64_t t, uint64_t link, uint32_t depth) {{",
              f"    berm_fn f = {p}start_fn(t);",
        "    if (BERM_UNLIKELY(!f)) {",
        "        berm_set_trap(ctx, BERM_TRAP_ILLEGAL, t, t, 0);",
        "        return BERM_TRAPPED;",
        "    }",
        "    return f(ctx, link, depth);",
        "}",
        "",
        *runner(p),
        f"BERM_EXPORT uint64_t {p}berm_enter(berm_ctx *ctx, uint64_t entry) {{",
        f"    uint64_t t = {p}finish(ctx, {p}dispatch(ctx, entry, 0, 1), 0, 1);",
        "    return t == BERM_TRAPPED ? BERM_TRAPPED : 0;",
        "}",
        "",
    ]
    return lines


def unit_shares(total: int) -> list[float]:
    """How many of a program's ``total`` guest instructions each translation unit takes, in emission order (a unit
    closes once it holds its share): up to ``MAX_UNITS`` equal shares of about ``_UNIT_INSNS``, the last one split
    in two halves. The compilers take the units in order, so the last ones decide when the build ends: with equal
    units, one core sat idle while the other compiled the last unit (0.9 s of the 98 KB guest's 10.3 s build, in a
    timeline of its compiles); with the halves, their ends come closer. Cold compiles of that guest, equal units
    and these shares in alternation (two series of six, 2026-12-02): medians 10.4 and 11.1 s against 9.5 and
    10.3 s, faster in all twelve pairs, by 0.1 to 1.3 s. A program of more than MAX_UNITS × MAX_UNIT_INSNS has
    more units, none over MAX_UNIT_INSNS."""
    n = max(1, min(MAX_UNITS, -(-total // _UNIT_INSNS)), -(-total // MAX_UNIT_INSNS))
    if n == 1:
        return [float(total)]
    share = total / n
    return [share] * (n - 1) + [share / 2, share / 2]


def _c_text(ascii_line: str) -> str:
    """``ascii_line`` inside a C string literal; ``?`` as ``\\?``, so that no trigraph forms whatever the compiler's
    dialect (with ``-trigraphs`` in BERM_CFLAGS a function named ``??/`` ended the literal: found by a review)."""
    return ascii_line.replace("\\", "\\\\").replace('"', '\\"').replace("?", "\\?")


def emit_units(program: Program, *, windows: Windows, prefix: str = "") -> Iterator[str]:
    """The C translation units of ``program`` for memory with ``windows`` (split by ``unit_shares``), each yielded
    as soon as it is complete, so the C compiler can start on it (berm_aot.cc.compile_shared) while the rest are
    translated."""
    analysis = analyse(program)
    plans = {info.start: plan for info in analysis.functions if (plan := chunk_plan(info, program)) is not None}
    shares = unit_shares(sum(len(f.insns) for f in analysis.functions))
    stores_readable = windows.loads_cover_stores()
    body: list[str] = []
    named: set[int] = set()  # the functions the unit defines or calls
    k, filled = 0, 0
    for info in analysis.functions:
        for group in _pieces(analysis, info, prefix, stores_readable, plans.get(info.start)):
            if filled >= shares[k] and k + 1 < len(shares):
                yield _unit(analysis, prefix, windows, named, body, k)
                body, named, k, filled = [], set(), k + 1, 0
            for piece in group:
                body += piece.lines
                body.append("")
                named |= piece.callees
                filled += piece.insns
            named.add(info.start)
    # units past this one would hold no function: none is emitted
    yield _unit(analysis, prefix, windows, named, body, k)


@dataclass(frozen=True)
class _Piece:
    """Emitted C, with what its unit must know of it: the functions it calls by name, and its size for the C
    compiler (guest instructions)."""
    lines: list[str]
    callees: set[int]
    insns: int


def _pieces(analysis: Analysis, info: FunctionInfo, prefix: str, stores_readable: bool,
            plan: Chunks | None) -> Iterator[list[_Piece]]:
    """The C of one function, in order, as groups that stay in one unit: the function, after its resume copy when it
    needs one (defined before the function that leaves for it; as much for the C compiler as the function); or,
    translated in chunks, each chunk, chunk 0 with the function's own C function, which enters it."""
    if plan is None:
        emitter = FunctionEmitter(analysis, info, prefix, stores_readable=stores_readable)
        code = emitter.emit()  # first: it finds whether the function leaves for a resume copy
        group = []
        if emitter.needs_resume:
            resume = FunctionEmitter(analysis, info, prefix, resume=True)
            lines = resume.emit()
            group.append(_Piece(lines, resume.callees, len(info.insns)))
        yield [*group, _Piece(code, emitter.callees, len(info.insns))]
        return
    for k, part in enumerate(plan.parts):
        chunk = FunctionEmitter(analysis, part, prefix, stores_readable=stores_readable, chunks=plan, part=k)
        lines = chunk.emit()
        group = [_Piece([plan.legal_prototype(prefix), *lines], chunk.callees, len(part.insns))]
        yield (group + [_Piece(_enter_chunks(plan, prefix), set(), 0)]) if k == 0 else group


def _enter_chunks(plan: Chunks, prefix: str) -> list[str]:
    """The C function of a function translated in chunks: it enters chunk 0 at the function's start, then each
    chunk a chunk leaves for (its tail transfer to an address of the function), until one returns, traps, or leaves
    for another function, which the caller's dispatch loop runs. So a transfer between chunks costs a return, a
    choice among the chunks by address, and the chunk's choice among its entries."""
    f = plan.whole
    lines = [f"/* {name_comment(f.func.name)} [{f.start:#x}, {f.end:#x}): {len(f.insns)} instructions, translated as "
             f"{len(plan.parts)} chunks (berm_aot/emit/chunks.py), run one after another by this loop */"]
    lines += [prototype(plan.name(prefix, k)) for k in range(1, len(plan.parts))]
    lines += [f"BERM_HIDDEN uint64_t {fn_name(prefix, f.start)}(berm_ctx *ctx, uint64_t ret, uint32_t depth) {{",
              f"    ctx->next = {lit(f.start)};",
              "    for (;;) {",
              "        uint64_t t;",
              "        switch (ctx->next) {"]
    lines += [f"        case {lit(part.start)} ... {lit(part.end - 1)}: "
              f"t = {plan.name(prefix, k)}(ctx, ret, depth); break;" for k, part in enumerate(plan.parts)]
    lines += ["        default: return BERM_TAIL; /* another function's start: the caller's dispatch loop goes on */",
              "        }",
              "        if (t != BERM_TAIL) return t;",
              "    }",
              "}",
              f"/* whether t is a legal target of the indirect jumps of {name_comment(f.func.name)} "
              "(Chunks.legal_name) */",
              f"BERM_HIDDEN int {plan.legal_name(prefix)}(uint64_t t) {{",
              "    switch (t) {",
              *(f"    case {lit(t)}:" for t in f.local_targets),
              "        return 1;",
              "    default:",
              "        return 0;",
              "    }",
              "}"]
    return lines


def _unit(analysis: Analysis, prefix: str, windows: Windows, named: set[int], body: list[str], k: int) -> str:
    if k == 0:
        header = _header(prefix, windows, (f.start for f in analysis.functions))
        extra = _lookups(analysis, prefix)
    else:
        header, extra = _header(prefix, windows, named), []
    return "\n".join(header + body + extra) + "\n"


def emit_program(program: Program, *, windows: Windows, prefix: str = "") -> list[str]:
    """All of ``emit_units`` at once."""
    return list(emit_units(program, windows=windows, prefix=prefix))


#: The unit every shared object gets once: the runtime ABI it was built against (checked before it runs).
ABI_UNIT = '#include "berm_rt.h"\nBERM_EXPORT const int berm_rt_abi = BERM_RT_ABI;\n'
