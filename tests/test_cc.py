"""The C compiler driver (berm_aot/cc.py): units compile in parallel into one shared object, a unit that does not
compile is a CompileError naming it, and a generator of units is compiled as it goes — the first unit's compile
has finished before the generator is asked for the second (the translation overlaps the compiles)."""

from __future__ import annotations

import ctypes
import time

import pytest

from berm_aot import cc
from berm_aot.errors import CompileError


def unit(k: int) -> str:
    return f"__attribute__((visibility(\"default\"))) int answer{k}(void) {{ return {k} * 7; }}\n"


@pytest.mark.parametrize("jobs", [1, 2])
def test_units_compile_into_one_object(tmp_path, jobs):
    out = tmp_path / "lib.so"
    cc.compile_shared([unit(k) for k in range(5)], out, jobs=jobs)
    lib = ctypes.CDLL(str(out))
    assert [getattr(lib, f"answer{k}")() for k in range(5)] == [0, 7, 14, 21, 28]


def test_a_unit_that_does_not_compile_is_named(tmp_path):
    with pytest.raises(CompileError, match=r"cc failed on unit2\.c"):
        cc.compile_shared([unit(0), unit(1), "int broken( {\n", unit(3)], tmp_path / "lib.so")
    assert not (tmp_path / "lib.so").exists()
    assert not list(tmp_path.glob("berm-cc-*"))  # the work directory is gone


def test_a_generator_is_compiled_as_it_goes(tmp_path):
    def units():
        yield unit(0)
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("berm-cc-*/unit0.o")):  # unit 0 compiles while this generator waits
            assert time.monotonic() < deadline, "unit 0 did not compile before unit 1 was asked for"
            time.sleep(0.01)
        yield unit(1)

    out = tmp_path / "lib.so"
    cc.compile_shared(units(), out, jobs=2)
    assert ctypes.CDLL(str(out)).answer1() == 7
