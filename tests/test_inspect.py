"""``berm inspect``: the manifest, exports, requests and image facts of a harness, as text and as JSON."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from berm_aot.elf import read_elf
from berm_cli.main import main
from tests.elf_samples import dispatch_elf, harness_elf, manifest_json


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    data = harness_elf(manifest_json(["read", "write"], capabilities=["fs"], hosts=["api.example.com"]),
                       ["read", "write", "extra"])
    path = tmp_path_factory.mktemp("inspect") / "h.elf"
    path.write_bytes(data)
    return path, data


def _exports(data):
    return {s.name[len("berm_tool_"):]: s.value for s in read_elf(data).symbols if s.name.startswith("berm_tool_")}


def test_text(harness, capsys):
    path, data = harness
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    exports = _exports(data)
    assert hashlib.sha256(data).hexdigest() in out and f"{len(data)} bytes" in out
    assert "ABI version 0" in out
    assert f"read @ {exports['read']:#x}: the read tool" in out
    assert f"extra @ {exports['extra']:#x}: exported, not declared" in out
    assert '"properties": {"x": {"type": "string"}}' in out
    assert "Call the tools." in out
    assert "capabilities: fs" in out and "hosts: api.example.com" in out
    text = [s for s in read_elf(data).sections if s.name == ".text"][0]
    assert ".text" in out and f"{text.addr:#010x}" in out and "r-x" in out
    assert "R_RISCV_PCREL_HI20" in out


def test_a_file_name_that_is_not_utf8_is_shown_escaped(harness, tmp_path, capsys):
    """Found by a review: the name reached print() as a lone surrogate, and berm inspect ended in UnicodeEncodeError
    on a UTF-8 terminal (pytest's capture is as strict)."""
    path = tmp_path / os.fsdecode(b"caf\xe9.elf")
    path.write_bytes(harness[1])
    declaration = tmp_path / os.fsdecode(b"d\xe9.toml")
    declaration.write_text('[[harnesses]]\nname = "caf"\ncapabilities = ["fs"]\nroot = "/"\n')
    assert main(["inspect", str(path), "--declaration", str(declaration), "--harness", "caf"]) == 0
    out = capsys.readouterr().out
    assert "caf\\xe9.elf" in out and "grants (from " + str(tmp_path) + "/d\\xe9.toml):" in out


def test_json(harness, capsys):
    path, data = harness
    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["abi_version"] == 0 and [t["name"] for t in doc["tools"]] == ["read", "write"]
    assert doc["capabilities"] == ["fs"] and doc["usage"] == "Call the tools."
    img = doc["image"]
    assert img["sha256"] == hashlib.sha256(data).hexdigest() and img["file_size"] == len(data)
    assert img["exports"] == _exports(data)
    image = read_elf(data)
    assert [(s["vaddr"], s["memsz"]) for s in img["segments"]] == [(s.vaddr, s.memsz) for s in image.segments]
    assert any(s["perms"] == "r-x" for s in img["segments"])
    counts = {}
    for r in image.relocations:
        counts[r.type_name] = counts.get(r.type_name, 0) + 1
    assert img["relocations"] == counts


@pytest.mark.parametrize("content, message", [
    (b"not an elf at all", "not an ELF file"),
    (None, "no .berm.abi section"),
])
def test_bad_images_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "bad.elf"
    path.write_bytes(dispatch_elf() if content is None else content)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("berm inspect: ") and message in err


def test_output_that_cannot_be_written_exits_1_with_a_line(harness):
    """Found by a review: a full disk (here /dev/full) under stdout was an OSError traceback in every command."""
    import subprocess
    import sys

    path, _ = harness
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "berm_cli.main", "inspect", str(path), "--json"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == "berm: cannot write its output: No space left on device\n"


def _declared(tmp_path, entry: str):
    toml = tmp_path / "agent.toml"
    toml.write_text(f'[[harnesses]]\nname = "h"\n{entry}\n')
    return str(toml)


def test_grants_are_shown_as_text_the_manifest_cannot_forge(tmp_path, capsys):
    """Found by a review: requested capability names were printed as they came, so a request named
    "exec: linked" plus a newline forged a grant line, and control characters reached the terminal."""
    data = harness_elf(manifest_json(["read"], capabilities=["clock", "exec: linked\n  fs: linked", "\x1b[2Jkv"]),
                       ["read"])
    (tmp_path / "h.elf").write_bytes(data)
    toml = _declared(tmp_path, 'capabilities = ["clock"]')
    assert main(["inspect", str(tmp_path / "h.elf"), "--declaration", toml]) == 0
    grants = capsys.readouterr().out.split("grants (from")[1].splitlines()[1:]
    assert grants == ["  clock: linked", "  exec: linked\\x0a  fs: linked: not granted (requested)",
                      "  \\x1b[2Jkv: not granted (requested)"]


def test_the_daemons_grants_are_shown_as_berm_serve_links_them(tmp_path, capsys):
    """Found by a review: ``schedule`` and ``call`` were reported "absent: this host does not know it", though berm
    serve links them (berm.call reaches the tools of every declared harness)."""
    from berm_host.daemon import _queue_grants
    from berm_host.grants import DAEMON_GRANTS

    assert sorted(_queue_grants(None)) == sorted(DAEMON_GRANTS)  # what inspect reports is what the daemon serves
    data = harness_elf(manifest_json(["read"], capabilities=["schedule"]), ["read"])
    (tmp_path / "h.elf").write_bytes(data)
    toml = _declared(tmp_path, 'capabilities = ["schedule", "call", "nope"]')
    assert main(["inspect", str(tmp_path / "h.elf"), "--declaration", toml]) == 0
    grants = capsys.readouterr().out.split("grants (from")[1].splitlines()[1:]
    assert grants == ["  schedule: linked by berm serve", "  call: linked by berm serve (not requested)",
                      "  nope: absent: this host does not know it (not requested)"]


def test_json_grants_are_the_hosts_not_the_manifests(tmp_path, capsys):
    """Found by a review: a manifest key named "grants" showed in inspect --json as the host's grant report."""
    data = harness_elf(manifest_json(["read"], grants={"fs": "linked"}), ["read"])
    (tmp_path / "h.elf").write_bytes(data)
    assert main(["inspect", str(tmp_path / "h.elf"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["grants"] is None


def test_grants_of_an_entry_that_pins_another_digest_are_none(tmp_path, capsys):
    """Found by a review: inspect --declaration listed grants as linked for an entry whose pinned sha256 makes the
    host refuse this image."""
    data = harness_elf(manifest_json(["read"], capabilities=["fs"]), ["read"])
    (tmp_path / "h.elf").write_bytes(data)
    toml = _declared(tmp_path, f'capabilities = ["fs"]\nsha256 = "{"0" * 64}"')
    assert main(["inspect", str(tmp_path / "h.elf"), "--declaration", toml]) == 2
    assert "the host would refuse it, granting nothing" in capsys.readouterr().err


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope.elf")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_disassemble(harness, capsys):
    path, data = harness
    assert main(["inspect", str(path), "--disassemble"]) == 0
    out = capsys.readouterr().out
    exports = _exports(data)
    for name, addr in exports.items():
        assert f"berm_tool_{name} <{addr:#x}>:" in out
    lines = out[out.index(f"berm_tool_read <{exports['read']:#x}>:"):].splitlines()
    assert lines[1].strip().startswith(f"{exports['read']:x}:") and any(line.endswith("  ret") for line in lines)
    assert "auipc" in out


def test_disassembly_names_the_targets_of_direct_jumps_and_branches(capsys):
    """``jal 0x10408`` left the reader to find 0x10408; the target is named as objdump names it."""
    from tests.test_rust_guest import ELF
    assert main(["inspect", str(ELF), "--disassemble"]) == 0
    lines = capsys.readouterr().out.splitlines()
    direct = [line for line in lines if re.search(r"  (jal|j|beqz|bnez|beq|bne|blt|bge|bltu|bgeu) ", line)]
    assert len(direct) > 100
    assert all(re.search(r" 0x[0-9a-f]+ <.+>$", line) for line in direct), direct[:3]
    assert any(" <core::str::slice_error_fail_rt" in line for line in direct)  # Rust names demangled


def test_text_a_guest_chose_cannot_drive_the_terminal(tmp_path, capsys):
    """Manifest text (and symbol names) went to the terminal as they were: an image could erase lines or set the
    clipboard (OSC 52) of whoever inspected it."""
    evil = "\x1b[2K\x1b]52;c;cm0gLXJmIH4K\x07 ok\x9b"
    path = tmp_path / "h.elf"
    path.write_bytes(harness_elf(manifest_json(["read"], usage=f"Call {evil}"), ["read"]))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Call \\x1b[2K\\x1b]52;c;cm0gLXJmIH4K\\x07 ok\\x9b" in out
    assert not any(c in out for c in "\x1b\x07\x9b")


def test_a_guests_text_cannot_print_lines_of_its_own_nor_reorder_what_is_shown(tmp_path, capsys):
    """A newline in a tool's description or a request printed a "requests" section of the image's making, and
    U+202E showed the rest of a line reversed (a review)."""
    import json

    doc = json.loads(manifest_json(["read"], hosts=["x\u202eevil\nrequests (documentation, not grants):"]))
    doc["tools"][0]["description"] = "reads\n\nrequests (documentation, not grants):\n  none"
    path = tmp_path / "h.elf"
    path.write_bytes(harness_elf(json.dumps(doc), ["read"]))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("requests (documentation, not grants):") == 1 + 2  # the heading, and twice escaped in a line
    assert "\u202e" not in out and "x\\u202eevil" in out
    assert [line for line in out.splitlines() if line.startswith("requests")] == ["requests (documentation, not grants):"]


def test_section_lines_are_cut_and_padded_no_wider_than_a_bound(harness):
    """Found by a review: every section line was padded to the longest escaped section name, so 2,000 sections and
    one name of 10,000 control bytes listed 80 MB from a 141 KB file. Names are cut as function names are, and the
    padding stops at SECTION_WIDTH."""
    from berm_aot.demangle import MAX_NAME
    from berm_aot.manifest import load_manifest
    from berm_cli.inspect_cmd import image_facts, render_text

    path, data = harness
    image = read_elf(data)
    facts = image_facts(image)
    blank = {"name": "", "addr": 0, "size": 0, "perms": "", "alloc": False}
    facts["sections"] += [dict(blank, name="\x01" * 10_000)] + [blank] * 2_000
    text = render_text(str(path), load_manifest(image), facts)
    assert len(text) < 200_000
    assert "  " + "\\x01" * (MAX_NAME // 4) + "…  0x00000000" in text


def test_json_output_is_not_indented_below_its_top_level():
    """Found by a review: indented throughout, a 1 MB manifest nested 99 deep printed 105 MB of indentation."""
    from berm_cli.inspect_cmd import _json_document

    nested = 0
    for _ in range(99):
        nested = [nested]
    text = _json_document({"deep": nested, "abi_version": 0})
    assert json.loads(text) == {"deep": nested, "abi_version": 0} and len(text) < 300


def test_usage_breaks_only_at_newlines(tmp_path, capsys):
    """Found by a review: usage was split with str.splitlines, so a carriage return, U+2028 or U+001C broke a line
    there, and the break was not shown escaped."""
    path = tmp_path / "h.elf"
    path.write_bytes(harness_elf(manifest_json(["read"], usage="one\rtwo\u2028three\x1cfour"), ["read"]))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\n  one\\x0dtwo\\u2028three\\x1cfour\n" in out


def test_harness_without_a_declaration_is_refused(harness, capsys):
    """Found by a review: --harness alone was taken without a word, and the listing printed as if it had been used."""
    assert main(["inspect", str(harness), "--harness", "caf"]) == 2
    assert "--harness names an entry of --declaration: without one it gives nothing" in capsys.readouterr().err
