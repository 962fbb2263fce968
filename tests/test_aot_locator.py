"""Traps of translated code named from the locator its object carries (berm_aot.locator), not the program model:
a cached load describes its traps exactly as the interpreter does without decoding the program."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from berm_aot.elf import read_elf
from berm_aot.locator import CodeSection, CodeSections, Locator, partition
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.traps import call_site
from tests.guests import guest_elf

MEMORY = 1 << 20

#: A function whose name has everything a C string or comment must not take raw, and one that traps each way.
NAMED = r"""
__attribute__((noinline)) long odd(long a) __asm__("o\"d\\d */ \n\t é ✓ \x7f \"name??/");
__attribute__((noinline)) long odd(long a) { return *(volatile long *)a + 1; }
__attribute__((noinline)) long jump_to(long a) { return ((long (*)(long))a)(1); }
__attribute__((noinline)) long stop(long a) { __builtin_trap(); }
long _start(long how, long a) {
    if (how == 0) return odd(a);
    if (how == 1) return jump_to(a);
    return stop(a);
}
"""


@pytest.fixture(scope="module")
def elf():
    return guest_elf(NAMED, opt="-O1", keep=("_start",))


def _traps(backend, program):
    """The trap of each way ``_start`` fails: a fault in ``odd``, a jump into ``odd``'s middle and to no code, and
    an illegal instruction."""
    odd = next(f.start for f in program.functions if f.name.startswith('o"d'))
    runs = [(0, 8), (1, odd + 2), (1, 0x10), (2, 0)]
    return [backend.run(RunRequest(entry=program.image.entry, int_args=args)).trap for args in runs]


#: A compiler that reads trigraphs (-trigraphs last: the host's own -std=gnu11 would turn them off again).
TRIGRAPHS_CC = """sh -c 'exec cc "$@" -trigraphs' cc"""


@pytest.mark.parametrize("cc", [None, TRIGRAPHS_CC], ids=["default", "trigraphs"])
def test_a_cached_load_names_its_traps_without_the_program_model(elf, tmp_path, monkeypatch, cc):
    """Found by a review: with trigraphs on, a name ending in ``??/`` ended the locator's C string literal early."""
    if cc:
        monkeypatch.setenv("BERM_CC", cc)
    program = Program.from_image(read_elf(elf))
    expected = _traps(Engine(kind="interp", memory_size=MEMORY).load(elf).backend, program)
    # (shown on one line: escaped, berm_aot.demangle.shown_name)
    assert all(t is not None for t in expected) and 'o"d\\d */ \\x0a\\x09 é ✓ \\x7f "name??/' in expected[0].where
    Engine(kind="aot", memory_size=MEMORY, cache_dir=tmp_path).load(elf)  # fills the code cache

    def no_program(image):
        raise AssertionError("a cached load built the program model")

    monkeypatch.setattr(Program, "from_image", no_program)
    backend = Engine(kind="aot", memory_size=MEMORY, cache_dir=tmp_path).load(elf).backend
    assert not backend.compiled
    assert _traps(backend, program) == expected


names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 64), st.binary(min_size=2, max_size=40)), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(0, 4000), names), max_size=12), st.data())
def test_a_locator_reads_back_as_it_was_written(sections, named, data):
    code, addr = [], 0x1000
    for gap, body in sections:
        addr += gap
        code.append(CodeSection(addr, body))
        addr += len(body)
    code = CodeSections(code)
    starts = {s.addr: f"sec_{s.addr:x}" for s in code.sections}
    starts.update((0x1000 + off, name) for off, name in named if code.section_of(0x1000 + off))
    locator = Locator(code, partition(code, starts))
    memory = {s.addr + i: b for s in code.sections for i, b in enumerate(s.data)}
    back = Locator.loads("\n".join(locator.dumps()), lambda a, n: bytes(memory[a + i] for i in range(n)))
    assert back.functions == locator.functions
    assert [(s.addr, s.data) for s in back.code.sections] == [(s.addr, s.data) for s in code.sections]
    pc = data.draw(st.integers(0xff0, addr + 4))
    assert (back.symbolize(pc), back.in_code(pc), back.instruction(pc)) == \
        (locator.symbolize(pc), locator.in_code(pc), locator.instruction(pc))


def test_a_name_many_functions_share_is_written_once():
    """Found by a review: 1,000 functions whose symbols shared one 300 KB name wrote it 1,000 times into the object."""
    code = CodeSections([CodeSection(0x1000, bytes(400))])
    long_name = "n" * 10_000
    locator = Locator(code, partition(code, {0x1000 + 4 * k: long_name for k in range(100)}))
    text = "\n".join(locator.dumps())
    assert text.count(long_name) == 1
    back = Locator.loads(text, lambda a, n: bytes(n))
    assert back.functions == locator.functions and len(back.functions) == 100


#: ``lui t0, 0xef0`` (its second half, 0x00ef, ends in 0b11), ``c.jalr a0``, ``c.nop``: read from 0x1002, the
#: second half of the lui and the c.jalr make ``jal ra, …``, a 4-byte call right before the c.jalr's return address.
AMBIGUOUS = bytes.fromhex("b702ef00" "0295" "0100")


@pytest.mark.parametrize("start", [0x1000, None])
def test_a_call_site_that_also_reads_as_a_4_byte_call_is_found_from_the_function_start(start):
    code = CodeSections([CodeSection(0x0ffe, b"\x01\x00" + AMBIGUOUS)])
    locator = Locator(code, partition(code, {0x0ffe: "before", **({start: "f"} if start else {})}))
    assert locator.instruction(0x1002).op == "jal" and locator.instruction(0x1004).op == "jalr"
    assert call_site(locator, 0x1006) == 0x1004
    assert locator.symbolize(call_site(locator, 0x1006)) == ("f+0x4" if start else "before+0x6")


def test_a_call_site_far_into_a_function_is_read_as_the_4_byte_call_without_walking_there():
    """Each chain frame's ambiguous call site decoded its function from the start, in Python, after the deadline:
    2 million c.nops before one made a trap take 22-31 s. Past WALK_LIMIT the 4-byte reading is taken."""
    from berm_host.traps import WALK_LIMIT

    for pad in (WALK_LIMIT - 16, WALK_LIMIT + 16):
        code = CodeSections([CodeSection(0x1000, b"\x01\x00" * (pad // 2) + AMBIGUOUS)])
        locator = Locator(code, partition(code, {0x1000: "f"}))
        link = 0x1000 + pad + 6
        assert call_site(locator, link) == (link - 2 if pad < WALK_LIMIT else link - 4)
        assert len(locator._decoded) < (pad // 2 if pad > WALK_LIMIT else pad)  # nothing walked past the limit
