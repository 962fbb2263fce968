"""The generated berm_calls.h: every number, compiled by a C compiler, equals FNV-1a 64 of its name."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

from berm_abi.names import CAPABILITY_CALLS, CORE_CALLS
from berm_sdk.header import calls_header, write_calls_header


def fnv1a64(data: bytes) -> int:
    """An independent FNV-1a 64 (ABI.md §1), so the test does not trust the code it checks."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


def test_reference_fnv_matches_the_abi_check_value():
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


def test_compiled_numbers_equal_fnv_of_the_names(tmp_path):
    calls = CORE_CALLS + CAPABILITY_CALLS
    write_calls_header(tmp_path)
    src = tmp_path / "numbers.c"
    src.write_text('#include "berm_calls.h"\n'
                   "const unsigned long long numbers[] = {"
                   + ", ".join(f"BERM_CALL_{c.c_name}" for c in calls) + "};\n")
    lib = tmp_path / "numbers.so"
    subprocess.run([shutil.which("cc"), "-shared", "-fPIC", f"-I{tmp_path}", str(src), "-o", str(lib)], check=True)
    numbers = (ctypes.c_ulonglong * len(calls)).in_dll(ctypes.CDLL(str(lib)), "numbers")
    assert {c.name: n for c, n in zip(calls, numbers)} == {c.name: fnv1a64(c.name.encode()) for c in calls}


def test_the_header_defines_exactly_the_abi_names():
    defined = re.findall(r"#define BERM_CALL_(\w+) 0x([0-9a-f]{16})ULL", calls_header())
    assert [name for name, _ in defined] == [c.c_name for c in CORE_CALLS + CAPABILITY_CALLS]
    assert ("LOG", "718e2c830194e059") in defined  # the number ABI.md §1 prints for berm.log
