"""Declarations ([[harnesses]] TOML, ABI.md §8): parsing, clear errors naming entry and key, image files and
their pinned digests."""

from __future__ import annotations

import hashlib
import os
import re

import pytest

from berm_host import declaration as decl_mod
from berm_host.declaration import (Declaration, DeclarationError, ImageDigestMismatch, ImageNotFound,
                                   harnesses_dir, load_declarations, parse_declarations, parse_memory)
from tests.bounded import GRACE, ends_within

EXAMPLE = """
model = "something the agent owns"

[[harnesses]]
name = "os"
source = "builtin"
capabilities = ["fs", "exec"]
root = "/home/me/project"
timeout = 30
memory = "16M"
env = { GIT_PAGER = "cat" }

[[harnesses]]
name = "search"
source = "github:crabtalk/search@v0.1.0"
sha256 = "9F2A000000000000000000000000000000000000000000000000000000000000"
capabilities = ["http", "clock"]
hosts = ["bing.com", "*.wikipedia.org"]
"""


def test_parse_the_documented_shape():
    os_, search = parse_declarations(EXAMPLE)
    assert os_ == Declaration(name="os", source="builtin", capabilities=("fs", "exec"), root="/home/me/project",
                              timeout=30.0, memory=16 << 20, env=(("GIT_PAGER", "cat"),))
    assert search.sha256 == "9f2a" + "0" * 60
    assert search.hosts == ("bing.com", "*.wikipedia.org")
    assert search.root is None and search.timeout is None and search.memory is None


def test_no_harnesses_is_an_empty_list():
    assert parse_declarations("model = 'x'\n") == []


def _error(toml: str) -> str:
    with pytest.raises(DeclarationError) as info:
        parse_declarations(toml, "agent.toml")
    return str(info.value)


def test_unknown_key_names_the_entry_and_the_key():
    msg = _error('[[harnesses]]\nname = "os"\ncapabilitys = ["fs"]\n')
    assert 'agent.toml: harnesses[0] \'os\'' in msg and "unknown key 'capabilitys'" in msg


@pytest.mark.parametrize("line, words", [
    ('capabilities = "fs"', "capabilities must be a list of strings"),
    ("capabilities = [1]", "capabilities must be a list of strings"),
    ('capabilities = ["fs", "fs"]', "capabilities lists the same entry twice"),
    ("root = 3", "root must be a string"),
    ('root = "relative/dir"', "root must be an absolute path"),
    ('root = "/tmp\\u0000x"', "root must not contain a NUL character"),  # was a ValueError from realpath
    ('hosts = "a.com"', "hosts must be a list of strings"),
    ('hosts = ["bad host"]', "hosts: bad host entry"),
    ("sha256 = 12", "sha256 must be a string"),
    ('sha256 = "abc"', "sha256 must be 64 hex digits"),
    ('sha256 = ""', "sha256 must be 64 hex digits"),
    ('timeout = "30"', "timeout must be a number"),
    ("timeout = 0", "timeout must be a number"),
    ("timeout = true", "timeout must be a number"),
    ("timeout = 86400.5", "timeout must be a number"),
    ("timeout = 1e9", "timeout must be a number"),
    ('memory = "lots"', 'memory must be a size like "64M"'),
    ('memory = "3M"', "power of two"),
    ("memory = 1024", "power of two"),
    ("source = []", "source must be a string"),
    ('env = "A=1"', "env must be a table"),
    ("env = { A = 1 }", "env 'A' must be a string"),
    ('env = { "A=B" = "1" }', "env 'A=B' must be a string (and its name a plain variable name)"),
    ('env = { A = "x\\u0000y" }', "env 'A' must be a string"),
])
def test_wrong_types_and_values_name_the_entry_and_key(line, words):
    msg = _error(f'[[harnesses]]\nname = "h"\n{line}\n')
    assert "harnesses[0] 'h'" in msg and words in msg


@pytest.mark.parametrize("toml, words", [
    ('[[harnesses]]\nsource = "builtin"\n', "name is required"),
    ('[[harnesses]]\nname = "../escape"\n', "name '../escape' must be"),
    ('[[harnesses]]\nname = ""\n', "must be 1-64"),
    ('[[harnesses]]\nname = ".hidden"\n', "name '.hidden' must be"),
    ('[[harnesses]]\nname = "-rf"\n', "name '-rf' must be"),
    ('[[harnesses]]\nname = "os/../../x"\n', "name 'os/../../x' must be"),  # the image path is {name}.elf
    ('[[harnesses]]\nname = "os\\n"\n', "must be 1-64"),
    (f'[[harnesses]]\nname = "{"n" * 65}"\n', "must be 1-64"),
    ('[[harnesses]]\nname = 5\n', "name must be a string"),
    ('harnesses = "os"\n', "harnesses must be an array of tables"),
    ('harnesses = [1]\n', "harnesses[0]: must be a table"),
    ('[[harnesses]]\nname = "a"\n[[harnesses]]\nname = "a"\n', "harness 'a' is declared twice"),
    ("[[harnesses]\n", "not valid TOML"),
])
def test_structural_errors(toml, words):
    assert words in _error(toml)


@pytest.mark.parametrize("field, words", [
    ({"name": "../x"}, "harness name '../x' must be 1-64"),
    ({"source": None}, "source must be a string"),
    ({"sha256": "A" * 64}, "sha256 must be 64 hex digits (lowercase)"),
    ({"capabilities": "fs"}, "capabilities must be a tuple of strings"),
    ({"capabilities": ("fs", "fs")}, "capabilities lists the same entry twice"),
    ({"root": "relative"}, "root must be an absolute path"),
    ({"root": "/tmp/\0x"}, "root must not contain a NUL character"),
    ({"hosts": ("bad host",)}, "hosts: bad host entry"),
    ({"timeout": -1}, "timeout must be a number of seconds"),
    ({"timeout": float("nan")}, "timeout must be a number of seconds"),
    ({"memory": 3}, "power of two"),
    ({"memory": "64M"}, "memory must be a number of bytes"),
    ({"env": (("A=B", "1"),)}, "env 'A=B' must be a string (and its name a plain variable name)"),
    ({"env": (("A", "1"), ("A", "2"))}, "env names the same variable twice"),
    ({"env": {"A": "1"}}, "env must be a tuple of (name, value) pairs"),
])
def test_a_declaration_made_in_code_meets_the_rules_of_a_declarations_file(field, words):
    """Found by reviews: each rule was checked where a declarations file is read, and a Declaration made in code
    (as the README's embedding example makes one) skipped it; its holes were patched one at a time where the field
    was used. The Declaration checks them all as it is made now."""
    with pytest.raises(DeclarationError, match=re.escape(words)):
        Declaration(**{"name": "h", **field})


def test_limits_and_defaults_of_a_parsed_entry():
    """The longest name, the largest timeout, a root under ~ and env in name order; no source means builtin."""
    h, = parse_declarations(f'[[harnesses]]\nname = "{"n" * 64}"\ntimeout = 86400\nroot = "~/proj"\n'
                            'env = { B = "2", A = "1" }\n')
    assert h == Declaration(name="n" * 64, source="builtin", timeout=86400.0, root="~/proj",
                            env=(("A", "1"), ("B", "2")))
    assert isinstance(h.timeout, float)  # an integer timeout is the same deadline (and image key) as its float


def test_memory_sizes():
    assert parse_memory("64M") == 64 << 20
    assert parse_memory("64MiB") == 64 << 20
    assert parse_memory("64MB") == 64 << 20
    assert parse_memory(" 64M ") == 64 << 20
    assert parse_memory("1G") == 1 << 30
    assert parse_memory("4G") == 4 << 30
    assert parse_memory("64k") == 64 << 10
    assert parse_memory(65536) == 65536
    for bad in ("8G", "32K", "", "64 M M", True, 1.5):
        with pytest.raises(DeclarationError):
            parse_memory(bad)
    with pytest.raises(DeclarationError, match="must be a size"):
        parse_memory("9" * 5000 + "M")  # int() of over 4300 digits is a ValueError, not a DeclarationError


def test_toml_nested_too_deeply_is_a_declaration_error():
    with pytest.raises(DeclarationError, match="nested too deeply"):
        parse_declarations("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "agent.toml")


def test_harnesses_dir_argument_environment_and_default(tmp_path, monkeypatch):
    monkeypatch.delenv("BERM_HARNESSES_DIR", raising=False)
    monkeypatch.setattr(decl_mod.platformdirs, "user_config_dir", lambda app: str(tmp_path / "config" / app))
    assert harnesses_dir() == tmp_path / "config" / "berm" / "harnesses"
    monkeypatch.setenv("BERM_HARNESSES_DIR", str(tmp_path / "env"))
    assert harnesses_dir() == tmp_path / "env"
    assert harnesses_dir(tmp_path / "arg") == tmp_path / "arg"
    assert Declaration(name="os").image_path() == tmp_path / "env" / "os.elf"


def test_image_loads_and_a_pinned_digest_is_verified(tmp_path):
    (tmp_path / "os.elf").write_bytes(b"\x7fELF pretend")
    digest = hashlib.sha256(b"\x7fELF pretend").hexdigest()
    assert Declaration(name="os").load_image(tmp_path) == b"\x7fELF pretend"
    assert Declaration(name="os", sha256=digest).load_image(tmp_path) == b"\x7fELF pretend"
    with pytest.raises(ImageDigestMismatch, match=f"its sha256 is {digest}, the declaration pins 0000"):
        Declaration(name="os", sha256="0" * 64).load_image(tmp_path)
    with pytest.raises(ImageNotFound, match=r"no image at .*missing\.elf \(put one there: berm build DIR -o "):
        Declaration(name="missing").load_image(tmp_path)  # how (found by a review)
    with pytest.raises(DeclarationError, match="sha256 must be 64 hex digits"):  # an empty pin pins nothing
        Declaration(name="os", sha256="")


def test_an_image_that_is_no_regular_file_is_refused_without_reading_it(tmp_path):
    """A FIFO at the image's path once hung the daemon's start and berm-compile --declarations for ever."""
    os.mkfifo(tmp_path / "fifo.elf")
    (tmp_path / "dir.elf").mkdir()
    for name, reason in (("fifo", "is not a regular file"), ("dir", "is a directory, not a harness image")):
        with pytest.raises(ImageNotFound, match=f"harness '{name}': .*{name}.elf.*{reason}"):
            ends_within(GRACE, lambda: Declaration(name=name).load_image(tmp_path))


def test_load_declarations_from_a_file(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text(EXAMPLE)
    assert [d.name for d in load_declarations(path)] == ["os", "search"]
    with pytest.raises(DeclarationError, match="cannot read"):
        load_declarations(tmp_path / "missing.toml")
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(DeclarationError, match="cannot read"):
        load_declarations(path)


def test_an_image_larger_than_its_memory_can_hold_is_refused_without_reading_it(tmp_path, monkeypatch):
    """A declared harness runs in its declared memory (else the default): its file may hold no more than that
    memory plus berm_aot.elf's MAX_UNLOADED_BYTES (lowered here to 4 KiB), judged from its size before it is read
    (the file is sparse)."""
    from berm_aot import elf

    monkeypatch.setattr(elf, "MAX_UNLOADED_BYTES", 4096)
    limit = (64 << 10) + 4096
    with open(tmp_path / "os.elf", "wb") as f:
        f.truncate(limit + 1)
    with pytest.raises(ImageNotFound, match=f"is {limit + 1} bytes, larger than any image read here \\({limit} bytes"):
        Declaration(name="os", memory=64 << 10).load_image(tmp_path)
    assert len(Declaration(name="os", memory=128 << 10).load_image(tmp_path)) == limit + 1


def test_a_declarations_file_is_a_regular_file_of_bounded_size(tmp_path):
    """Found by a review: a FIFO given as the declarations file kept berm serve and berm-compile waiting for ever."""
    os.mkfifo(tmp_path / "fifo.toml")
    with pytest.raises(DeclarationError, match="fifo.toml: it is not a regular file"):
        ends_within(GRACE, lambda: load_declarations(tmp_path / "fifo.toml"))
    with open(tmp_path / "big.toml", "wb") as f:
        f.truncate(decl_mod.MAX_DECLARATIONS_BYTES + 1)
    with pytest.raises(DeclarationError, match="big.toml: it is [0-9]+ bytes \\(at most 4 MiB\\)"):
        load_declarations(tmp_path / "big.toml")


def test_an_integer_too_long_to_read_is_a_declaration_error(tmp_path):
    """Found by a review: an integer of more than 4,300 digits, anywhere in the file, was a ValueError traceback
    from berm serve and berm-compile (Python's limit on reading integers), naming neither file nor line."""
    with pytest.raises(DeclarationError, match="agent.toml: not valid TOML: Exceeds the limit"):
        parse_declarations("agent_setting = " + "9" * 5000 + "\n", "agent.toml")


@pytest.mark.parametrize("env, reason", [
    ('BIG = "' + "x" * 200_000 + '"', "env: environment variable 'BIG' is longer than 131072 bytes"),
    ("".join(f'V{i} = "{"x" * 100_000}"\n' for i in range(11)), "env: the environment is larger than 1048576 bytes"),
    ('"NOT A NAME" = "x"', "env 'NOT A NAME' must be a string"),
    ('"A\\nB" = "x"', "env 'A\\\\nB' must be a string"),
])
def test_a_declared_environment_is_checked_as_exec_checks_it(env, reason):
    """Found by a review: a value over exec's limit passed here, and stopped the daemon's start with an error naming
    no harness; a name that is no variable name passed though the error text promises one."""
    with pytest.raises(DeclarationError, match=f"harnesses\\[0\\] 'h': {reason}"):
        parse_declarations(f'[[harnesses]]\nname = "h"\n[harnesses.env]\n{env}\n', "agent.toml")


@pytest.mark.parametrize("host", ["api.example.com:8443", "1:2:3", "[1:2:3]", "*.example.com:80"])
def test_a_host_entry_with_a_port_is_refused(host):
    """Found by a review: ``api.example.com:8443`` was accepted and matched nothing, so the harness's http grant
    reached nothing, silently. IPv6 addresses keep their colons."""
    with pytest.raises(DeclarationError, match="no port may be listed"):
        parse_declarations(f'[[harnesses]]\nname = "h"\nhosts = ["{host}"]\n', "agent.toml")
    assert parse_declarations('[[harnesses]]\nname = "h"\nhosts = ["::1", "[fe80::1]"]\n', "a")[0].hosts


def test_a_declaration_made_in_code_cannot_name_an_image_outside_the_directory(tmp_path):
    """Found by a review: a Declaration built directly (as the README's embedding example does) with the name
    ``../outside`` read ``outside.elf`` beside the harnesses directory."""
    (tmp_path / "outside.elf").write_bytes(b"not an image")
    (tmp_path / "harnesses").mkdir()
    with pytest.raises(DeclarationError, match="harness name '../outside' must be 1-64 of"):
        Declaration(name="../outside").load_image(tmp_path / "harnesses")


@pytest.mark.skipif(os.geteuid() != 0, reason="becomes another user to be refused a directory")
def test_an_image_in_a_directory_that_may_not_be_searched_is_not_said_to_be_missing(tmp_path):
    """Found by a review: os.path.lexists says False for a path it may not look at, so an image behind a directory
    the user may not search was reported missing ("put one there"), not refused with the reason."""
    (tmp_path / "os.elf").write_bytes(b"\x7fELF pretend")
    tmp_path.chmod(0o700)  # root's: another user may not search it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # never back into the test runner
        try:
            os.close(read)
            os.setuid(65534)
            try:
                Declaration(name="os").load_image(tmp_path)
                said = b"loaded"
            except ImageNotFound as exc:
                said = str(exc).encode()
            os.write(write, said)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    assert "Permission denied" in said and "no image at" not in said, said
