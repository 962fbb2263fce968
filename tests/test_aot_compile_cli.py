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
