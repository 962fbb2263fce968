"""``berm inspect --declaration``: a manifest's requests shown beside what a declaration grants, never as grants."""

from __future__ import annotations

import json

import pytest

from berm_cli.main import main
from tests.elf_samples import harness_elf, manifest_json


@pytest.fixture
def files(tmp_path):
    elf = tmp_path / "os.elf"
    elf.write_bytes(harness_elf(manifest_json(["read"], requests={"capabilities": ["fs", "exec", "http"],
                                                                  "hosts": ["example.com"]}), ["read"]))
    (tmp_path / "root").mkdir()
    decl = tmp_path / "agent.toml"
    decl.write_text(f'''
[[harnesses]]
name = "os"
capabilities = ["fs", "exec", "clock"]

[[harnesses]]
name = "other"
capabilities = ["fs"]
root = "{tmp_path / 'root'}"
''')
    return elf, decl


def test_requests_are_shown_beside_the_grants(files, capsys):
    elf, decl = files
    assert main(["inspect", str(elf), "--declaration", str(decl)]) == 0
    out = capsys.readouterr().out
    assert out.split("grants (from ")[1].splitlines()[1:] == [
        "  fs: absent: no root declared",
        "  exec: absent: no root declared",
        "  http: not granted (requested)",
        "  clock: linked (not requested)",
    ]


def test_another_entry_and_json(files, capsys):
    elf, decl = files
    assert main(["inspect", str(elf), "--declaration", str(decl), "--harness", "other", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["grants"] == {
        "fs": "linked", "exec": "not granted (requested)", "http": "not granted (requested)"}


def test_an_undeclared_harness_is_an_error(files, capsys):
    elf, decl = files
    assert main(["inspect", str(elf), "--declaration", str(decl), "--harness", "nope"]) == 2
    assert "declares no harness named 'nope'" in capsys.readouterr().err
