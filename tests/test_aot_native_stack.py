"""The native stack translated code runs on (berm_host/aot/native_stack.c): its floor keeps room for the object's
largest C frame, since a function's entry check runs once its frame is allocated, and gcc writes spill slots into
that frame before the check. A frame larger than the room left below the floor would write past the stack's guard
(SIGSEGV, or silently into the mapping below it). The compile step measures the largest frame (-fstack-usage,
berm_aot/cc.py) and the object carries it (berm_max_frame)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

from berm_aot import cc
from berm_aot.errors import CompileError
from berm_host.aot.runtime import Region, lib
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.layout import MAX_CALL_DEPTH
from berm_host.traps import HostError
from tests.guests import raw_harness_elf

ROOT = Path(__file__).resolve().parent.parent
LOOPS = 120  # counted loops in one function: each adds group flags and live values, and the C frame grows


def _big_frame_elf() -> bytes:
    """down_a and down_b call each other (each call a native frame) to depth a1; down_a's body is LOOPS counted
    loops copying between four buffers, which gives its translation a C frame of several KiB."""
    body = []
    for i in range(LOOPS):
        k = 8 * (i % 100)
        body += ["li t0, 0", "li t1, 16", f"L{i}:", f"ld t2, {k}(a2)", f"sd t2, {k + 8}(a3)", f"ld t3, {k}(a4)",
                 f"sd t3, {k + 8}(a5)", "addi t0, t0, 1", f"bne t0, t1, L{i}"]
    asm = [".text", ".globl down_a", "down_a:", "bgeu a0, a1, Ldone", "addi sp, sp, -16", "sd ra, 8(sp)", *body,
           "addi a0, a0, 1", "call down_b", "ld ra, 8(sp)", "addi sp, sp, 16", "ret", "Ldone:", "li a0, 0", "ret",
           ".globl down_b", "down_b:", "addi sp, sp, -16", "sd ra, 8(sp)", "addi a0, a0, 1", "call down_a",
           "ld ra, 8(sp)", "addi sp, sp, 16", "ret", ""]
    source = "u64 buf[256];\nPair berm_tool_t(void) { Pair p = {0, 0}; return p; }\n__asm__(\"" + "\\n".join(asm) + "\");\n"
    return raw_harness_elf(source, ("t",), opt="-O1", keep=("down_a", "down_b", "buf"))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def image(cache_dir):
    return Engine(kind="aot", memory_size=1 << 20, cache_dir=cache_dir).load(_big_frame_elf())


def test_the_floor_keeps_room_for_the_largest_frame(image):
    code = image.backend.memory.code
    assert code.frame > 1024  # the counted loops really made a large frame
    region = image.backend.memory.acquire()
    assert region.ptr.ctx.native_floor == region.ptr.native.lo + lib.BERM_NATIVE_MARGIN + 2 * code.frame


def _recurse_to_a_small_floor(cache_dir: str, margin: int) -> dict:
    """In a child: the region's floor moved down to leave only ``margin`` bytes besides two of the largest frames
    (berm_region_code; the real margin is 64 KiB, and frames that large take long to compile: the same situation, scaled), then the
    recursion runs until it reaches it."""
    image = Engine(kind="aot", memory_size=1 << 20, cache_dir=Path(cache_dir)).load(_big_frame_elf())
    memory = image.backend.memory
    region = memory.acquire()
    region.ptr.ctx.native_floor = region.ptr.native.lo + margin + 2 * memory.code.frame
    memory.release(region)
    buf = image.program.symbol("buf")
    r = image.backend.run(RunRequest(entry=image.program.symbol("down_a"),
                                     int_args=(0, MAX_CALL_DEPTH - 2, buf, buf, buf, buf)))
    return {"trap": r.trap and r.trap.kind.name, "detail": r.trap and r.trap.detail}


def test_recursion_through_large_frames_to_the_floor_is_a_trap(image, cache_dir):
    """Nothing but the frame term is left below the floor (plus 512 bytes for the trap path): the recursion ends in
    the native-stack trap, in a live process. With the frame measured as 0 the same run dies with SIGSEGV."""
    code = ("import json; from tests.test_aot_native_stack import _recurse_to_a_small_floor as f; "
            f"print(json.dumps(f({str(cache_dir)!r}, 512)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"the host died (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"trap": "STACK_EXHAUSTED", "detail": "the native stack translated code runs on is exhausted"}


def test_a_frame_too_large_for_the_native_stack_is_refused(image):
    memory = image.backend.memory
    code = memory.code
    memory.code = code._replace(frame=lib.BERM_NATIVE_STACK // 8 + 1)
    try:
        with pytest.raises(HostError, match="native stack frames of"):
            Region(memory)
    finally:
        memory.code = code


def test_every_object_carries_its_largest_frame(tmp_path):
    """compile_shared defines berm_max_frame: gcc's largest reported frame plus the slack for the red zone."""
    out = tmp_path / "lib.so"
    cc.compile_shared(["int small(int x) { return x + 1; }",
                       "int big(int x) { volatile char b[5000]; b[0] = x; b[4999] = x; return b[0] + b[4999]; }"],
                      out)
    frame = ctypes.c_ulonglong.in_dll(ctypes.CDLL(str(out)), cc.FRAME_SYMBOL).value
    assert 5000 <= frame <= 5000 + 2 * cc.FRAME_SLACK  # the buffer, what else the frame holds, the slack


@pytest.mark.parametrize("report, worst", [
    ("a.c:1:5:f\t200\tstatic\na.c:9:5:g\t8\tstatic\n", 200),
    ("a.c:1:5:f\t48\tstatic\na.c:9:5:g\t4096\tdynamic,bounded\n", 4096),
    ("", 0),
])
def test_worst_frame_reads_gccs_reports(tmp_path, report, worst):
    (tmp_path / "u.su").write_text(report)
    assert cc.worst_frame([tmp_path / "u.su"]) == worst


def test_an_unbounded_frame_or_a_missing_report_is_a_compile_error(tmp_path):
    (tmp_path / "u.su").write_text("a.c:1:5:f\t32\tdynamic\n")
    with pytest.raises(CompileError, match="a dynamic stack frame cannot be bounded"):
        cc.worst_frame([tmp_path / "u.su"])
    with pytest.raises(CompileError, match="no stack usage report"):
        cc.worst_frame([tmp_path / "missing.su"])
    (tmp_path / "u.su").write_text("a.c:1:5:f 32 static\n")
    with pytest.raises(CompileError, match="not a stack usage report line"):
        cc.worst_frame([tmp_path / "u.su"])
