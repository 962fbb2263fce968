"""The code cache: a hit after a miss, corrupt or truncated entries rebuilt, every code-generation input in the
key, and two processes compiling the same image at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from berm_aot.cache import SO_NAME, CodeCache
from berm_aot.elf import read_elf
from berm_aot.program import Program
import berm_aot
from berm_host.aot.objects import cached_object, object_key, source_digest, translator_digest
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.layout import layout_for
from tests.guests import guest_elf

SOURCE = "unsigned long v;\nunsigned long triple(unsigned long x) { return 3 * x + v; }\nvoid _start(void) {}\n"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def elf():
    return guest_elf(SOURCE, keep=("triple",))


def windows(image):
    return layout_for(image).windows()


def triple(engine: Engine, elf: bytes) -> int:
    image = engine.load(elf)
    return image.backend.run(RunRequest(entry=image.program.symbol("triple"), int_args=(14,))).a0


def test_every_translator_module_is_in_the_key(tmp_path):
    """Editing any module of the translator, or adding one, changes the key: a listed subset of modules once left
    the sp-group, stack-pointer and dataflow analyses out, so editing them reused stale objects."""
    import shutil
    package = Path(berm_aot.__file__).resolve().parent
    copy = tmp_path / "berm_aot"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert source_digest(copy) == translator_digest()
    seen = {source_digest(copy)}
    for module in sorted(copy.rglob("*.py")):
        module.write_bytes(module.read_bytes() + b"\n# edited\n")
        seen.add(source_digest(copy))
    (copy / "emit" / "new_pass.py").write_text("X = 1\n")
    seen.add(source_digest(copy))
    assert len(seen) == len(list(package.rglob("*.py"))) + 2


def test_hit_after_miss(tmp_path, elf):
    image = read_elf(elf)
    cache = CodeCache(tmp_path)
    first, built = cached_object(image, windows(image), cache, lambda: Program.from_image(image))
    assert built
    second, built = cached_object(image, windows(image), cache, lambda: pytest.fail("a hit needs no program"))
    assert not built and second == first
    assert Engine(cache_dir=tmp_path).load(elf).backend.compiled is False
    assert triple(Engine(cache_dir=tmp_path), elf) == 42


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_digest", "digest_not_text"])
def test_corrupt_entry_is_rebuilt(tmp_path, elf, damage):
    image = read_elf(elf)
    program = lambda: Program.from_image(image)  # noqa: E731
    cache = CodeCache(tmp_path)
    so, _ = cached_object(image, windows(image), cache, program)
    data = so.read_bytes()
    if damage == "truncate":
        so.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        so.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "delete_digest":
        (so.parent / (SO_NAME + ".sha256")).unlink()
    else:  # not UTF-8: read_text raised UnicodeDecodeError out of Engine.load
        (so.parent / (SO_NAME + ".sha256")).write_bytes(b"\xff\xfe")
    assert cache.lookup(object_key(image, windows(image))) is None
    again, built = cached_object(image, windows(image), cache, program)
    assert built
    assert cache.lookup(object_key(image, windows(image))) == again


def test_key_covers_compiler_flags(monkeypatch, elf):
    image = read_elf(elf)
    plain = object_key(image, windows(image))
    monkeypatch.setenv("BERM_CFLAGS", "-O2")
    assert object_key(image, windows(image)) != plain
    assert object_key(image, windows(image), prefix="p_") != object_key(image, windows(image))


def test_env_overrides_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("BERM_CACHE_DIR", str(tmp_path / "env"))
    assert CodeCache().root == tmp_path / "env"


def test_two_processes_compile_the_same_image(tmp_path, elf):
    elf_path = tmp_path / "g.elf"
    elf_path.write_bytes(elf)
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from berm_aot.cache import CodeCache
        from berm_aot.elf import read_elf
        from berm_aot.program import Program
        from berm_host.aot.objects import cached_object
        from berm_host.layout import layout_for
        image = read_elf(open({str(elf_path)!r}, 'rb').read())
        path, built = cached_object(image, layout_for(image).windows(), CodeCache({str(tmp_path / 'cache')!r}),
                                    lambda: Program.from_image(image), jobs=1)
        print(int(built), path)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    built = sorted(int(o[0].split()[0]) for o in outs)
    paths = {o[0].split()[1] for o in outs}
    assert built == [0, 1]  # the second waited on the lock and found the first's entry
    assert len(paths) == 1
    assert triple(Engine(cache_dir=tmp_path / "cache"), elf) == 42


def test_the_headers_translated_code_needs_ship_with_the_package():
    """A wheel holds only the package data pyproject.toml names: every header the translated code is compiled
    against must match it (a wheel built without them could translate nothing)."""
    import fnmatch
    import tomllib

    from berm_host.aot.objects import HEADERS

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["berm_host"]
    package = ROOT / "berm_host"
    for header in HEADERS:
        name = str(header.relative_to(package))
        assert any(fnmatch.fnmatch(name, g) for g in globs), f"{name} is not in berm_host's package data"
