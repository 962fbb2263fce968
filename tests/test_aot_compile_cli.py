"""``berm-compile``: compiles images into the cache (then reports them cached), and fails clearly on a bad file."""

from __future__ import annotations

from berm_cli.compile import main
from berm_host.engine import Engine
from tests.guests import guest_elf

SOURCE = "unsigned long v;\nunsigned long inc(unsigned long x) { return x + 1 + v; }\nvoid _start(void) {}\n"


def test_compile_then_cached(tmp_path, capsys):
    elf = tmp_path / "inc.elf"
    elf.write_bytes(guest_elf(SOURCE, keep=("inc",)))
    cache = tmp_path / "cache"
    assert main([str(elf), "--cache-dir", str(cache), "--jobs", "1"]) == 0
    first = capsys.readouterr().out
    image = Engine(cache_dir=cache).load(elf)
    assert image.digest[:16] in first and "compiled in" in first and "object" in first
    assert image.backend.compiled is False  # berm-compile filled the cache the engine reads
    assert main([str(elf), "--cache-dir", str(cache)]) == 0
    assert "cached" in capsys.readouterr().out


def test_bad_inputs(tmp_path, capsys):
    junk = tmp_path / "junk.elf"
    junk.write_bytes(b"not an elf at all")
    assert main([str(junk), str(tmp_path / "missing.elf"), "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "junk.elf" in err and "missing.elf" in err


def test_memory_size_is_part_of_what_is_compiled(tmp_path, capsys):
    """Translated code is specialised to its memory size: ``--memory`` compiles what an engine with that size loads,
    and an engine with another size compiles its own object rather than running code built for other memory."""
    elf = tmp_path / "inc.elf"
    elf.write_bytes(guest_elf(SOURCE, keep=("inc",)))
    cache = tmp_path / "cache"
    assert main([str(elf), "--cache-dir", str(cache), "--memory", "16M"]) == 0
    capsys.readouterr()
    small = Engine(cache_dir=cache, memory_size=16 << 20).load(elf)
    assert small.backend.compiled is False
    default = Engine(cache_dir=cache).load(elf)
    assert default.backend.compiled is True and default.backend.object_path != small.backend.object_path


def test_bad_memory_size(tmp_path, capsys):
    elf = tmp_path / "inc.elf"
    elf.write_bytes(guest_elf(SOURCE, keep=("inc",)))
    assert main([str(elf), "--cache-dir", str(tmp_path), "--memory", "3M"]) == 2
    assert "power of two" in capsys.readouterr().err
