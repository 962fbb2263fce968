"""The committed Rust harness (harnesses/rust-probe, rebuilt by its build.sh): what rustc and LLVM emit for a
third-party harness reads, analyses and runs, with the same text on every engine."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    assert [t.name for t in manifest.tools] == ["format", "classify", "shapes", "check"]
    assert manifest.usage.startswith("rust-probe exercises")


def test_rustc_code_shapes(image, program):
    """Jump tables and vtables are R_RISCV_64 words; the exports are named by PCREL_HI20 from _start."""
    kinds = {r.type_name for r in image.relocations}
    assert {"R_RISCV_64", "R_RISCV_PCREL_HI20"} <= kinds
    (step,) = [f for f in program.functions if f.name.endswith("4step")]
    arms = [t for t in program.indirect_targets if step.start < t < step.end]
    assert len(arms) >= 10  # the 12-arm match compiles to a jump table of local targets
    tools = {program.symbol(f"berm_tool_{t}") for t in ("format", "classify", "shapes", "check")}
    assert tools <= program.function_starts and tools <= program.indirect_targets


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
    assert trap.value.info.where.startswith("__rustc::rust_begin_unwind+")  # demangled (berm_aot.demangle)
    assert "(after berm.fail: rust-probe panicked: asked to panic" in str(trap.value)
