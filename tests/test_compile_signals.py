"""``berm-compile`` ended by a signal mid-compile: one line says so, the exit status is 128 + the signal, and the
compile is undone (its temporary directory removed, its compilers killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.guests import guest_elf

SOURCE = "unsigned long v;\nunsigned long inc(unsigned long x) { return x + 1 + v; }\nvoid _start(void) {}\n"


@pytest.mark.parametrize("stderr", ["pipe", "/dev/full"])
@pytest.mark.parametrize("signum, said", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "stopped by SIGTERM"),
                                          (signal.SIGHUP, "stopped by SIGHUP")])
def test_a_signal_mid_compile_ends_it_cleanly(tmp_path, signum, said, stderr):
    """Found by a review: SIGTERM or SIGHUP ended berm-compile where it stood, leaving the compile's temporary
    directory in the cache for good, and Ctrl-C printed a KeyboardInterrupt traceback. Found by another: with stderr
    taking no more (the terminal a SIGHUP closed, /dev/full here), the line's error made the status 1."""
    elf, cache, started = tmp_path / "inc.elf", tmp_path / "cache", tmp_path / "started"
    elf.write_bytes(guest_elf(SOURCE, keep=("inc",)))
    slow = tmp_path / "slowcc"
    slow.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = --version ]; then exec cc "$@"; fi
        echo $$ > {started}
        sleep 60 &
        wait
    """))
    slow.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "berm_cli.compile", str(elf), "--cache-dir", str(cache)],
                            env={**os.environ, "BERM_CC": str(slow)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE if stderr == "pipe" else open(stderr, "w"), text=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() or not started.read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "the compiler was never started"
            time.sleep(0.05)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum
    assert err == (f"berm-compile: {said}\n" if stderr == "pipe" else None)
    left = [p.relative_to(cache) for shard in cache.iterdir() for p in shard.iterdir() if p.suffix != ".lock"]
    assert left == []


def test_the_progress_line_is_erased_where_it_is_written(tmp_path, monkeypatch, capsys):
    """Found by a review: the escape erasing the progress line (on stdout, a terminal) went to stderr, so a
    redirected stderr file got it and the terminal's progress line stayed."""
    from berm_cli import compile as compile_cli

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert compile_cli.main([str(tmp_path / "missing.elf"), "--cache-dir", str(tmp_path / "cache")]) == 2
    out, err = capsys.readouterr()
    assert "\x1b" not in err and out.endswith("\x1b[2K\r")
