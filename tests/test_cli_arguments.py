"""Path arguments: an empty one is refused where it is parsed, for every command (``Path("")`` is the current
directory: ``berm-compile --cache-dir ""`` filled it with cache entries, found by a review)."""

from __future__ import annotations

import pytest

from berm_cli import compile as compile_cli
from berm_cli.main import main


@pytest.mark.parametrize("entry, argv, option", [
    (compile_cli.main, ["g.elf", "--cache-dir", ""], "--cache-dir"),
    (compile_cli.main, ["g.elf", "--declarations", ""], "--declarations"),
    (compile_cli.main, [""], "elf"),
    (compile_cli.main, ["--declarations", "agent.toml", "--harnesses-dir", ""], "--harnesses-dir"),
    (main, ["inspect", ""], "elf"),
    (main, ["inspect", "g.elf", "--declaration", ""], "--declaration"),
    (main, ["call", "g.elf", "tool", "--data-dir", ""], "--data-dir"),
    (main, ["run", ""], "elf"),
    (main, ["build", ""], "directory"),
    (main, ["serve", "agent.toml", "--state-dir", ""], "--state-dir"),
    (main, ["serve", "agent.toml", "--socket", ""], "--socket"),
    (main, ["serve", "agent.toml", "--harnesses-dir", ""], "--harnesses-dir"),
    (main, ["serve", ""], "declarations"),
    (main, ["schedule", "--socket", "", "list"], "--socket"),
    (main, ["schedule", "list", "--socket", ""], "--socket"),
])
def test_an_empty_path_is_refused_before_anything_is_made(entry, argv, option, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        entry(argv)
    assert exit_.value.code == 2
    assert f"argument {option}: an empty path would be the current directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
