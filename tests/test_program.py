"""The program model (docs/SEMANTICS.md "Program model"): hand-assembled images for each rule, then real guests."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berm_aot.elf import read_elf
from berm_aot.errors import DecodeError
from berm_aot.image import ElfImage, Relocation, Section, Segment, Symbol
from berm_aot.isa import BRANCHES
from berm_aot.program import Function, Program, _close_starts, _CodeMap
from tests.elf_samples import DISPATCH_SOURCE, label_calls_elf
from tests.guests import guest_elf
from tests.rvenc import Label, Op, assemble, la

TEXT = 0x10000
DATA = 0x20000
RA, SP, A0, A1, T0 = 1, 2, 10, 11, 5


def sym(name: str, value: int, kind: str = "func", binding: str = "global", section: str | None = ".text"):
    return Symbol(name, value, 0, kind, binding, section)


def reloc(offset: int, type_name: str, target: int, section: str = ".data") -> Relocation:
    return Relocation(offset, 0, type_name, "x", target, 0, section)


def image(items: list, *, symbols=(), relocations=(), data: bytes = b"", extra_text: bytes = b"") -> tuple:
    """An ElfImage whose .text is ``items`` assembled at TEXT (plus raw ``extra_text`` bytes after it) and whose
    .data holds ``data``; returns the image and the label addresses."""
    asm = assemble(items, TEXT)
    code = asm.code + extra_text
    labels = asm.labels
    sections = [Section(".text", TEXT, len(code), True, True, False)]
    segments = [Segment(TEXT, len(code), code, True, False, True)]
    if data:
        sections.append(Section(".data", DATA, len(data), True, False, True))
        segments.append(Segment(DATA, len(data), data, True, True, False))
    syms = tuple(s(labels) if callable(s) else s for s in symbols)
    relocs = tuple(r(labels) if callable(r) else r for r in relocations)
    img = ElfImage("0" * 64, 0, TEXT, 5, tuple(segments), tuple(sections), syms, relocs, None, b"")
    return img, labels


RET = Op("jalr", rd=0, rs1=RA)


def test_functions_partition_text_and_take_symbol_names():
    items = [Label("a"), Op("addi", rd=A0, rs1=A0, imm=1), RET,
             Label("b"), Op("c.addi", rd=A0, imm=2), RET,
             Label("c"), RET]
    img, at = image(items, symbols=[lambda at: sym("a", at["a"]), lambda at: sym("b_local", at["b"], binding="local"),
                                    lambda at: sym("b", at["b"], binding="weak"),
                                    lambda at: sym("b_obj", at["b"], kind="notype")])
    p = Program.from_image(img)
    # c has no symbol and nothing reaches it: it is the tail of b's function, and never decoded.
    assert p.functions == (Function("a", at["a"], at["b"]), Function("b_obj", at["b"], at["c"] + 4))
    assert p.function_starts == {at["a"], at["b"]}
    assert at["c"] not in p.code
    assert p.symbolize(at["b"]) == "b_obj" and p.symbolize(at["b"] + 2) == "b_obj+0x2"
    assert p.symbolize(0x5) == "0x5" and p.function_at(0x5) is None and p.function_at(TEXT - 1) is None
    assert p.function_at(at["c"] + 3).name == "b_obj"
    assert p.function_at(at["c"] + 4) is None


def test_global_beats_weak_beats_local_and_func_beats_notype():
    items = [Label("f"), RET]
    symbols = [sym("loc", TEXT, binding="local"), sym("wk", TEXT, binding="weak"), sym("glob_notype", TEXT, "notype"),
               sym("glob", TEXT), sym("$x", TEXT, "notype", "local"), sym(".L0 ", TEXT, "notype", "local")]
    p = Program.from_image(image(items, symbols=symbols)[0])
    assert p.functions[0].name == "glob"
    assert p.symbol("glob") == TEXT and p.symbol("wk") == TEXT and p.symbol("loc") is None
    assert p.symbol("missing") is None


def test_call_targets_and_jumps_leaving_a_function_become_starts():
    items = [Label("main"), Op("jal", rd=RA, target="helper"), Op("beq", rs1=A0, rs2=0, target="skip"),
             Op("addi", rd=A0, imm=1),
             Label("skip"), Op("jal", rd=0, target="tail"),
             Label("helper"), RET,
             Label("mid"), Op("addi", rd=A1, imm=2), RET,
             Label("tail"), Op("c.j", target="mid")]
    img, at = image(items, symbols=[sym("main", TEXT)])
    p = Program.from_image(img)
    # helper: called. tail: reached by a jal x0 from main that crosses helper's start. mid: reached by tail's c.j,
    # which crosses a function boundary only once tail is a start (closure by iteration). skip stays in main.
    assert p.function_starts == {TEXT, at["helper"], at["tail"], at["mid"]}
    assert [f.name for f in p.functions] == ["main", *("fn_%x" % at[k] for k in ("helper", "mid", "tail"))]
    assert [f.end - f.start for f in p.functions] == [16, 4, 8, 2]
    assert set(p.code) == {TEXT + off for off in (0, 4, 8, 12, 16, 20, 24, 28)}


def test_a_chain_of_backward_jumps_makes_every_link_a_start():
    """Each ``j .-4`` crosses a boundary only once the jump after it is a start: 20,000 links of closure. Found by a
    review: the closure rescanned every jump per link (4,000 links took 6 s, 8,000 took 30 s); it visits each start
    once now, so this image loads in well under a second, and a return of the quadratic closure shows as a test
    that takes minutes."""
    n = 20_000
    items = [Label("main"), RET, *(Op("jal", rd=0, imm=-4) for _ in range(n))]
    img, _ = image(items, symbols=[sym("main", TEXT), sym("last", TEXT + 4 * n)])
    p = Program.from_image(img)
    assert p.function_starts == {TEXT + 4 * k for k in range(n + 1)}


def _naive_close(starts: set[int], code: dict, codemap: _CodeMap) -> set[int]:
    """SEMANTICS.md's closure of function starts as it reads, to the letter: repeat until nothing changes."""
    starts = set(starts)
    starts |= {i.addr + i.imm for i in code.values()
               if i.op == "jal" and i.rd != 0 and codemap.section_of(i.addr + i.imm) is not None}
    changed = True
    while changed:
        changed = False
        for i in code.values():
            new = []
            if (i.op == "jal" and i.rd == 0) or i.op in BRANCHES:
                t = i.addr + i.imm
                if codemap.section_of(t) is not None and any(min(i.addr, t) < s <= max(i.addr, t) for s in starts):
                    new.append(t)
            if (i.falls_through and codemap.section_of(i.next_pc) is not None
                    and any(i.addr < s < i.next_pc for s in starts)):
                new.append(i.next_pc)
            changed |= not starts.issuperset(new)
            starts.update(new)
    return starts


_SHAPES = ("addi", "c.addi", "jal0", "call", "beq", "c.j", "ret", "ebreak")


@st.composite
def _jumpy_code(draw):
    """Items of straight code, jumps, branches, calls and returns between labels at every item, and function
    symbols at any byte of the code, odd ones and ones inside an instruction included."""
    n = draw(st.integers(1, 24))
    items = []
    for k in range(n):
        shape, to = draw(st.sampled_from(_SHAPES)), f"i{draw(st.integers(0, n - 1))}"
        items.append(Label(f"i{k}"))
        items.append({"addi": Op("addi", rd=A0, rs1=A0, imm=1), "c.addi": Op("c.addi", rd=A0, imm=1),
                      "jal0": Op("jal", rd=0, target=to), "call": Op("jal", rd=RA, target=to),
                      "beq": Op("beq", rs1=A0, rs2=0, target=to), "c.j": Op("c.j", target=to),
                      "ret": RET, "ebreak": Op("c.ebreak")}[shape])
    length = len(assemble(items, TEXT).code)
    offsets = draw(st.lists(st.integers(0, length - 1), max_size=4))
    return items, [TEXT + off for off in offsets]


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(_jumpy_code())
def test_the_closure_of_starts_is_the_naive_fixpoint(case):
    """The segment-tree closure (``_close_starts``) against the rule applied until nothing changes."""
    items, symbol_addrs = case
    img, _ = image(items, symbols=[sym(f"s{k}", a) for k, a in enumerate([TEXT, *symbol_addrs])])
    codemap = _CodeMap(img)
    roots = {TEXT, *symbol_addrs}
    code = codemap.descend(roots)
    assert _close_starts(roots, code, codemap) == _naive_close(roots, code, codemap)


def test_data_after_an_unconditional_jump_is_not_code():
    items = [Label("f"), Op("jal", rd=0, target="g"), Label("g"), RET]
    junk = bytes.fromhex("57000000")  # an OP-V word: never reached, so it refuses nothing
    img, at = image(items, symbols=[sym("f", TEXT)], extra_text=junk)
    p = Program.from_image(img)
    assert set(p.code) == {TEXT, at["g"]}
    assert not any(i.op == "illegal" for i in p.code.values())
    assert p.instruction(at["g"] + 4).op == "illegal"  # decoded on demand
    assert p.instruction(at["g"] + 4) is p.instruction(at["g"] + 4)
    assert p.instruction(DATA).note == "not code"


def test_ebreak_and_illegal_stop_descent_and_illegal_is_kept():
    items = [Label("f"), Op("beq", rs1=A0, rs2=0, target="bad"), Op("c.ebreak"), Op("c.ebreak"),
             Label("bad")]
    img, at = image(items, symbols=[sym("f", TEXT)], extra_text=bytes(2) + bytes.fromhex("13000000"))
    p = Program.from_image(img)
    assert set(p.code) == {TEXT, TEXT + 4, at["bad"]}
    assert p.code[at["bad"]].op == "illegal" and p.code[at["bad"]].note == "c.unimp"


def test_calls_and_ecall_fall_through():
    items = [Label("f"), Op("jalr", rd=RA, rs1=A0), Op("ecall"), Op("c.jalr", rs1=A1), RET]
    p = Program.from_image(image(items, symbols=[sym("f", TEXT)])[0])
    assert set(p.code) == {TEXT, TEXT + 4, TEXT + 8, TEXT + 10}


def test_fall_through_off_the_section_end_and_truncated_instructions():
    img, _ = image([Label("f"), Op("addi", rd=A0, imm=1)], symbols=[sym("f", TEXT)], extra_text=b"\x13\x05")
    p = Program.from_image(img)
    assert p.code[TEXT + 4].op == "illegal" and p.code[TEXT + 4].note == "truncated"
    img, _ = image([Label("f"), Op("addi", rd=A0, imm=1)], symbols=[sym("f", TEXT)])
    assert set(Program.from_image(img).code) == {TEXT}


def test_unsupported_reached_refuses_the_image_naming_address_and_function():
    items = [Label("f"), Op("addi", rd=A0, imm=1), Op("beq", rs1=A0, rs2=0, imm=12), RET]
    fld = (0x0005B507).to_bytes(4, "little")  # at f+0xc, never reached
    csr = (0x34011173).to_bytes(4, "little")  # csrrw sp, mscratch, sp at f+0x10, the branch target
    img, _ = image(items, symbols=[sym("f", TEXT)], extra_text=fld + csr)
    with pytest.raises(DecodeError, match=r"^csrrw \(Zicsr\) at 0x10010 in f\+0x10: Berm runs RV64IMAC only$"):
        Program.from_image(img)


def test_unsupported_never_reached_is_fine():
    items = [Label("f"), RET]
    img, _ = image(items, symbols=[sym("f", TEXT)], extra_text=(0x30200073).to_bytes(4, "little"))
    assert Program.from_image(img).code.keys() == {TEXT}


def test_legal_indirect_targets_from_relocations():
    items = [Label("f"), *la(A0, "g"), Op("jalr", rd=0, rs1=A0),
             Label("g"), Op("addi", rd=A0, imm=1), RET,
             Label("case1"), RET, Label("case2"), RET, Label("case3"), RET, Label("case4"), RET, Label("h"), RET,
             Label("callee"), RET, Label("callee_plt"), RET]
    relocations = [
        lambda at: reloc(at["f"], "R_RISCV_PCREL_HI20", at["g"], ".text"),
        lambda at: reloc(DATA, "R_RISCV_64", at["case1"]),
        lambda at: reloc(DATA + 8, "R_RISCV_32", at["case2"]),
        lambda at: reloc(DATA + 12, "R_RISCV_ADD32", at["case3"]),
        lambda at: reloc(DATA + 12, "R_RISCV_SUB32", at["f"]),
        lambda at: reloc(DATA + 16, "R_RISCV_ADD32", at["case4"]),  # no SUB32 partner: names nothing
        lambda at: reloc(DATA + 24, "R_RISCV_64", DATA + 8),  # a data pointer: not code
        lambda at: reloc(DATA + 32, "R_RISCV_JAL", at["h"]),  # a direct-jump relocation names no indirect target
        lambda at: reloc(at["f"], "R_RISCV_CALL", at["callee"], ".text"),  # an unrelaxed auipc/jalr call
        lambda at: reloc(at["f"], "R_RISCV_CALL_PLT", at["callee_plt"], ".text"),
    ]
    img, at = image(items, symbols=[sym("f", TEXT)], relocations=relocations, data=bytes(40))
    p = Program.from_image(img)
    assert p.indirect_targets == {at[k] for k in ("g", "case1", "case2", "case3", "callee", "callee_plt")}
    # A call's target is a function entry, symbol or not (the rest are not starts: nothing else calls them).
    assert p.function_starts == {TEXT, at["callee"], at["callee_plt"]}
    # Legal targets are descent roots; case4 and h are reached by nothing.
    assert {at["g"], at["case1"], at["case2"], at["case3"]} <= set(p.code)
    assert at["case4"] not in p.code and at["h"] not in p.code


def test_check_indirect():
    items = [Label("f"), Op("jalr", rd=0, rs1=A0), Label("f_inside"), RET, Label("f_inside2"), RET,
             Label("g"), Op("jalr", rd=RA, rs1=A0), Label("g_inside"), RET]
    relocations = [lambda at, k=k: reloc(DATA + 8 * i, "R_RISCV_64", at[k])
                   for i, k in enumerate(["f", "f_inside", "g", "g_inside"])]
    img, at = image(items, symbols=[sym("f", TEXT), lambda at: sym("g", at["g"])], relocations=relocations,
                    data=bytes(32))
    p = Program.from_image(img)
    f, g = at["f"], at["g"]
    assert p.check_indirect(f, g, is_call=True) == "call"
    assert p.check_indirect(f, g, is_call=False) == "tail"
    assert p.check_indirect(f, f, is_call=False) == "tail"  # a function start is never "local"
    assert p.check_indirect(f, at["f_inside"], is_call=False) == "local"
    assert p.check_indirect(f, at["f_inside"], is_call=True) is None  # calls only reach function starts
    assert p.check_indirect(f, at["g_inside"], is_call=False) is None  # inside another function
    assert p.check_indirect(g, at["f_inside"], is_call=False) is None
    assert p.check_indirect(f, at["f_inside2"], is_call=False) is None  # not named by any relocation
    assert p.check_indirect(f, DATA, is_call=True) is None


def test_in_code():
    img, _ = image([Label("f"), RET], symbols=[sym("f", TEXT)], data=bytes(8))
    p = Program.from_image(img)
    assert p.in_code(TEXT) and p.in_code(TEXT + 3)
    assert not p.in_code(TEXT + 4) and not p.in_code(TEXT - 1) and not p.in_code(DATA)


def test_code_is_read_only():
    p = Program.from_image(image([Label("f"), RET], symbols=[sym("f", TEXT)])[0])
    with pytest.raises(TypeError):
        p.code[0] = p.code[TEXT]


# ---------------------------------------------------------------------------------------------------------------
# Real guests


@pytest.fixture(scope="module", params=["-O0", "-O2"])
def dispatch(request):
    return Program.from_image(read_elf(guest_elf(DISPATCH_SOURCE, opt=request.param, keep=("berm_tool_dispatch",))))


def test_real_guest_functions_and_targets(dispatch):
    p = dispatch
    funcs = {s.name: s.value for s in p.image.symbols if s.kind == "func"}
    assert {"arm", "_start"} <= funcs.keys()
    for name, addr in funcs.items():
        assert addr in p.function_starts and p.function_at(addr).start == addr
        assert addr in p.code, name
    # Functions partition .text exactly.
    text = [s for s in p.image.executable_sections()]
    assert sum(f.end - f.start for f in p.functions) == sum(s.size for s in text)
    assert all(a.end == b.start for a, b in zip(p.functions, p.functions[1:]) if b.start < text[0].end)
    # Every indirect jump inside arm that is not a return has legal local targets (the jump table).
    arm = p.function_at(funcs["arm"])
    local = [t for t in p.indirect_targets if arm.start < t < arm.end]
    if local:  # -O2 compiles the switch to a jump table
        assert all(p.check_indirect(arm.start, t, is_call=False) == "local" for t in local)
        assert all(t in p.code for t in local)


def test_real_guest_code_agrees_with_llvm_objdump(dispatch):
    """Every reachable instruction sits where llvm-objdump's linear sweep puts one (compiler output has no data
    in .text), and decodes to the same length."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".elf") as f:
        f.write(dispatch.image.raw)
        f.flush()
        out = subprocess.run(["llvm-objdump", "-d", "--no-show-raw-insn", f.name], capture_output=True, text=True,
                             check=True).stdout
    addrs = {int(line.split(":")[0], 16) for line in out.splitlines()
             if line.startswith(" ") and ":" in line and line.split(":")[0].strip()}
    assert set(dispatch.code) <= addrs
    assert len(dispatch.code) > 20


def test_unrelaxed_calls_to_a_label_without_a_symbol_reach_a_function_start():
    p = Program.from_image(read_elf(label_calls_elf()))
    helper = p.symbol("other") + 4  # .Lhelper, after other's c.li and c.ret
    assert all(s.kind != "func" for s in p.image.symbols if s.value == helper)
    for name, how in (("caller", "call"), ("tailer", "tail")):
        f = p.function_at(p.symbol(name))
        (call,) = [r for r in p.image.relocations if r.type_name in ("R_RISCV_CALL", "R_RISCV_CALL_PLT")
                   and f.start <= r.offset < f.end]
        assert call.target == helper
        auipc, jalr = p.code[call.offset], p.code[call.offset + 4]
        assert auipc.op == "auipc" and jalr.op == "jalr"  # an unrelaxed pair, not a jal
        assert p.check_indirect(jalr.addr, helper, is_call=jalr.rd != 0) == how
    assert helper in p.function_starts and p.function_at(helper) == Function(f"fn_{helper:x}", helper, helper + 4)


CALL_CHAIN = "".join(f"""
    .section .text.{name}, "ax", @progbits
    .globl {name}
    .type {name}, @function
{name}:
    {body}
    ret
""" for name, body in [("f3", "li t0, 1"), ("f2", "call f3"), ("f1", "call f2"), ("_start", "call f1"),
                       ("ping", "call pong"), ("pong", "li t1, 2; call ping")])  # callees first: the hard order


def test_what_a_function_and_its_callees_write_reaches_every_caller_and_cycle():
    from berm_aot.analysis import analyse

    program = Program.from_image(read_elf(guest_elf(CALL_CHAIN, suffix=".S", keep=("ping",))))
    closure = {f.func.name: f.writes_closure for f in analyse(program).functions}
    assert {1, 5} <= closure["_start"] and 6 not in closure["_start"]  # ra from the calls, t0 from f3
    assert closure["f3"] == {5}
    assert closure["ping"] == closure["pong"] == {1, 6}
