"""Random but valid RV64IMAC programs for differential tests, built directly as ``ElfImage`` objects.

Two layers:

- ``build_image(functions, rodata=…, data=…, table=…, jump_tables=…)`` lays assembled functions (lists of
  ``rvenc.Op`` and ``rvenc.Label``) into a text segment at ``TEXT``, a read-only segment at ``RODATA`` (``table`` =
  function names whose addresses fill its first words, each an ``R_RISCV_64`` relocation, like a vtable; then the
  ``jump_tables`` of case labels, the same way) and a writable segment at ``DATA``, with FUNC symbols and
  PCREL_HI20 relocations for every ``la``. Tests use it for hand-written programs.
- ``programs()``: a hypothesis strategy of ``GenProgram`` — random straight-line ALU (every op, M and w-forms),
  loads/stores into the data, read-only and stack regions, aligned AMOs/lr/sc, forward branches, bounded loops,
  compressed forms, direct and table-driven indirect calls, ``switch`` loops through jump tables (with an index run
  into the next table and a return forged to a case: what the translator runs in a resume copy), and (optionally)
  one access at an edge of the memory layout that may fault; with ``self_calls``, calls of a function by itself,
  bounded by the stack's depth. The entry function ends with ``ret`` to 0. The shapes of ``_Reach`` come on top:
  groups of accesses and counted loops through an ordinary register against the edges of the memory layout
  (``window_group``, ``window_walk``), sp moved inside a function (``stack_excursion``), tail calls and calls that
  link through t0 (``tail_call``, ``t0_call``), host calls the translator serves inline (``host_query``), and
  corner cases of single instructions (division edges, hints, loads into their own base, atomics off the happy
  path); with ``berm_only=False`` none of what only Berm defines, for a comparison with an emulator.

Register conventions of generated code: ``ra``, ``sp`` behave as the ABI says (``stack_excursion`` moves sp
and puts it back); ``gp`` points at ``DATA + 2048`` and ``tp`` at ``RODATA`` (set by the entry function and never
written again); function ``fi`` counts its loops in ``x(31-i)`` (so a call inside a loop leaves the caller's counter
alone; top-level shapes use it as scratch too); every other register (x5..x27) is random data, seeded by ``li`` at
entry (``t0``, x5, also links calls of the t0 leaf). Functions keep ``ra`` in their frame
(``0(sp)``, frame ``FRAME`` bytes); random stack accesses use offsets ``8 … FRAME-8`` of the current frame.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace

from hypothesis import strategies as st

from berm_abi.names import core_number
from berm_aot.image import ElfImage, Relocation, Section, Segment, Symbol
from tests import rvenc
from tests.rvenc import Label, Op, la, li

TEXT = 0x10000
RODATA = 0x30000
DATA = 0x31000
DATA_SIZE = 4096
RODATA_SIZE = 1024
FRAME = 256
GP_BIAS = 2048  # gp = DATA + 2048, so 12-bit offsets reach the whole data page
MEMORY_SIZE = 1 << 20  # the generated programs' guest memory size (small: cheap for every engine)

RA, SP, GP, TP, T0, A0, A7 = 1, 2, 3, 4, 5, 10, 17
MAX_FUNCTIONS = 4
COUNTERS = tuple(31 - i for i in range(MAX_FUNCTIONS))  # loop counter of each function
FREE = tuple(range(5, 32 - MAX_FUNCTIONS))  # random destinations/sources
CREGS = tuple(r for r in FREE if 8 <= r <= 15)  # usable in the 3-bit register fields of compressed forms

R_RISCV_64 = 2
R_RISCV_PCREL_HI20 = 23


# --- images -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Function:
    name: str
    items: list


def build_image(functions: list[Function], *, rodata: bytes = b"", data: bytes = b"", table: tuple[str, ...] = (),
                jump_tables: tuple[tuple[str, tuple[str, ...]], ...] = (), entry: str | None = None) -> ElfImage:
    """An ``ElfImage`` holding ``functions`` (laid out in order from ``TEXT``), ``rodata`` at ``RODATA`` after the
    function-pointer ``table`` and the ``jump_tables``, and ``data`` at ``DATA`` (both segments are at least one
    byte). ``jump_tables`` are ``(name, case labels)`` laid side by side, 8 bytes a case, as a compiler lays out one
    function's ``switch`` tables; ``la`` may name them, which gives the PCREL_HI20 relocation that marks a table."""
    slots = [*table, *(case for _, cases in jump_tables for case in cases)]
    starts, at = {}, RODATA + 8 * len(table)
    for name, cases in jump_tables:
        starts[name], at = at, at + 8 * len(cases)
    items: list = []
    for f in functions:
        items += [Label(f.name), *f.items]
    asm = rvenc.assemble(items, TEXT, extern=starts)
    ends = [asm.labels[f.name] for f in functions[1:]] + [TEXT + len(asm.code)]
    ro = bytearray(b"".join(asm.labels[name].to_bytes(8, "little") for name in slots) + rodata) or bytearray(8)
    rw = bytes(data) or bytes(8)
    segments = (
        Segment(TEXT, len(asm.code), asm.code, readable=True, writable=False, executable=True),
        Segment(RODATA, len(ro), bytes(ro), readable=True, writable=False, executable=False),
        Segment(DATA, len(rw), rw, readable=True, writable=True, executable=False),
    )
    sections = (
        Section(".text", TEXT, len(asm.code), alloc=True, executable=True, writable=False),
        Section(".rodata", RODATA, len(ro), alloc=True, executable=False, writable=False),
        Section(".data", DATA, len(rw), alloc=True, executable=False, writable=True),
    )
    symbols = tuple(Symbol(f.name, asm.labels[f.name], end - asm.labels[f.name], "func", "global", ".text")
                    for f, end in zip(functions, ends))
    symbols += (Symbol("rodata", RODATA, len(ro), "object", "local", ".rodata"),
                Symbol("data", DATA, len(rw), "object", "local", ".data"))
    relocs = tuple(Relocation(RODATA + 8 * i, R_RISCV_64, "R_RISCV_64", name, asm.labels[name], 0, ".rodata")
                   for i, name in enumerate(slots))
    relocs += tuple(Relocation(site, R_RISCV_PCREL_HI20, "R_RISCV_PCREL_HI20", name, asm.labels[name], 0, ".text")
                    for site, name in asm.pcrel_sites)
    # Engines may key caches by the file bytes: make ``raw`` a faithful serialisation of everything above.
    raw = repr((segments, sections, symbols, relocs)).encode()
    return ElfImage(sha256=hashlib.sha256(raw).hexdigest(), size=len(raw),
                    entry=asm.labels[entry or functions[0].name], flags=0x1, segments=segments, sections=sections,
                    symbols=symbols, relocations=relocs, manifest_bytes=None, raw=raw)


class GenProgram:
    """A generated program: its image, entry address and a listing (also its repr, for failing examples)."""

    def __init__(self, image: ElfImage, entry: int, listing: str, features: frozenset[str] = frozenset()):
        self.image = image
        self.entry = entry
        self.listing = listing
        #: what the generator put in (``switch``, ``overrun``, ``forged return``): tests check their batches have it
        self.features = features

    def __repr__(self) -> str:
        return f"GenProgram(\n{self.listing}\n)"

    #: guest memory compared after a run: all of it that a store may change, from the data page to the end (the top
    #: of the stack alone missed a store to the wrong place near the heap's end or the stack's base: a review)
    @property
    def snapshot(self) -> tuple[tuple[int, int], ...]:
        stack = stack_lo()  # the guard page between the heap and the stack is never written (nor mapped by
        return ((DATA, guard_lo() - DATA), (stack, MEMORY_SIZE - stack))  # tests/test_unicorn_diff.py)


# --- random instructions ----------------------------------------------------------------------------------------

_W_SHIFTS = ("slliw", "srliw", "sraiw")
_INTERESTING = st.sampled_from([0, 1, 2, 31, 32, 63, 64, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32,
                                (1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 64) - 2, 0x8000_0000_0000_0001])
VALUES = st.one_of(_INTERESTING, st.integers(0, (1 << 64) - 1), st.integers(0, 4096))
_dst = st.sampled_from((0, *FREE))
_src = st.sampled_from((0, *FREE))
_cdst = st.sampled_from(CREGS)


@st.composite
def alu_op(draw) -> list[Op]:
    """One ALU instruction, register or immediate form, 32-bit or compressed."""
    kind = draw(st.sampled_from(["rr", "ri", "shift", "upper", "compressed"]))
    rd, rs1, rs2 = draw(_dst), draw(_src), draw(_src)
    if kind == "rr":
        return [Op(draw(st.sampled_from(rvenc.ALU_RR_OPS)), rd=rd, rs1=rs1, rs2=rs2)]
    if kind == "ri":
        imm = draw(st.one_of(st.integers(-2048, 2047), st.sampled_from([-2048, -1, 0, 1, 2047])))
        return [Op(draw(st.sampled_from(rvenc.ALU_RI_OPS)), rd=rd, rs1=rs1, imm=imm)]
    if kind == "shift":
        name = draw(st.sampled_from(rvenc.SHIFT_IMM_OPS))
        return [Op(name, rd=rd, rs1=rs1, imm=draw(st.integers(0, 31 if name in _W_SHIFTS else 63)))]
    if kind == "upper":
        return [Op(draw(st.sampled_from(["lui", "auipc"])), rd=rd, imm=draw(st.integers(-(1 << 19), (1 << 19) - 1)) << 12)]
    return draw(compressed_alu_op())


@st.composite
def compressed_alu_op(draw) -> list[Op]:
    name = draw(st.sampled_from(["c.addi", "c.addiw", "c.li", "c.lui", "c.slli", "c.srli", "c.srai", "c.andi",
                                 "c.mv", "c.add", "c.sub", "c.xor", "c.or", "c.and", "c.subw", "c.addw",
                                 "c.addi4spn", "c.nop"]))
    big = st.sampled_from(FREE)
    if name in ("c.addi", "c.addiw", "c.li"):
        return [Op(name, rd=draw(big), imm=draw(st.integers(-32, 31)))]
    if name == "c.lui":
        return [Op(name, rd=draw(big), imm=draw(st.sampled_from([-32, -1, 1, 31]) | st.integers(1, 31)) << 12)]
    if name == "c.slli":
        return [Op(name, rd=draw(big), imm=draw(st.integers(1, 63)))]
    if name in ("c.srli", "c.srai"):
        return [Op(name, rd=draw(_cdst), imm=draw(st.integers(1, 63)))]
    if name == "c.andi":
        return [Op(name, rd=draw(_cdst), imm=draw(st.integers(-32, 31)))]
    if name in ("c.mv", "c.add"):
        return [Op(name, rd=draw(big), rs2=draw(big))]
    if name == "c.addi4spn":
        return [Op(name, rd=draw(_cdst), imm=4 * draw(st.integers(1, 255)))]
    if name == "c.nop":
        return [Op(name)]
    return [Op(name, rd=draw(_cdst), rs2=draw(_cdst))]


_LOAD_SIZE = {"lb": 1, "lbu": 1, "lh": 2, "lhu": 2, "lw": 4, "lwu": 4, "ld": 8}
_STORE_SIZE = {"sb": 1, "sh": 2, "sw": 4, "sd": 8}


@st.composite
def memory_op(draw) -> list[Op]:
    """A load or store inside the data page (gp), a load from the read-only page (tp), or a stack-frame access."""
    where = draw(st.sampled_from(["data", "data", "rodata", "stack", "compressed"]))
    is_load = draw(st.booleans()) or where == "rodata"
    name = draw(st.sampled_from(rvenc.LOAD_OPS if is_load else rvenc.STORE_OPS))
    size = (_LOAD_SIZE if is_load else _STORE_SIZE)[name]
    reg = draw(_dst if is_load else _src)
    if where == "data":
        base, imm = GP, draw(st.integers(-GP_BIAS, GP_BIAS - size))
    elif where == "rodata":
        base, imm = TP, draw(st.integers(0, RODATA_SIZE - size))
    elif where == "stack":
        base, imm = SP, draw(st.integers(8, FRAME - size))
    else:
        return draw(compressed_memory_op())
    return [Op(name, rd=reg, rs1=base, imm=imm) if is_load else Op(name, rs1=base, rs2=reg, imm=imm)]


@st.composite
def compressed_memory_op(draw) -> list[Op]:
    name = draw(st.sampled_from(["c.lw", "c.ld", "c.sw", "c.sd", "c.lwsp", "c.ldsp", "c.swsp", "c.sdsp"]))
    size = 8 if name in ("c.ld", "c.sd", "c.ldsp", "c.sdsp") else 4
    if name.endswith("sp"):
        imm = size * draw(st.integers(8 // size, (FRAME - size) // size))
        if name in ("c.lwsp", "c.ldsp"):
            return [Op(name, rd=draw(st.sampled_from(FREE)), rs1=SP, imm=imm)]
        return [Op(name, rs1=SP, rs2=draw(_src), imm=imm)]
    ptr = draw(_cdst)
    imm = size * draw(st.integers(0, (124 if size == 4 else 248) // size))
    setup = Op("addi", rd=ptr, rs1=GP, imm=draw(st.integers(-GP_BIAS // 8, (GP_BIAS - 256) // 8)) * 8)
    if name in ("c.lw", "c.ld"):
        return [setup, Op(name, rd=draw(_cdst), rs1=ptr, imm=imm)]
    return [setup, Op(name, rs1=ptr, rs2=draw(_cdst), imm=imm)]


@st.composite
def atomic_op(draw, avoid: frozenset[int] = frozenset()) -> list[Op]:
    """An aligned lr/sc/AMO on the data page, through a freshly set pointer register; nothing it writes is in
    ``avoid`` (a register that must live across it)."""
    name = draw(st.sampled_from(rvenc.AMO_OPS))
    size = 4 if name.endswith(".w") else 8
    ptr = draw(st.sampled_from([r for r in FREE if r not in avoid]))
    off = size * draw(st.integers(-GP_BIAS // size, GP_BIAS // size - 1))
    rd = draw(st.sampled_from([r for r in (0, *FREE) if r not in avoid]))
    rs2 = 0 if name.startswith("lr") else draw(_src)
    ops = [Op("addi", rd=ptr, rs1=GP, imm=off)]
    if name.startswith("sc"):  # real harts (and unicorn) need the reservation; Berm's single hart never fails sc
        ops.append(Op(f"lr.{name[-1]}", rd=draw(st.sampled_from([r for r in FREE if r not in {ptr, *avoid}])),
                      rs1=ptr))
    return ops + [Op(name, rd=rd, rs1=ptr, rs2=rs2, aq=draw(st.booleans()), rl=draw(st.booleans()))]


def simple_op() -> st.SearchStrategy[list[Op]]:
    return st.one_of(alu_op(), alu_op(), memory_op(), atomic_op(), st.sampled_from([[Op("fence")], [Op("fence.i")]]))


class _Labels:
    """Fresh label names within one generated program."""

    def __init__(self):
        self.n = 0

    def __call__(self, stem: str) -> str:
        self.n += 1
        return f".{stem}{self.n}"


@st.composite
def forward_branch(draw, labels: _Labels) -> list:
    """A conditional (or unconditional) jump over a few simple instructions."""
    skipped = [op for _ in range(draw(st.integers(0, 4))) for op in draw(simple_op())]
    target = labels("skip")
    kind = draw(st.sampled_from(["branch", "branch", "cbranch", "jump"]))
    if kind == "branch":
        jump = Op(draw(st.sampled_from(rvenc.BRANCH_OPS)), rs1=draw(_src), rs2=draw(_src), target=target)
    elif kind == "cbranch":
        jump = Op(draw(st.sampled_from(["c.beqz", "c.bnez"])), rs1=draw(_cdst), target=target)
    else:
        jump = Op(draw(st.sampled_from(["jal", "c.j"])), target=target)
    return [jump, *skipped, Label(target)]


@st.composite
def call(draw, callees: tuple[int, ...]) -> list[Op]:
    """A direct ``jal ra`` or an indirect call through the read-only function table (ld + jalr/c.jalr)."""
    k = draw(st.sampled_from(callees))
    how = draw(st.sampled_from(["jal", "jalr", "c.jalr", "la"]))
    if how == "jal":
        return [Op("jal", rd=RA, target=f"f{k}")]
    ptr = draw(st.sampled_from(CREGS if how == "c.jalr" else FREE))
    if how == "la":
        return [*la(ptr, f"f{k}"), Op("jalr", rd=RA, rs1=ptr)]
    load = Op("ld", rd=ptr, rs1=TP, imm=8 * (k - 1))
    return [load, Op("c.jalr", rs1=ptr) if how == "c.jalr" else Op("jalr", rd=RA, rs1=ptr)]


#: A function calls itself only from a frame at most this deep (the entry function's is 1: sp one frame below the
#: initial sp), so recursion ends: f0, with two self-call sites, makes at most 2 + 4 + 8 frames of itself below its
#: first.
SELF_CALL_FRAMES = 3
INITIAL_SP = MEMORY_SIZE - 16  # where the host starts sp (berm_host/layout.py, Layout.initial_sp)
#: self-call sites per function at most (each doubles the frames of a recursion)
MAX_SELF_CALLS = 2


@st.composite
def self_call(draw, labels: _Labels, name: str) -> list[Op]:
    """A call of the function ``name`` by itself, skipped in a frame deeper than ``SELF_CALL_FRAMES``: by
    ``jal`` (translated as a new frame in the caller's C frame) or through a register (a call through the dispatch
    table). The nested frame runs the whole body again, loops and its own self-calls included."""
    bound, skip = draw(st.sampled_from(FREE)), labels("deep")
    ops = [*li(bound, INITIAL_SP - SELF_CALL_FRAMES * FRAME), Op("bltu", rs1=SP, rs2=bound, target=skip)]
    if draw(st.integers(0, 2)):
        ops.append(Op("jal", rd=RA, target=name))
    else:
        ptr = draw(st.sampled_from(FREE))
        ops += [*la(ptr, name), Op("jalr", rd=RA, rs1=ptr)]
    return [*ops, Label(skip)]


class _Switches:
    """One generated function's ``switch`` constructs: how often a block is one (``weight``, 0: never), their jump
    tables in program order (laid side by side in rodata, so an index can run from one into the next) and the
    features they used."""

    #: constructs per function, so that every function's tables fit in the read-only page with the random bytes
    MAX = 2

    def __init__(self, weight: int):
        self.weight = weight
        self.count = 0
        self.tables: list[tuple[str, tuple[str, ...]]] = []
        self.features: set[str] = set()

    def choices(self) -> list[str]:
        return ["switch"] * self.weight if self.count < self.MAX else []


@st.composite
def block(draw, labels: _Labels, callees: tuple[int, ...], counter: int, in_loop: bool,
          switches: _Switches | None = None, reach: _Reach | None = None) -> list:
    choices = ["simple"] * 6 + ["branch"] * 2 + (["call"] if callees else []) + ([] if in_loop else ["loop", "stride"])
    choices += switches.choices() if switches else []
    extra = reach.choices(callees, in_loop) if reach else []
    kind = draw(st.sampled_from(choices * 2 + extra if extra else choices))  # the older kinds each twice as likely
    if kind in extra:
        return draw(reach.shape(kind, labels, callees, counter))
    if kind == "simple":
        return draw(simple_op())
    if kind == "branch":
        return draw(forward_branch(labels))
    if kind == "call":
        return draw(call(callees))
    if kind == "switch":
        return draw(switch(labels, counter, switches, in_loop))
    if kind == "stride":
        return draw(strided_loop(labels, counter))
    head = labels("loop")
    body = [x for _ in range(draw(st.integers(1, 5)))
            for x in draw(block(labels, callees, counter, True, switches, reach))]
    return [*li(counter, draw(st.integers(1, 4))), Label(head), *body, Op("addi", rd=counter, rs1=counter, imm=-1),
            Op("bne", rs1=counter, rs2=0, target=head)]


@st.composite
def strided_loop(draw, labels: _Labels, counter: int) -> list:
    """A pointer walking the data, read-only or stack area — or off its edge — in a counted loop (closed by ``bne``
    on the pointer against a bound, or on the function's counter), loading through it (and in the data area maybe
    storing), the step before or after: what the translator checks once for all iterations
    (berm_aot/emit/loops.py)."""
    ptr, bound = draw(st.permutations(FREE))[:2]
    step = draw(st.sampled_from([1, 2, 4, 8, -4, -8, 12, 2040, -2048]))
    n = draw(st.integers(1, 6))
    area = draw(st.sampled_from(["data", "data", "rodata", "stack"]))
    if area == "stack":  # inside the frame, above the saved ra: loads only
        start = [Op("addi", rd=ptr, rs1=SP, imm=draw(st.integers(8, FRAME - 8)))]
    else:  # not below the read-only page: unicorn's mapping of the gap under it is writable (tests/test_unicorn_diff.py)
        lo, size = (DATA, DATA_SIZE) if area == "data" else (RODATA, RODATA_SIZE)
        start = li(ptr, lo + draw(st.integers(-64 if area == "data" else 0, size + 64)))
    dest = st.sampled_from([r for r in (0, *FREE) if r not in (ptr, bound)])
    body = [Op(draw(st.sampled_from(rvenc.LOAD_OPS)), rd=draw(dest), rs1=ptr, imm=draw(st.integers(-16, 16)))]
    if body[0].rd and draw(st.booleans()):
        # chase what it loaded: a group of its own in the loop, after a group through sp before the loop (the two
        # flags share a name, set in their own blocks: a review found the loop's second copy skipping the check)
        got, others = body[0].rd, [r for r in FREE if r not in (ptr, bound, body[0].rd)]
        a, b = draw(st.permutations(others))[:2]
        start = [Op("ld", rd=a, rs1=SP, imm=8), Op("ld", rd=b, rs1=SP, imm=16), *start]
        body += [Op("ld", rd=a, rs1=got, imm=0), Op("lw", rd=b, rs1=got, imm=8)]
    if area == "data" and step >= -8 and draw(st.booleans()):  # stores stay above that gap too
        store = Op(draw(st.sampled_from(rvenc.STORE_OPS)), rs1=ptr, rs2=draw(_src), imm=draw(st.integers(-16, 16)))
        body.insert(draw(st.integers(0, 1)), store)
    body.insert(draw(st.integers(0, len(body))), Op("addi", rd=ptr, rs1=ptr, imm=step))
    head = labels("stride")
    if draw(st.booleans()):  # the pointer ends the loop
        setup = [*start, Op("addi", rd=bound, rs1=ptr, imm=0), *li(counter, n * step),
                 Op("add", rd=bound, rs1=bound, rs2=counter)]
        close = [Op("bne", rs1=ptr, rs2=bound, target=head)]
    else:
        setup = [*start, *li(counter, n)]
        close = [Op("addi", rd=counter, rs1=counter, imm=-1), Op("bne", rs1=counter, rs2=0, target=head)]
    return [*setup, Label(head), *body, *close]


def _work(avoid: frozenset[int]) -> st.SearchStrategy[list[Op]]:
    """A few ALU instructions that leave the registers in ``avoid`` alone."""
    op = alu_op().filter(lambda ops: all(o.rd not in avoid for o in ops)) if avoid else alu_op()
    return st.lists(op, max_size=3).map(lambda ops: [o for x in ops for o in x])


@st.composite
def switch(draw, labels: _Labels, counter: int, switches: _Switches, in_loop: bool) -> list:
    """One or two ``switch`` statements on a loop, compiled as a compiler does (``lla``; ``andi``/``slli``/``add``/
    ``ld``/``jr``; 8-byte tables of case labels in rodata; cases jumping to a join), so that the translator's per-site
    expectations (berm_aot.emit.sites) apply and the function gets a resume copy. Two transfers go where no site
    expects, into the resume copy: the first switch's index mask may run past its table into the second's
    (``overrun``), and the loop may set ``ra`` to a case before a ``ret`` (``forged return``).

    Why it terminates: inside a loop of ``block`` (``in_loop``), control only moves forward to that loop's end. At
    top level the construct is its own loop on the function's counter, the base addresses maybe hoisted out of it
    (the cases then leave them alone); the forged return runs only right after the counter's decrement, when it
    equals ``j >= 1``, and lands before the next decrement, so the counter still falls at every turn."""
    tables = []
    for _ in range(draw(st.integers(1, 2))):
        cases = [labels("case") for _ in range(draw(st.integers(1, 4)))]
        size = 1 << (len(cases) - 1).bit_length()  # a power of two: an index masked with size - 1 stays inside
        extra = draw(st.lists(st.sampled_from(cases), min_size=size - len(cases), max_size=size - len(cases)))
        tables.append((labels("table"), tuple(draw(st.permutations(cases + extra))), cases))
    switches.count += 1
    switches.tables += [(name, entries) for name, entries, _ in tables]
    switches.features.add("switch")
    hoisted = () if in_loop or not draw(st.booleans()) else tuple(draw(st.permutations(FREE))[:len(tables)])
    spare = [r for r in FREE if r not in hoisted]  # for the index, the target and the cases' work
    code = []
    for k, (name, entries, cases) in enumerate(tables):
        mask = len(entries) - 1
        if k + 1 < len(tables) and draw(st.booleans()):
            mask = draw(st.integers(len(entries), len(entries) + len(tables[k + 1][1]) - 1))
            switches.features.add("overrun")
        base = hoisted[k] if hoisted else draw(st.sampled_from(FREE))
        index, target = (draw(st.sampled_from([r for r in spare if r != base])) for _ in range(2))
        code += [] if hoisted else la(base, name)
        a, b = draw(st.permutations((index, base)))
        code += [Op("andi", rd=index, rs1=draw(st.sampled_from((counter, *FREE))), imm=mask),
                 Op("slli", rd=index, rs1=index, imm=3), Op("add", rd=index, rs1=a, rs2=b),
                 Op("ld", rd=target, rs1=index),
                 Op("c.jr", rs1=target) if draw(st.booleans()) else Op("jalr", rs1=target)]
        join = labels("join")
        for c, case in enumerate(cases):
            code += [Label(case), *draw(_work(frozenset(hoisted)))]
            if c + 1 < len(cases) or draw(st.booleans()):
                code.append(Op(draw(st.sampled_from(["jal", "c.j"])), target=join))
        code.append(Label(join))
    if in_loop:
        return code
    head, turns = labels("loop"), draw(st.integers(2, 4))
    code = [*(op for k, base in enumerate(hoisted) for op in la(base, tables[k][0])), *li(counter, turns),
            Label(head), *code, Op("addi", rd=counter, rs1=counter, imm=-1)]
    if draw(st.booleans()):
        bound, skip = draw(st.sampled_from(spare)), labels("skip")
        case = draw(st.sampled_from([c for _, _, cases in tables for c in cases]))
        code += [*li(bound, draw(st.integers(1, turns - 1))), Op("bne", rs1=counter, rs2=bound, target=skip),
                 *la(RA, case), Op("c.jr", rs1=RA) if draw(st.booleans()) else Op("jalr", rs1=RA), Label(skip)]
        switches.features.add("forged return")
    return code + [Op("bne", rs1=counter, rs2=0, target=head)]


# --- shapes against the layout's edges, sp moved, tail and t0 calls, host calls, corner cases --------------------

#: The kinds of block ``_Reach`` adds, each also the feature of a program that drew one.
REACH_KINDS = ("window group", "window walk", "stack pointer", "tail call", "t0 call", "host call", "corner case")


class _Reach:
    """What the blocks of one program may draw beyond the shapes above (``choices``), and the features they drew:
    ``leaf`` names the function that returns through t0 (None: the program has none); ``berm_only`` allows what
    only Berm defines and an emulator would not match (host calls it serves, an ``sc`` that always succeeds, a
    misaligned atomic as a memory fault, the sp-below-stack trap: docs/SEMANTICS.md)."""

    def __init__(self, berm_only: bool, leaf: str | None):
        self.berm_only = berm_only
        self.leaf = leaf
        self.features: set[str] = set()

    def choices(self, callees: tuple[int, ...], in_loop: bool) -> list[str]:
        """The kinds of ``REACH_KINDS`` a block may be here: those that use the function's counter or end the
        function only outside loops."""
        barred = {"t0 call": not self.leaf, "host call": not self.berm_only, "tail call": in_loop or not callees,
                  "window walk": in_loop, "stack pointer": in_loop}
        return [kind for kind in REACH_KINDS if not barred.get(kind)]

    def shape(self, kind: str, labels: _Labels, callees: tuple[int, ...], counter: int) -> st.SearchStrategy:
        """The strategy of a block of ``kind`` (one of ``choices``), noted as a feature of the program."""
        self.features.add(kind)
        if kind == "window group":
            return window_group(self)
        if kind == "window walk":
            return window_walk(labels, counter, self)
        if kind == "stack pointer":
            return stack_excursion(labels, counter, self)
        if kind == "tail call":
            return tail_call(labels, callees)
        if kind == "t0 call":
            return t0_call(self.leaf)
        if kind == "host call":
            return host_query()
        return st.one_of(division_edge(), hint(), own_base_load(), stray_atomic(self.berm_only))


def stack_lo() -> int:
    """The stack's lowest address (the guard page is below it)."""
    return guard_lo() + 4096


def window_edges(stores: bool = False) -> dict[str, tuple[int, str]]:
    """The addresses where what a load may touch changes (berm_host/layout.py), each with the side of it a load is
    valid on: ``"above"``, ``"below"``, ``"both"`` (a segment's end inside a window) or ``"neither"`` (the top of
    the address space, whose addresses wrap to page zero). With ``stores``, the sides a store is valid on, and
    only the edges where that is some side or none is: no store is valid on either side of the text's or the
    read-only page's start (accesses that store there would all fault; ``edge_probe`` and ``stray_atomic`` still
    go there)."""
    edges = {"image": (TEXT, "above"), "read-only": (RODATA, "both"), "writable": (DATA, "both"),
             "end of data": (DATA + DATA_SIZE, "both"), "guard": (guard_lo(), "below"),
             "stack": (stack_lo(), "above"), "end of memory": (MEMORY_SIZE, "below"), "wrap": (1 << 64, "neither")}
    if stores:
        del edges["image"], edges["read-only"]
        edges["writable"] = (DATA, "above")
    return edges


def _edge_names(stores: bool) -> st.SearchStrategy[str]:
    return st.sampled_from(sorted(window_edges(stores)))


def _stores(ops: list[Op]) -> bool:
    return any(op.name in _STORE_SIZE for op in ops)


@st.composite
def beside(draw, edge: str, lo: int, hi: int, stores: bool) -> int:
    """A base address for accesses spanning ``[base + lo, base + hi)``, loads and (``stores``) stores, at the
    layout edge named ``edge`` (``window_edges``): on its valid side, up against it or a few bytes off (three
    times in five), across it (any of the accesses, or of a loop's turns, may be the one that crosses), or on the
    other side."""
    at, valid = window_edges(stores)[edge]
    place = draw(st.sampled_from(["inside", "inside", "inside", "across", "outside"]))
    if place == "across" and hi - lo > 1:
        return (at - lo - draw(st.integers(1, hi - lo - 1))) & rvenc.MASK64
    gap = draw(st.sampled_from([0, 0, 1, 4]) | st.integers(0, 64))
    below = (place == "inside") == (valid != "above")
    return (at - hi - gap if below else at - lo + gap) & rvenc.MASK64


_ACCESS_SIZE = {**_LOAD_SIZE, **_STORE_SIZE}
_LOAD_OF = {"sb": "lbu", "sh": "lhu", "sw": "lwu", "sd": "ld"}
#: Where a store lands on unicorn, which maps the image's whole hull writable and write-protects only its segments'
#: pages, but faults on Berm (no store window below the data): from the text's second page (generated text is
#: mostly shorter than one) to the read-only page.
_UNICORN_ONLY_WRITABLE = range(TEXT + 4096, RODATA)


def _through(ops: list[Op], base: int) -> list[tuple[Op, int]]:
    """Each load or store through ``base`` among ``ops``, with its offset from the value ``base`` has before them
    (an ``addi base, base, step`` among them moves the later ones)."""
    out, moved = [], 0
    for op in ops:
        if op.name == "addi" and op.rd == op.rs1 == base:
            moved += op.imm
        elif op.rs1 == base and op.name in _ACCESS_SIZE:
            out.append((op, moved + op.imm))
    return out


def _span(ops: list[Op], base: int) -> tuple[int, int]:
    """The offsets from ``base``'s value before ``ops`` of the first byte their accesses through it touch and of
    one past the last."""
    accesses = _through(ops, base)
    return min(off for _, off in accesses), max(off + _ACCESS_SIZE[op.name] for op, off in accesses)


def _for_emulator(ops: list[Op], base: int, addr: int, reach: _Reach) -> list[Op]:
    """``ops``, which access through ``base`` = ``addr``; but when an emulator runs them (not ``reach.berm_only``)
    and the first store would land where only unicorn may write, each store made a load of its size into x0. (The
    first is enough: each later store is less than a page from one before it, and the pages on either side of that
    range, the text's first and the read-only one, fault on both.)"""
    stores = [off for op, off in _through(ops, base) if op.name in _STORE_SIZE]
    if reach.berm_only or not stores or (addr + stores[0]) & rvenc.MASK64 not in _UNICORN_ONLY_WRITABLE:
        return ops
    return [Op(_LOAD_OF[op.name], rs1=op.rs1, imm=op.imm) if op.name in _STORE_SIZE else op for op in ops]


@st.composite
def _access(draw, base: int, dest: st.SearchStrategy[int], lo: int, hi: int) -> Op:
    """A load (into a register ``dest`` draws) or a store through ``base``, at an offset from ``lo`` to ``hi``."""
    imm = draw(st.integers(lo, hi))
    if draw(st.booleans()):
        return Op(draw(st.sampled_from(rvenc.LOAD_OPS)), rd=draw(dest), rs1=base, imm=imm)
    return Op(draw(st.sampled_from(rvenc.STORE_OPS)), rs1=base, rs2=draw(_src), imm=imm)


@st.composite
def window_group(draw, reach: _Reach) -> list[Op]:
    """Two to six loads and stores through one ordinary register set against a layout edge (``beside``), with no
    label, transfer or write of the register among them: one group (berm_aot/emit/groups.py), its range checked
    once at its first member, which may cross the edge, so that a member in the middle faults after earlier ones
    stored. Maybe an AMO or lr/sc on the data page between two members (a step of the group's checked run, not a
    member), and maybe the last member loads into the base itself (which ends a group)."""
    base = draw(st.sampled_from(FREE))
    others = [r for r in (0, *FREE) if r != base]
    members = draw(st.lists(_access(base, st.sampled_from(others), -48, 48), min_size=2, max_size=6))
    if draw(st.integers(0, 3)) == 0:
        members[-1] = Op(draw(st.sampled_from(rvenc.LOAD_OPS)), rd=base, rs1=base, imm=members[-1].imm)
    stores = _stores(members)
    addr = draw(beside(draw(_edge_names(stores)), *_span(members, base), stores))
    members = _for_emulator(members, base, addr, reach)
    if draw(st.booleans()):
        at = draw(st.integers(1, len(members) - 1))
        members[at:at] = draw(atomic_op(frozenset({base})))
    return [*li(base, addr), *members]


@st.composite
def window_walk(draw, labels: _Labels, counter: int, reach: _Reach) -> list:
    """A counted loop (berm_aot/emit/loops.py: the range of all its turns checked once, at entry) whose pointer
    steps by 1 to 2047 bytes (or -2048), 1 to 40 times, mostly toward a layout edge, the whole walk placed by
    ``beside``: any turn may reach the edge, so the loop leaves its window in the middle. One to four loads and
    stores through the pointer, before and after its step, maybe one more through gp, tp or sp (a member whose base
    does not step); the loop closed on the pointer or on the function's counter (``_loop_exit``)."""
    ptr, bound = draw(st.permutations(FREE))[:2]
    dest = st.sampled_from([r for r in (0, *FREE) if r not in (ptr, bound)])
    body = draw(st.lists(_access(ptr, dest, -32, 32), min_size=1, max_size=4))
    stores = _stores(body)
    edge = draw(_edge_names(stores))
    toward = {"below": 1, "above": -1}.get(window_edges(stores)[edge][1]) or draw(st.sampled_from([1, -1]))
    size = draw(st.sampled_from([1, 2, 4, 8, 16, 2047]) | st.integers(1, 2048))
    step = max(-2048, min(2047, size * (toward if draw(st.integers(0, 3)) else -toward)))
    turns = draw(st.integers(1, 40))
    body.insert(draw(st.integers(0, len(body))), Op("addi", rd=ptr, rs1=ptr, imm=step))
    lo, hi = _span(body, ptr)
    travel = (turns - 1) * step
    start = draw(beside(edge, lo + min(travel, 0), hi + max(travel, 0), stores))
    body = _for_emulator(body, ptr, start, reach)
    if draw(st.booleans()):
        still = draw(memory_op().filter(lambda ops: len(ops) == 1 and ops[0].rd not in (ptr, bound)))
        body.insert(draw(st.integers(0, len(body))), still[0])
    init = li(ptr, start)
    if draw(st.booleans()):  # the pointer ends the loop
        iv, first, by = ptr, start, step
    else:  # the counter does, counting up from 0 or down to 0
        by = draw(st.sampled_from([1, 2, -1, -3]))
        iv, first = counter, (0 if by > 0 else -by * turns)
        init += li(counter, first)
        body.insert(draw(st.integers(0, len(body))), Op("addi", rd=counter, rs1=counter, imm=by))
    head = labels("walk")
    setup, close = draw(_loop_exit(iv, bound, first, by, turns, head))
    return [*init, *setup, Label(head), *body, close]


@st.composite
def _loop_exit(draw, iv: int, bound: int, first: int, step: int, turns: int, head: str) -> tuple[list[Op], Op]:
    """How a loop whose ``iv`` is ``first`` at entry and moves by ``step`` once a turn ends after ``turns`` turns:
    the ops that set ``bound`` (once ``iv`` is set) and the closing branch to ``head``. Mostly ``bne`` either way
    round (what berm_aot/emit/loops.py counts); when every value compared lies in [0, 2^63), so that neither order
    wraps, maybe ``blt``/``bltu`` while short of the end or ``bge``/``bgeu`` while not past the last turn's value
    (mirrored for a falling ``iv``): loops the translator does not count."""
    end = first + turns * step
    if draw(st.integers(0, 2)) or not all(0 <= v < 1 << 63 for v in (first + step, end)):
        near = -2048 <= turns * step < 2048 and draw(st.booleans())
        a, b = draw(st.permutations((iv, bound)))
        return ([Op("addi", rd=bound, rs1=iv, imm=turns * step)] if near else li(bound, end),
                Op("bne", rs1=a, rs2=b, target=head))
    name = draw(st.sampled_from(["blt", "bltu", "bge", "bgeu"]))
    rising = step > 0
    if name.startswith("blt"):
        limit, (a, b) = end, ((iv, bound) if rising else (bound, iv))
    else:
        limit, (a, b) = (end - 1, (bound, iv)) if rising else (end + 1, (iv, bound))
    return li(bound, limit), Op(name, rs1=a, rs2=b, target=head)


def _sp_step(by: int) -> st.SearchStrategy[Op]:
    """``addi sp, sp, by``, or ``c.addi16sp`` where it reaches."""
    return st.sampled_from([Op("addi", rd=SP, rs1=SP, imm=by)] + ([Op("c.addi16sp", imm=by)] if -512 <= by <= 496
                                                                   else []))


#: The compressed sp-relative form of a load or store, and its largest offset.
_SP_FORMS = {"ld": ("c.ldsp", 504), "lw": ("c.lwsp", 252), "sd": ("c.sdsp", 504), "sw": ("c.swsp", 252)}


@st.composite
def _stack_access(draw, base: int, base_off: int, lowered: int, dest: st.SearchStrategy[int]) -> Op:
    """A load or store at sp + off through ``base`` (sp itself, or a register holding sp + ``base_off``), sp
    ``lowered`` bytes below the function's frame: a store below the frame's saved ra (at sp + ``lowered``, which
    the epilogue returns through) or above it inside the frame, a load anywhere from 64 bytes below sp to the
    frame's top; through sp, in a compressed form when one fits."""
    store = draw(st.booleans())
    name = draw(st.sampled_from(rvenc.STORE_OPS if store else rvenc.LOAD_OPS))
    size = _ACCESS_SIZE[name]
    lo, hi = max(-64, base_off - 2048), min(lowered + FRAME, base_off + 2048) - size
    if store:
        above = [st.integers(lowered + 8, hi)] if lowered + 8 <= hi else []
        off = draw(st.one_of(st.integers(lo, min(lowered - size, hi)), *above))
        op = Op(name, rs1=base, rs2=draw(_src), imm=off - base_off)
    else:
        op = Op(name, rd=draw(dest), rs1=base, imm=draw(st.integers(lo, hi)) - base_off)
    short, top = _SP_FORMS.get(name, ("", -1))
    if base == SP and 0 <= op.imm <= top and op.imm % size == 0 and (store or op.rd) and draw(st.booleans()):
        return replace(op, name=short)
    return op


@st.composite
def _deep_drop(draw, reach: _Reach) -> int:
    """How far a ``sub`` lowers sp (a multiple of 16): with ``reach.berm_only`` to within 128 bytes of the stack's
    lowest address seen from a function 0 to 4 frames deep (f0 is 1 deep: past that address, the sp-below-stack
    trap; just above it, accesses below sp cross into the guard page); else no lower than 16 KiB above that address,
    which no generated call chain comes near."""
    room = INITIAL_SP - stack_lo()
    if reach.berm_only:
        return room - FRAME * draw(st.integers(0, 4)) + 16 * draw(st.integers(-8, 8))
    return room - 16384 - 16 * draw(st.integers(0, 1024))


@st.composite
def stack_excursion(draw, labels: _Labels, counter: int, reach: _Reach) -> list[Op]:
    """sp moved inside a function, as alloca and pushes move it (berm_aot/emit/stackptr.py; the stack's low-water
    mark; the sp-below-stack trap of docs/SEMANTICS.md): lowered by 16 to 1920 bytes (``c.addi16sp``/``addi``,
    unchecked) or by a ``sub`` deep into the stack (checked: ``_deep_drop``); loads and stores through sp and
    through a copy of it, maybe a push loop whose induction variable is sp (``_push_loop``); sp restored at the
    end."""
    live: set[int] = set()
    if draw(st.integers(0, 3)):
        lowered = 16 * draw(st.integers(1, 120))
        ops, restore = [draw(_sp_step(-lowered))], [draw(_sp_step(lowered))]
    else:
        lowered, held = draw(_deep_drop(reach)), draw(st.sampled_from(FREE))
        ops, restore = [*li(held, lowered), Op("sub", rd=SP, rs1=SP, rs2=held)], [Op("add", rd=SP, rs1=SP, rs2=held)]
        live.add(held)
    dest = st.sampled_from([r for r in (0, *FREE) if r not in live])
    ops += draw(st.lists(_stack_access(SP, 0, lowered, dest), max_size=4))
    if draw(st.booleans()):  # through a copy of sp, the last access maybe loading into it
        copy = draw(st.sampled_from([r for r in FREE if r not in live]))
        at = 8 * draw(st.integers(0, min(lowered + FRAME, 2040) // 8))
        rest = st.sampled_from([r for r in (0, *FREE) if r not in live | {copy}])
        ops += [Op("addi", rd=copy, rs1=SP, imm=at),
                *draw(st.lists(_stack_access(copy, at, lowered, rest), min_size=1, max_size=3)),
                draw(_stack_access(copy, at, lowered, st.sampled_from([copy])))]
    if draw(st.booleans()):
        ops += draw(_push_loop(labels, counter, frozenset(live)))
    return ops + restore


@st.composite
def _push_loop(draw, labels: _Labels, counter: int, live: frozenset[int]) -> list:
    """1 to 40 pushes of 8 to 48 bytes in a counted loop whose induction variable is sp (``addi sp, sp, -size`` to
    a limit computed from sp), each storing before or after its step and maybe reading its slot back; then sp put
    back by a checked write (``add`` of the counter, or ``addi`` from the limit)."""
    size, turns = draw(st.sampled_from([8, 16, 32, 48])), draw(st.integers(1, 40))
    limit = draw(st.sampled_from([r for r in FREE if r not in live]))
    value = draw(_src)
    push = draw(st.sampled_from([[Op("addi", rd=SP, rs1=SP, imm=-size), Op("sd", rs1=SP, rs2=value)],
                                 [Op("sd", rs1=SP, rs2=value, imm=-size), Op("addi", rd=SP, rs1=SP, imm=-size)]]))
    if draw(st.booleans()):
        dest = st.sampled_from([r for r in (0, *FREE) if r not in live | {limit}])
        push.append(draw(_access(SP, dest, 0, size - 8).filter(lambda op: op.name in _LOAD_SIZE)))
    head = labels("push")
    a, b = draw(st.permutations((SP, limit)))
    loop = [*li(counter, -turns * size), Op("add", rd=limit, rs1=SP, rs2=counter), Label(head), *push,
            Op("bne", rs1=a, rs2=b, target=head)]
    if turns * size < 2048 and draw(st.booleans()):
        return loop + [Op("addi", rd=SP, rs1=limit, imm=turns * size)]
    return loop + [*li(counter, turns * size), Op("add", rd=SP, rs1=SP, rs2=counter)]


@st.composite
def tail_call(draw, labels: _Labels, callees: tuple[int, ...]) -> list:
    """Unless a random branch skips it, the function's epilogue but its return, then a jump to a later function,
    which returns to this one's caller: a tail call by ``jal x0`` (a direct transfer out of the function), or by
    ``jalr x0``/``c.jr`` to an address loaded from the function table or made by ``la`` (an indirect jump to a
    function start, which keeps the frame: docs/SEMANTICS.md)."""
    k, stay = draw(st.sampled_from(callees)), labels("stay")
    how, ptr = draw(st.sampled_from(["jal", "table", "la"])), draw(st.sampled_from(CREGS))
    if how == "jal":
        jump = [Op("jal", target=f"f{k}")]
    else:
        address = [Op("ld", rd=ptr, rs1=TP, imm=8 * (k - 1))] if how == "table" else la(ptr, f"f{k}")
        jump = [*address, draw(st.sampled_from([Op("c.jr", rs1=ptr), Op("jalr", rs1=ptr)]))]
    branch = Op(draw(st.sampled_from(rvenc.BRANCH_OPS)), rs1=draw(_src), rs2=draw(_src), target=stay)
    return [branch, *_restore(), *jump, Label(stay)]


@st.composite
def t0_leaf(draw, name: str) -> Function:
    """A leaf function that returns through t0, as millicode does (``jal t0, __riscv_save_0``): a few ALU
    instructions that leave t0 alone, then ``jr t0`` (a return: t0 holds the top frame's return address)."""
    return Function(name, [*draw(_work(frozenset({T0}))), draw(st.sampled_from([Op("c.jr", rs1=T0),
                                                                                  Op("jalr", rs1=T0)]))])


@st.composite
def t0_call(draw, leaf: str) -> list[Op]:
    """A call of the t0 leaf (``t0_leaf``) that links through t0: ``jal t0`` or ``jalr t0`` after an ``la``."""
    if draw(st.booleans()):
        return [Op("jal", rd=T0, target=leaf)]
    ptr = draw(st.sampled_from(FREE))
    return [*la(ptr, leaf), Op("jalr", rd=T0, rs1=ptr)]


#: Core host calls that read and write no buffer, which the translator serves inline when it knows a7 at the
#: ``ecall`` (berm_aot/emit/consts.py).
QUERIES = ("berm.heap.start", "berm.heap.size", "berm.args.len")


@st.composite
def host_query(draw) -> list[Op]:
    """An ``ecall`` of one of ``QUERIES``, a7 set by ``li`` or by an ``xori`` of another constant (which the
    translator must fold as such), between a load and a store of a0 through gp, which the ecall keeps in two
    groups; inside loops too."""
    number, mask = core_number(draw(st.sampled_from(QUERIES))), draw(st.just(0) | st.integers(1, 2047))
    number_in_a7 = [*li(A7, number ^ mask), Op("xori", rd=A7, rs1=A7, imm=mask)] if mask else li(A7, number)
    load = Op(draw(st.sampled_from(rvenc.LOAD_OPS)), rd=draw(_dst), rs1=GP, imm=draw(st.integers(-GP_BIAS, 2040)))
    store = Op(draw(st.sampled_from(rvenc.STORE_OPS)), rs1=GP, rs2=A0, imm=draw(st.integers(-GP_BIAS, 2040)))
    return [load, *number_in_a7, Op("ecall"), store]


_DIVIDENDS = (1 << 63, -(1 << 31) & rvenc.MASK64, 1 << 31, 0x1_8000_0000, rvenc.MASK64, 0, 7)
_DIVISORS = (rvenc.MASK64, 0, 0xFFFF_FFFF, 1 << 32, 0x1_FFFF_FFFF, 1)  # -1 and 0, as 64 bits and as the low word
_DIVISIONS = ("div", "divu", "rem", "remu", "divw", "divuw", "remw", "remuw")


@st.composite
def division_edge(draw) -> list[Op]:
    """A division at its edges, INT_MIN by -1 and anything by 0 (defined results, no trap), 64-bit and w-forms,
    with one register maybe both operands and the destination maybe one of them."""
    a, b = draw(st.permutations(FREE))[:2]
    rs1, rs2 = draw(st.sampled_from([(a, b), (a, a), (b, b), (b, a)]))
    return [*li(a, draw(st.sampled_from(_DIVIDENDS))), *li(b, draw(st.sampled_from(_DIVISORS))),
            Op(draw(st.sampled_from(_DIVISIONS)), rd=draw(st.sampled_from((a, b, 0, *FREE))), rs1=rs1, rs2=rs2)]


@st.composite
def hint(draw) -> list[Op]:
    """A HINT: an instruction that writes x0 (or ``c.addi`` of 0), compressed mostly, which must do nothing."""
    r, imm = draw(st.sampled_from(FREE)), draw(st.integers(1, 31))
    return [draw(st.sampled_from([Op("c.li", imm=imm), Op("c.mv", rs2=r), Op("c.add", rs2=r), Op("c.slli", imm=imm),
                                  Op("c.lui", imm=imm << 12), Op("c.addi", imm=-imm), Op("c.nop", imm=imm),
                                  Op("c.addi", rd=r), Op("addi", rs1=r, imm=imm), Op("lui", imm=imm << 12),
                                  Op("auipc", imm=imm << 12)]))]


@st.composite
def own_base_load(draw) -> list[Op]:
    """A load into its own base register (``ld a0, 8(a0)``: a list's walk) from the data page, plain or
    compressed."""
    ptr = draw(st.sampled_from(CREGS))
    setup = Op("addi", rd=ptr, rs1=GP, imm=8 * draw(st.integers(-GP_BIAS // 8 + 8, (GP_BIAS - 256) // 8)))
    name = draw(st.sampled_from(rvenc.LOAD_OPS + ("c.lw", "c.ld")))
    if name.startswith("c."):
        size = 8 if name == "c.ld" else 4
        return [setup, Op(name, rd=ptr, rs1=ptr, imm=size * draw(st.integers(0, (124 if size == 4 else 248) // size)))]
    return [setup, Op(name, rd=ptr, rs1=ptr, imm=draw(st.integers(-64, 64)))]


@st.composite
def stray_atomic(draw, berm_only: bool) -> list[Op]:
    """An atomic off the happy path: on the read-only page or the text (its store faults; an lr only loads),
    aligned at a layout edge, or on the data with its destination its own address register; with ``berm_only``
    (an emulator differs: docs/SEMANTICS.md) also misaligned, or an ``sc`` with no ``lr`` before it or after one
    at another address, which Berm's single hart lets succeed."""
    w = draw(st.sampled_from("wd"))
    size = 4 if w == "w" else 8
    place = draw(st.sampled_from(["read-only", "text", "edge", "data"] + (["misaligned"] if berm_only else [])))
    if place == "read-only":
        addr = RODATA + size * draw(st.integers(0, RODATA_SIZE // size - 1))
    elif place == "text":
        addr = TEXT + size * draw(st.integers(0, 64))
    elif place == "edge":
        at, _ = window_edges(stores=True)[draw(_edge_names(stores=True))]
        addr = (at + size * draw(st.integers(-2, 1))) & rvenc.MASK64
    else:
        addr = DATA + size * draw(st.integers(0, DATA_SIZE // size - 2)) + (
            draw(st.integers(1, size - 1)) if place == "misaligned" else 0)
    ptr = draw(st.sampled_from(FREE))
    rd, others = draw(st.sampled_from((ptr, 0, *FREE))), [r for r in FREE if r != ptr]
    sc = Op(f"sc.{w}", rd=rd, rs1=ptr, rs2=draw(_src))
    kind = draw(st.sampled_from(["amo", "lr", "lr then sc"] + (["sc alone", "sc elsewhere"] if berm_only else [])))
    if kind == "amo":
        name = draw(st.sampled_from([n for n in rvenc.AMO_OPS if n.endswith(w) and n[:2] not in ("lr", "sc")]))
        ops = [Op(name, rd=rd, rs1=ptr, rs2=draw(_src), aq=draw(st.booleans()), rl=draw(st.booleans()))]
    elif kind == "lr":
        ops = [Op(f"lr.{w}", rd=rd, rs1=ptr)]
    elif kind == "lr then sc":
        ops = [Op(f"lr.{w}", rd=draw(st.sampled_from(others)), rs1=ptr), sc]
    elif kind == "sc alone":
        ops = [sc]
    else:
        elsewhere = draw(st.sampled_from(others))
        ops = [*li(elsewhere, DATA + size * draw(st.integers(0, DATA_SIZE // size - 1))),
               Op(f"lr.{w}", rd=draw(st.sampled_from([r for r in others if r != elsewhere])), rs1=elsewhere), sc]
    return [*li(ptr, addr), *ops]


_EDGES = {
    "null": lambda: 0,
    "below image": lambda: TEXT - 8,
    "text": lambda: TEXT,
    "rodata": lambda: RODATA + 8,
    "end of data": lambda: DATA + DATA_SIZE - 4,
    "guard": lambda: guard_lo() - 4,
    "inside guard": lambda: guard_lo() + 16,
    "stack base": lambda: guard_lo() + 4096 - 4,
    "end of memory": lambda: MEMORY_SIZE - 4,
    "past the end": lambda: MEMORY_SIZE,
    "wrap": lambda: (1 << 64) - 4,
}


def guard_lo() -> int:
    """Where the guard page starts in ``MEMORY_SIZE`` bytes (ABI.md §5: the stack is the top quarter below 4 MiB)."""
    return MEMORY_SIZE - min(1 << 20, MEMORY_SIZE // 4) - 4096


@st.composite
def edge_probe(draw) -> list[Op]:
    """A load or store at an edge of the memory layout: it faults, or straddles, or just fits."""
    addr = (_EDGES[draw(st.sampled_from(sorted(_EDGES)))]() + draw(st.integers(-8, 8))) & rvenc.MASK64
    ptr = draw(st.sampled_from(FREE))
    if draw(st.booleans()):
        name = draw(st.sampled_from(rvenc.LOAD_OPS))
        return [*li(ptr, addr), Op(name, rd=draw(_dst), rs1=ptr)]
    return [*li(ptr, addr), Op(draw(st.sampled_from(rvenc.STORE_OPS)), rs1=ptr, rs2=draw(_src))]


#: The ways a probe ends a program other than a load or store at a layout edge, each a trap of its own kind.
OTHER_ENDINGS = ("ebreak", "unknown host call", "illegal instruction", "indirect jump")


@st.composite
def ending_probe(draw) -> tuple[list[Op], str]:
    """A probe that may end the run: mostly a load or store at a layout edge (``edge_probe``), else an ``ebreak``,
    an ``ecall`` of a number nobody serves, ``c.unimp`` or a ``jalr`` to an arbitrary address (a legal target
    now and then: then the run goes on from there). Its ops, and the feature it adds."""
    kind = draw(st.sampled_from(("edge",) * 4 + OTHER_ENDINGS))
    if kind == "edge":
        return draw(edge_probe()), "edge probe"
    if kind == "ebreak":
        return [Op(draw(st.sampled_from(("ebreak", "c.ebreak"))))], kind
    if kind == "unknown host call":
        return [*li(A7, draw(VALUES)), Op("ecall")], kind
    if kind == "illegal instruction":
        return [Op(".half", imm=0)], kind  # c.unimp: the all-zero halfword is defined illegal
    ptr = draw(st.sampled_from(FREE))
    target = draw(st.one_of(st.sampled_from([0, TEXT, TEXT + 1, TEXT + 2, RODATA, DATA, MEMORY_SIZE - 8]),
                            st.integers(TEXT, TEXT + 0x400), VALUES))
    return [*li(ptr, target), Op("jalr", rd=draw(st.sampled_from((0, RA))), rs1=ptr)], kind


def _prologue() -> list[Op]:
    return [Op("addi", rd=SP, rs1=SP, imm=-FRAME), Op("sd", rs1=SP, rs2=RA)]


def _restore() -> list[Op]:
    """What an epilogue does before it returns: ``ra`` and ``sp`` as the caller had them."""
    return [Op("ld", rd=RA, rs1=SP), Op("addi", rd=SP, rs1=SP, imm=FRAME)]


def _epilogue(index: int, flip: bool) -> list[Op]:
    """The return of function ``index``: ``ret`` or ``c.jr ra`` for an even index; for an odd one, through an odd
    target that ``jalr`` clears bit 0 of — ``ra`` made odd, or an offset of 1 (a return compares the unmasked target
    with its link first: berm_aot/emit/function.py). The index, not a draw, picks the kind: one more draw would change
    every batch the tests draw, and some assert what theirs hold."""
    if index % 2 == 0:
        ret = [Op("c.jr", rs1=RA) if flip else Op("jalr", rs1=RA)]
    else:
        ret = [Op("ori", rd=RA, rs1=RA, imm=1), Op("jalr", rs1=RA)] if flip else [Op("jalr", rs1=RA, imm=1)]
    return [*_restore(), *ret]


@st.composite
def programs(draw, *, faults: bool = True, endings: bool = True, max_blocks: int = 15, switches: int = 1,
             self_calls: bool = False, berm_only: bool = True) -> GenProgram:
    """A random program: ``f0`` (the entry) and helpers ``f1…fN``; ``fi`` calls only ``fj`` with ``j > i`` (and
    maybe tail-calls one: ``tail_call``); half the programs also have a leaf that returns through t0
    (``t0_leaf``). ``faults``: ``f0`` may end in a probe; ``endings``: in any kind of trap (``ending_probe``), not
    only a memory fault (``edge_probe``: what an emulator without Berm's host calls and CFI can be compared on).
    ``switches``: the weight of a ``switch`` construct among a block's other kinds (about 20; 0: none).
    ``self_calls``: each function may also call itself (``self_call``, between its top-level blocks, where no loop
    counts in its counter register). ``berm_only``: blocks may also do what only Berm defines (``_Reach``); an
    emulator's comparison turns it off. (A block's kinds grew from 12 to 18 with the shapes of ``_Reach``, and
    ``max_blocks`` from 12 to 15, so that a program holds about as many blocks of the older kinds as before.)"""
    labels = _Labels()
    n_funcs = draw(st.integers(1, MAX_FUNCTIONS))
    reach = _Reach(berm_only, "leaf" if draw(st.booleans()) else None)
    functions = []
    jump_tables: list[tuple[str, tuple[str, ...]]] = []
    features: set[str] = set()
    for i in range(n_funcs):
        callees = tuple(range(i + 1, n_funcs)) if i else tuple(range(1, n_funcs))
        own = _Switches(switches)
        body = []
        if i == 0:
            body += li(GP, DATA + GP_BIAS) + li(TP, RODATA)
            for r in draw(st.lists(st.sampled_from(FREE), unique=True, max_size=len(FREE))):
                body += li(r, draw(VALUES))
        sites = draw(st.integers(1, MAX_SELF_CALLS)) if self_calls else 0  # so that most programs have one
        for _ in range(draw(st.integers(1, max_blocks))):
            body += draw(block(labels, callees, COUNTERS[i], False, own, reach))
            if sites and draw(st.booleans()):
                body += draw(self_call(labels, f"f{i}"))
                sites -= 1
                features.add("self call")
        if i == 0 and faults and draw(st.integers(0, 3)) == 0:
            probe, feature = draw(ending_probe()) if endings else (draw(edge_probe()), "edge probe")
            body += probe
            features.add(feature)
        functions.append(Function(f"f{i}", _prologue() + body + _epilogue(i, draw(st.booleans()))))
        jump_tables += own.tables
        features |= own.features
    if reach.leaf:
        functions.append(draw(t0_leaf(reach.leaf)))
    features |= reach.features
    table = tuple(f"f{k}" for k in range(1, n_funcs))
    fill = random.Random(draw(st.integers(0, 1 << 32)))  # page contents: a seed, not 5 KiB of hypothesis data
    slots = len(table) + sum(len(entries) for _, entries in jump_tables)
    rodata = fill.randbytes(RODATA_SIZE - 8 * slots)
    data = fill.randbytes(DATA_SIZE)
    image = build_image(functions, rodata=rodata, data=data, table=table, jump_tables=tuple(jump_tables))
    listing = "\n".join(f"{f.name}:\n" + "\n".join(f"    {x}" for x in f.items) for f in functions)
    listing += "".join(f"\n{name}: {' '.join(entries)}" for name, entries in jump_tables)
    return GenProgram(image=image, entry=image.entry, listing=listing, features=frozenset(features))
