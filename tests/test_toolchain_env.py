"""The guest toolchain (berm_sdk/toolchain.py) runs without the environment variables through which clang would
change its output: SDK objects, the compiler runtime and bundled images are cached under keys that do not cover
the environment."""

from __future__ import annotations

import pytest

from berm_sdk.toolchain import ToolchainError, compile_object


@pytest.mark.parametrize("name, value", [("CCC_OVERRIDE_OPTIONS", "+-DLEAKED"), ("CPATH", "poisoned")])
def test_the_guest_compilers_environment_cannot_change_an_object(tmp_path, monkeypatch, name, value):
    """Found by a review: with CCC_OVERRIDE_OPTIONS=+-O0 in its environment (clang edits its command line by it), the
    first process to build the SDK's objects and a bundled image built them unoptimised, under the same cache keys
    as every other process's."""
    poisoned = tmp_path / "poisoned"
    poisoned.mkdir()
    (poisoned / "stdint.h").write_text('#error "the compiler read an include path from the environment"\n')
    source = tmp_path / "guest.c"
    source.write_text('#include <stdint.h>\n#ifdef LEAKED\n#error "the compiler read CCC_OVERRIDE_OPTIONS"\n#endif\n'
                      "uint64_t answer(void) { return 42; }\n")
    monkeypatch.setenv(name, str(poisoned) if value == "poisoned" else value)
    try:
        compile_object(source, tmp_path / "guest.o")
    except ToolchainError as exc:
        pytest.fail(str(exc))
    assert (tmp_path / "guest.o").stat().st_size > 0
