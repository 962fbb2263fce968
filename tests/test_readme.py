"""README.md stays true: its three commands are the ones that work (the main job's output is checked, CI runs its
test command), its "Writing a harness" example builds and answers as it says, and its "Embedding" example runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from berm_cli.main import main

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def section(title: str) -> str:
    """The text of the README's ``## title`` section."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def fenced(text: str, language: str) -> str:
    """The first ```language block of ``text``."""
    match = re.search(rf"^```{language}\n(.*?)^```$", text, re.S | re.M)
    assert match, f"no ```{language} block"
    return match.group(1)


def command(comment: str) -> list[str]:
    """The install section's command whose trailing comment starts with ``comment``, as argv."""
    for line in fenced(section("Install, run, test"), "sh").splitlines():
        cmd, _, note = line.partition("  #")
        if note.strip().startswith(comment):
            return shlex.split(cmd)
    raise AssertionError(f"README.md's install block has no command commented '# {comment}'")


def test_ci_runs_the_readme_setup_and_test_commands():
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert command("install everything") == ["./setup.sh"] and "./setup.sh" in ci
    assert shlex.split(ci[-1]) == command("the tests")


def test_the_main_job_reads_the_first_lines_of_the_readme(monkeypatch, capsys):
    argv = command("the main job")
    assert argv[:2] == ["berm", "call"]
    monkeypatch.chdir(REPO)  # --root . is the repository, as in the README
    assert main(argv[1:]) == 0
    lines = README.splitlines()
    numbered = "\n".join(f"{i}\t{line}" for i, line in enumerate(lines[:5], 1))
    assert capsys.readouterr().out == f"{numbered}\n\n--- {len(lines)} total lines (showing lines 1-5) ---\n"


@pytest.mark.parametrize("arguments, answer", [('{"name": "Ada"}', "hello, Ada"), ("{}", "hello, world")])
def test_the_harness_example_builds_and_greets(tmp_path, capsys, arguments, answer):
    text = section("Writing a harness")
    greeter = tmp_path / "greeter"
    greeter.mkdir()
    (greeter / "harness.toml").write_text(fenced(text, "toml"))
    (greeter / "greet.c").write_text(fenced(text, "c"))
    elf = tmp_path / "greeter.elf"
    assert main(["build", str(greeter), "-o", str(elf)]) == 0
    capsys.readouterr()
    # the interpreter: the example's code is what is checked here, and the translation of the SDK would take seconds
    assert main(["call", str(elf), "greet", arguments, "--engine", "interp"]) == 0
    assert capsys.readouterr().out == answer + "\n"


def test_the_embedding_example_reads_a_file(tmp_path, monkeypatch, capsys):
    from berm_sdk.bundled import bundled_image

    code = fenced(section("Embedding"), "python")
    assert code.count('"os.elf"') == 1 and code.count('"/home/me/project"') == 1
    (tmp_path / "os.elf").write_bytes(bundled_image("os").read_bytes())
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("# a project\n")
    monkeypatch.chdir(tmp_path)  # where the example's os.elf is
    exec(compile(code.replace('"/home/me/project"', repr(str(project))), "README.md (Embedding)", "exec"), {})
    assert capsys.readouterr().out == "1\t# a project\n\n--- 1 total lines ---\n"


def test_the_declarations_example_grants_what_it_says():
    from berm_host.declaration import parse_declarations
    from berm_host.grants import LINKED, grant_status

    os_entry, reminders = parse_declarations(fenced(section("Declaring harnesses"), "toml"), "README.md")
    assert (os_entry.name, os_entry.capabilities, os_entry.root, os_entry.timeout, os_entry.memory) == (
        "os", ("fs", "exec"), "/home/me/project", 30, 64 << 20)
    assert grant_status(os_entry) == {"fs": LINKED, "exec": LINKED}
    assert (reminders.name, reminders.capabilities) == ("reminders", ("clock", "kv", "schedule"))
