"""``berm-compile``: compiles images into the cache (then reports them cached), and fails clearly on a bad file."""

from __future__ import annotations

import pytest

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
    """Each line says berm-compile's name and names its image once, as given: two images of one name in two
    directories were both "h.elf" (found by a review)."""
    (tmp_path / "a").mkdir()
    junk = tmp_path / "a" / "h.elf"
    junk.write_bytes(b"not an elf at all")
    assert main([str(junk), str(tmp_path / "h.elf"), "--cache-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"berm-compile: {junk}: not an ELF file (bad magic)",
        f"berm-compile: cannot read {tmp_path / 'h.elf'}: No such file or directory"]


def test_file_names_are_printed_with_control_characters_escaped(tmp_path, capsys):
    """A package's file name reached the terminal raw (ESC and BEL included)."""
    junk = tmp_path / "x\x1b]52;c;cHduZWQ=\x07.elf"
    junk.write_bytes(b"not an elf at all")
    assert main([str(junk), "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "x\\x1b]52;c;cHduZWQ=\\x07.elf" in err


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


def _declared(tmp_path, pins: dict[str, str]) -> tuple:
    """Two harness images in a harnesses directory and a declarations file: ``small`` with 16M of memory, ``plain``
    with none (so the default), each pinned to the digest ``pins`` gives (else its own)."""
    import hashlib

    harnesses = tmp_path / "harnesses"
    harnesses.mkdir()
    table = []
    for k, (name, extra) in enumerate((("small", 'memory = "16M"\n'), ("plain", ""))):
        data = guest_elf(SOURCE.replace("x + 1", f"x + {k + 2}"), keep=("inc",))
        (harnesses / f"{name}.elf").write_bytes(data)
        pin = pins.get(name, hashlib.sha256(data).hexdigest())
        table.append(f'[[harnesses]]\nname = "{name}"\nsha256 = "{pin}"\n{extra}')
    toml = tmp_path / "agent.toml"
    toml.write_text("\n".join(table))
    return harnesses, toml


def test_declarations_compile_every_harness_for_its_own_memory(tmp_path, capsys):
    harnesses, toml = _declared(tmp_path, {})
    cache = tmp_path / "cache"
    # --memory is for the ELFs named: a harness that declares none runs with the daemon's default, 64M
    assert main(["--declarations", str(toml), "--harnesses-dir", str(harnesses), "--cache-dir", str(cache),
                 "--memory", "16M"]) == 0
    out = capsys.readouterr().out
    assert "small: " in out and "memory 16,384 KiB" in out and "plain: " in out and "memory 65,536 KiB" in out
    # what the daemon loads for each (its declared memory, else the default) is already compiled
    assert Engine(cache_dir=cache, memory_size=16 << 20).load(harnesses / "small.elf").backend.compiled is False
    assert Engine(cache_dir=cache).load(harnesses / "plain.elf").backend.compiled is False
    assert Engine(cache_dir=cache).load(harnesses / "small.elf").backend.compiled is True


def test_declarations_refuse_an_image_that_is_not_the_pinned_one(tmp_path, capsys):
    harnesses, toml = _declared(tmp_path, {"small": "0" * 64})
    (harnesses / "plain.elf").unlink()
    assert main(["--declarations", str(toml), "--harnesses-dir", str(harnesses), "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "berm-compile: harness 'small': refusing" in err and "berm-compile: harness 'plain': no image at" in err


def test_nothing_to_compile_is_a_usage_error(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2 and "--declarations" in capsys.readouterr().err


def test_a_file_larger_than_its_memory_can_hold_is_refused_unread(tmp_path, capsys, monkeypatch):
    """Each image is read for the memory it is compiled for: no more than that memory plus berm_aot.elf's
    MAX_UNLOADED_BYTES (lowered here to 4 KiB), judged from the file's size (a sparse file)."""
    from berm_aot import elf

    monkeypatch.setattr(elf, "MAX_UNLOADED_BYTES", 4096)
    big = tmp_path / "big.elf"
    with open(big, "wb") as f:
        f.truncate((64 << 10) + 4097)
    assert main([str(big), "--cache-dir", str(tmp_path), "--memory", "64K"]) == 2
    assert f"larger than any image read here ({(64 << 10) + 4096} bytes at most" in capsys.readouterr().err


def test_the_help_is_plain_text(capsys):
    """It showed the module docstring's reST markup (``berm-compile [ELF...]``): a newcomer's walkthrough."""
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "Translate and compile images into the code cache" in out and "``" not in out


@pytest.mark.parametrize("with_a_bad_image", [False, True])
def test_output_that_cannot_be_written_stops_no_compile(tmp_path, with_a_bad_image):
    """Found by a review: with stdout on /dev/full (or closed, as some install hooks run it), the first image's line
    failed and ended the run: the other images were not compiled, and a failed image's status 2 was lost."""
    import subprocess
    import sys

    elves = []
    for k in range(3):
        elves.append(tmp_path / f"inc{k}.elf")
        elves[-1].write_bytes(guest_elf(SOURCE.replace("1 + v", f"{k + 1} + v"), keep=("inc",)))
    bad = [str(tmp_path / "missing.elf")] if with_a_bad_image else []
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "berm_cli.compile", *map(str, elves), *bad, "--cache-dir",
                               str(tmp_path / "cache")], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == (2 if with_a_bad_image else 1), done.stderr
    assert done.stderr.endswith("No space left on device\n" if not with_a_bad_image else "No such file or directory\n")
    assert [Engine(cache_dir=tmp_path / "cache").load(elf).backend.compiled for elf in elves] == [False] * 3
