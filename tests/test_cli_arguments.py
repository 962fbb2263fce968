"""Path arguments: an empty one is refused where it is parsed, for every command (``Path("")`` is the current
directory: ``berm-compile --cache-dir ""`` filled it with cache entries, found by a review)."""

from __future__ import annotations

import pytest

from berm_cli import compile as compile_cli
from berm_cli.main import SUBCOMMANDS, main


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


def test_berm_calls_empty_image_is_refused_too(tmp_path, monkeypatch, capsys):
    """A bundled name or a path, so no path option: it was the one "" still taken as the current directory (a
    review)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["call", "", "echo"])
    assert exit_.value.code == 2
    assert "argument elf: an empty name: name a bundled harness or the path of a harness image" in \
        capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], *([name, "--help"] for name in SUBCOMMANDS)])
def test_every_commands_help_says_what_its_exit_status_means(argv, capsys):
    """Found by a review: the statuses were said only in module docstrings."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    said = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0 and "exit status: 0 done (berm serve: stopped by a signal); 1 the tool failed" in said


def test_berm_compiles_help_says_what_its_exit_status_means(capsys):
    with pytest.raises(SystemExit):
        compile_cli.main(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 every image is in the cache; 1 the output could not be written; 2" in said
