"""The committed Rust harness (harnesses/rust-probe, rebuilt by its build.sh): what rustc and LLVM emit for a
third-party harness reads, analyses and runs, with the same text on every engine."""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from berm_aot.elf import read_elf_file
from berm_aot.manifest import load_manifest
from berm_aot.program import Program
from berm_host.engine import KINDS, Engine
from berm_host.traps import ToolFailure, Trap, TrapKind

ELF = Path(__file__).resolve().parent.parent / "harnesses" / "rust-probe" / "rust-probe.elf"
M64 = (1 << 64) - 1


@pytest.fixture(scope="module")
def image():
    return read_elf_file(ELF)


@pytest.fixture(scope="module")
def program(image):
    return Program.from_image(image)


@pytest.fixture(scope="module", params=KINDS)
def probe(request):
    """rust-probe on each engine, and the list its log lines are appended to."""
    logs = []
    engine = Engine(kind=request.param, log=lambda name, line: logs.append(line))
    return engine.load(ELF).harness(name="probe"), logs


def test_manifest_and_exports(image):
    manifest = load_manifest(image)
    assert [t.name for t in manifest.tools] == ["format", "classify", "shapes", "check", "numbers", "words", "parse",
                                                "atomics"]
    assert manifest.usage.startswith("rust-probe exercises")


def test_rustc_code_shapes(image, program):
    """Jump tables and vtables are R_RISCV_64 words; the exports are named by PCREL_HI20 from _start."""
    kinds = {r.type_name for r in image.relocations}
    assert {"R_RISCV_64", "R_RISCV_PCREL_HI20"} <= kinds
    (step,) = [f for f in program.functions if f.name.endswith("4step")]
    arms = [t for t in program.indirect_targets if step.start < t < step.end]
    assert len(arms) >= 10  # the 12-arm match compiles to a jump table of local targets
    tools = {program.symbol(f"berm_tool_{t}")
             for t in ("format", "classify", "shapes", "check", "numbers", "words", "parse", "atomics")}
    assert tools <= program.function_starts and tools <= program.indirect_targets
    # soft floating point and 128-bit division come from compiler-builtins, float printing from core's flt2dec
    names = {f.name for f in program.functions}
    assert {"__adddf3", "__divdf3", "__muldf3", "__fixdfdi", "__udivti3", "__umodti3", "__divti3"} <= names
    # 8- and 16-bit atomics as masked lr.w/sc.w loops, the 32-bit compare-exchange as lr.w/sc.w, others as AMOs
    ops = {insn.op for insn in program.code.values()}
    assert {"lr.w", "sc.w", "amoswap.d", "amoor.d", "amoxor.w"} <= ops


def _step(acc: int, byte: int) -> int:
    """A Python model of rust-probe's ``step`` (u64 wrapping arithmetic)."""
    arm = byte % 12
    if arm == 0:
        return (acc * 31 + 7) & M64
    if arm == 1:
        return acc ^ 0x5555
    if arm == 2:
        return ((acc << 5) | (acc >> 59)) & M64
    if arm == 3:
        return (acc - byte * 3) & M64
    if arm == 4:
        return acc // 3 + 11
    if arm == 5:
        return (acc + (acc >> 7)) & M64
    if arm == 6:
        return ~acc & 0xFFFF_FFFF
    if arm == 7:
        return ((acc * (acc | 1)) & M64) >> 3
    if arm == 8:
        return bin(acc).count("1") * 1000 + acc % 1000
    if arm == 9:
        return int.from_bytes(acc.to_bytes(8, "little"), "big") >> 32
    if arm == 10:
        return ((acc << (byte % 13)) & M64) ^ 0x77
    return (acc + 0x1234_5678) & M64


def _classify(data: bytes) -> str:
    data = data or bytes(range(48))
    acc = 1
    for b in data:
        acc = _step(acc, b)
    return f"classify({len(data)} bytes) = {acc}"


@pytest.mark.parametrize("tool, args, expected", [
    ("format", b"", 'args="" len=0 hex=0x1000 pad=[    ab] neg=-7 list=[0, 1, 0]'),
    ("format", b"hi", 'args="hi" len=2 hex=0x11fe pad=[    ab] neg=-9 list=[2, 3, 4]'),
    ("classify", b"", _classify(b"")),
    ("classify", bytes(range(256)), _classify(bytes(range(256)))),
    ("shapes", b"", "square:16 rect:15 triangle:21 total:52"),
    ("check", b"abc", "checked 3 bytes"),
], ids=["format", "format-args", "classify", "classify-256", "shapes", "check"])
def test_tools_return_the_expected_text(probe, tool, args, expected):
    harness, logs = probe
    logs.clear()
    assert harness.call(tool, args) == expected
    if tool == "format":
        assert logs == [expected.encode()]


@pytest.mark.parametrize("quoted", [False, True], ids=["bare", "json-string"])
def test_failure_and_panic(probe, quoted):
    """``check`` takes the JSON string its manifest declares (``"panic"``, as ``berm call`` sends it) or the bare
    word; its panic handler records the message with berm.fail before its ebreak, and the trap carries it."""
    harness, _ = probe
    word = '"{}"' if quoted else "{}"
    with pytest.raises(ToolFailure, match="check failed, as requested"):
        harness.call("check", word.format("fail"))
    with pytest.raises(Trap, match="harness trapped in check: guest executed ebreak") as trap:
        harness.call("check", word.format("panic"))
    assert trap.value.kind is TrapKind.BREAKPOINT
    assert trap.value.failure.startswith("rust-probe panicked: asked to panic")
    assert trap.value.info.where.startswith("berm::panic::report+")  # the SDK's handler (harnesses/sdk/rust)
    # the panic's calls are the last instructions of their functions: each caller is named where it called, its
    # Rust name demangled (berm_aot.demangle)
    assert [where.split("+")[0] for _, where in trap.value.info.callers] == [
        "__rustc::rust_begin_unwind", "core::panicking::panic_fmt", "berm_tool_check"]
    assert "(after berm.fail: rust-probe panicked: asked to panic" in str(trap.value)


@pytest.mark.parametrize("text, kept", [
    ("short", 'rust-probe panicked: "short" and 11 more'),
    ("日" * 100, 'rust-probe panicked: "' + "日" * 77 + "…"),  # 253 bytes and "…": 256
    ("é" * 200, 'rust-probe panicked: "' + "é" * 115 + "…"),
    ("a" * 300, 'rust-probe panicked: "' + "a" * 231 + "…"),
    ("a" + "日" * 100, 'rust-probe panicked: "a' + "日" * 76 + "…"),  # the old cut left 2 bytes, which '" ' filled
])
def test_a_long_panic_message_keeps_its_start_and_says_it_was_cut(probe, text, kept):
    """Found by a review: the handler cut each piece of the message at the last whole character that fit, and the
    pieces after one filled the bytes a cut character left ('"日日日日日日日日日日日"|' of 60 characters), so the text
    recorded joined parts of the message that were not next to each other. It keeps the start, ends it with "…", and
    takes nothing more."""
    harness, _ = probe
    with pytest.raises(Trap) as trap:
        harness.call("check", f'"panic:{text}"'.encode())
    assert trap.value.failure == kept
    assert len(kept.encode()) <= 256


def _shortest(value: float) -> Decimal:
    """The shortest decimal that reads back as ``value``, as Rust's flt2dec picks it. Python's ``repr`` has as few
    digits, but of two equally near ``value`` it takes the even one, and Rust the one away from zero:
    600000000000000.25 is "600000000000000.3" in Rust (found by hypothesis in CI; both engines agree)."""
    shortest = Decimal(repr(value))
    away = Decimal(value).quantize(Decimal((0, (1,), shortest.as_tuple().exponent)), rounding=ROUND_HALF_UP)
    return (away if float(away) == value else shortest).normalize()


def _rust_display(value: float) -> str:
    """Rust's ``{}`` of an f64: the shortest digits that read back as ``value`` (``_shortest``), never in exponent
    form, with no ``.0`` for a whole number; ``NaN``, ``inf`` and ``-inf`` as such."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(_shortest(value), "f")


def _rust_lower_exp(value: float) -> str:
    """Rust's ``{:e}`` of an f64: the same shortest digits as ``d.ddde<exponent>``."""
    shortest = _shortest(value)
    digits = "".join(map(str, shortest.as_tuple().digits))
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{'-' if value < 0 else ''}{mantissa}e{shortest.adjusted()}"


def _numbers(arg_len: int) -> str:
    """A Python model of rust-probe's ``numbers``: IEEE double operations in the same order (Python's float is the
    same binary64, every operation correctly rounded, as compiler-builtins' are), 128-bit integers as Python's."""
    n = arg_len + 3
    harmonic = 0.0
    for k in range(1, n + 1):
        harmonic += 1.0 / k
    x = float(n)
    guess = x / 2.0 + 1.0
    for _ in range(12):
        guess = (guess + x / guess) / 2.0
    big = M64 * (n + 7)
    signed = -(big // 13)  # Rust's i128 division truncates toward zero
    back = max(-(1 << 63), min((1 << 63) - 1, math.trunc(signed / 3.0)))  # `as i64` saturates
    return (f"harmonic={harmonic:.6f} sqrt={_rust_display(guess)} seventh={_rust_lower_exp(x / 7.0)} "
            f"scaled={_rust_display(x * 1.5e-3)} big={big} q={big // (n * 1_000_003)} r={big % 97} signed={signed} "
            f"back={back}")


def _words(text: str) -> str:
    """A Python model of rust-probe's ``words``, for text whose letters Python and Rust class alike (``isalnum``
    against Rust's ``is_alphanumeric``) and case-map alike."""
    words = "".join(c if c.isalnum() else " " for c in text).split()
    counts: dict[str, int] = {}
    for word in words:
        counts[word.lower()] = counts.get(word.lower(), 0) + 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))  # str order is UTF-8 byte order
    return f"{len(words)} words, {len(counts)} distinct:" + "".join(f" {w.upper()}={c}" for w, c in ranked[:5])


TEXT = "The cat and the hat. THE END, straße Ärger ärger δέλτα Δέλτα 42 cat"


@pytest.mark.parametrize("tool, args, expected", [
    ("numbers", b"", _numbers(0)),
    ("numbers", b"abcdefg", _numbers(7)),
    ("numbers", bytes(40), _numbers(40)),  # `back` saturates at i64::MIN
    ("words", TEXT.encode(), "14 words, 9 distinct: THE=3 CAT=2 ÄRGER=2 ΔΈΛΤΑ=2 42=1"),
    ("words", b"", "0 words, 0 distinct:"),
], ids=["numbers", "numbers-7", "numbers-saturates", "words", "words-empty"])
def test_soft_floats_wide_integers_and_collections(probe, tool, args, expected):
    harness, _ = probe
    assert harness.call(tool, args) == expected


def test_the_models_read_their_cases_as_written():
    """The models against what the guest printed for ``berm call rust-probe.elf numbers '"abcdefg"'`` (nine bytes
    of arguments, quotes included), for ``words`` of TEXT and for ``atomics``, and the float forms against Rust's
    (a native build of ``format!`` printed them)."""
    assert _words(TEXT) == "14 words, 9 distinct: THE=3 CAT=2 ÄRGER=2 ΔΈΛΤΑ=2 42=1"
    assert _numbers(9).startswith("harmonic=3.103211 sqrt=3.4641016151377544 seventh=1.7142857142857142e0 "
                                  "scaled=0.018000000000000002 big=350488137400481480685 ")
    assert _numbers(40).endswith(f"back={-(1 << 63)}")
    assert _rust_display(3.0) == "3" and _rust_display(1e20) == "100000000000000000000"
    assert _rust_display(1.5e-7) == "0.00000015" and _rust_lower_exp(1500.0) == "1.5e3"
    # berm call rust-probe.elf atomics '"hello, atomics"'
    assert _atomics(b'"hello, atomics"') == "byte=49 half=29406 word=4001130207 double=547608330239"


def test_words_refuses_text_that_is_not_utf8(probe):
    harness, _ = probe
    with pytest.raises(ToolFailure, match="words: the arguments are not UTF-8"):
        harness.call("words", b"caf\xe9")


def test_a_full_heap_ends_in_one_panic_that_says_so(probe):
    """``check "oom"`` fills the heap, then asks it for 64 bytes more. The panic handler formats on the stack: when
    it allocated, the panic for that allocation panicked again inside the handler, and again, until the call depth
    ran out (a stack-exhausted trap in the allocator, the message lost), on both engines."""
    harness, _ = probe
    with pytest.raises(Trap) as trap:
        harness.call("check", b"oom")
    assert trap.value.kind is TrapKind.BREAKPOINT
    assert trap.value.failure == "rust-probe panicked: memory allocation of 64 bytes failed"
    assert [where.split("+")[0] for _, where in trap.value.info.callers][-2:] == ["alloc::alloc::handle_alloc_error",
                                                                                 "berm_tool_check"]


@pytest.fixture(scope="module")
def aot_probe():
    return Engine(kind="aot").load(ELF).harness(name="probe")


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 300))
def test_numbers_matches_its_model_for_any_length(aot_probe, arg_len):
    assert aot_probe.call("numbers", bytes(arg_len)) == _numbers(arg_len)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.text(alphabet="abcxyzABCXYZ019 .,-\nßÄäéÉδΔ", max_size=200))
def test_words_matches_its_model_for_any_text(aot_probe, text):
    assert aot_probe.call("words", text.encode()) == _words(text)


def _atomics(data: bytes) -> str:
    """A Python model of rust-probe's ``atomics`` (one thread: each atomic operation is its plain arithmetic)."""
    byte, half, word, double = 7, 0, 1, 0
    for b in data:
        byte = (byte + b) & 0xFF
        byte ^= ((b << 3) | (b >> 5)) & 0xFF
        half = (max(half, b * 257) - b) & 0xFFFF
        word = (word * 31 + b) & 0xFFFF_FFFF
        double = ((word << 7) | (double >> 3)) & M64
    return f"byte={byte} half={half} word={word} double={double}"


@pytest.mark.parametrize("args", [b"", b'"hello, atomics"', bytes(range(256))], ids=["none", "text", "every-byte"])
def test_atomics_of_every_width(probe, args):
    """Statics start afresh per invocation, so a second call gives the same text."""
    harness, _ = probe
    assert harness.call("atomics", args) == _atomics(args)
    assert harness.call("atomics", args) == _atomics(args)


#: What Rust's ``f64::from_str`` accepts (Python's ``float`` accepts more: underscores, surrounding space).
RUST_FLOAT = re.compile(r"[+-]?(?:(?i:inf|infinity|nan)|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)")


def _rust_max(a: float, b: float) -> float:
    """Rust's ``f64::max`` as rust-probe's build has it: a NaN ignored, and of zeros of both signs +0, whichever
    comes first (IEEE 754-2019's maximumNumber; Python's ``max`` keeps the first: found by hypothesis in CI, both
    engines agree)."""
    if math.isnan(b):
        return a
    if a == b:
        return a if math.copysign(1.0, a) > 0 else b
    return max(a, b)


def _parse(text: str) -> str:
    """A Python model of rust-probe's ``parse``: the same correctly rounded values (Python's ``float``), summed in
    the same order; ``f64::max`` ignores a NaN (``_rust_max``)."""
    parsed = refused = 0
    total, largest = 0.0, -math.inf
    for word in filter(None, re.split(r"[ \t\n\x0c\r]+", text)):  # split_ascii_whitespace: ASCII's only
        if not RUST_FLOAT.fullmatch(word):
            refused += 1
            continue
        x = float(word)
        parsed += 1
        total += x
        largest = _rust_max(largest, x)
    return f"parsed={parsed} refused={refused} sum={_rust_display(total)} largest={_rust_display(largest)}"


NUMBERS = ("1.5 2e3 -0.1 x 1e400 nan 0.1 2.2250738585072011e-308 12345678901234567890123 9007199254740993 "
           "+.5 5. . e5 1e 1_0 -INF Infinity 0x10 4.9e-324 1e-400 -0")


@pytest.mark.parametrize("text", [NUMBERS, "0.1 0.2 0.3", "", "7e22 1e23 8.98846567431158e307 8.98846567431158e307"],
                         ids=["mixed", "tenths", "none", "large"])
def test_float_parsing(probe, text):
    harness, _ = probe
    assert harness.call("parse", text.encode()) == _parse(text)


_DIGITS = st.text(alphabet="0123456789", min_size=1, max_size=30)
_DECIMAL = st.builds(lambda sign, whole, frac, exp: f"{sign}{whole}{frac}{exp}", st.sampled_from(["", "+", "-"]),
                     _DIGITS, st.one_of(st.just(""), st.just("."), _DIGITS.map(lambda d: "." + d)),
                     st.one_of(st.just(""), st.integers(-350, 350).map(lambda e: f"e{e}")))
_WORD = st.one_of(_DECIMAL, _DECIMAL, st.sampled_from(["inf", "-Infinity", "NaN", ".", "e5", "1e", "1_0", "--1"]))


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_WORD, max_size=12))
@example(["600000000000000.2"])  # a tie between the two shortest forms (found by hypothesis in CI): see _shortest
@example(["-0", "0"])  # f64::max of zeros of both signs (found by hypothesis in CI): see _rust_max
@example(["0", "-0"])
def test_float_parsing_matches_its_model_for_any_words(aot_probe, words):
    text = " ".join(words)
    assert aot_probe.call("parse", text.encode()) == _parse(text)
