"""``berm run ELF SYMBOL [ARG ...]``: a normal call, argument parsing, memory sizes, a trap (exit 2 with the trap,
pc, function+offset, instruction and registers), a berm.fail (exit 1), bad input (exit 2), both engines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from berm_abi.names import fnv1a64
from berm_cli.main import main
from tests.bounded import GRACE
from tests.children import run_python
from tests.guests import guest_elf

SOURCE = r"""
typedef unsigned long long u64;
#define EXPORT __attribute__((noinline))
EXPORT u64 add(u64 a, u64 b) { return a + b; }
EXPORT u64 sum8(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f, u64 g, u64 h) { return a + b + c + d + e + f + g + h; }
EXPORT u64 load(u64 p) { return *(volatile u64 *)p; }
EXPORT u64 load_twice(u64 p) { return load(p) * 3 + load(p + 8); }
EXPORT u64 spin(void) { static volatile u64 v; for (;;) v++; }
EXPORT u64 fails(void) {
    static const char msg[] = "bad input";
    register u64 a0 asm("a0") = (u64)msg;
    register u64 a1 asm("a1") = 9;
    register u64 a7 asm("a7") = FAIL;
    asm volatile("ecall" : "+r"(a0) : "r"(a1), "r"(a7) : "memory");
    return 7;
}
u64 (*volatile keep)(u64, u64) = add;
void _start(void) { keep(1, 2); }
""".replace("FAIL", f"{fnv1a64('berm.fail')}ULL")


@pytest.fixture(scope="module")
def elf(tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "prog.elf"
    path.write_bytes(guest_elf(SOURCE, keep=("add", "sum8", "load", "load_twice", "fails", "spin")))
    return str(path)


def test_normal_call_prints_a0_and_a1(elf, capsys):
    assert main(["run", elf, "add", "40", "0x2"]) == 0
    assert capsys.readouterr().out == "a0=0x2a a1=0x2\n"


def test_negative_and_hex_arguments_in_all_eight_registers(elf, capsys):
    assert main(["run", elf, "sum8", "-1", "0x10", "1", "2", "3", "4", "5", "0XFF"]) == 0
    assert capsys.readouterr().out.startswith(f"a0={(-1 + 16 + 15 + 255) & (2**64 - 1):#x} ")


@pytest.mark.parametrize("size", ["64M", "1G", "1048576", "4M"])
def test_memory_sizes(elf, capsys, size):
    assert main(["run", elf, "add", "1", "2", "--memory", size]) == 0
    assert capsys.readouterr().out.startswith("a0=0x3 ")


def test_a_trap_prints_the_details_and_exits_2(elf, capsys):
    assert main(["run", elf, "load", "8", "--memory", "1M"]) == 2
    err = capsys.readouterr().err
    assert "guest memory fault at 0x8 (load 8 bytes, in the null page) in load" in err
    assert "  pc 0x" in err and "instruction: ld a0, 0(a0)" in err
    assert "a0=0x0000000000000008" in err and "sp=0x00000000000ffff0" in err and "t6=0x" in err


@pytest.mark.parametrize("engine", ["aot", "interp"])
def test_a_trap_in_a_callee_prints_the_call_chain(elf, capsys, tmp_path, monkeypatch, engine):
    monkeypatch.setenv("BERM_CACHE_DIR", str(tmp_path))
    assert main(["run", elf, "load_twice", "8", "--engine", engine]) == 2
    err = capsys.readouterr().err
    assert "guest memory fault at 0x8 (load 8 bytes, in the null page) in load\n" in err
    assert "\n  called from load_twice+0x" in err


def test_berm_fail_exits_1_with_the_text(elf, capsys):
    assert main(["run", elf, "fails"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("a0=0x7 ") and "berm.fail: bad input" in err


@pytest.mark.parametrize("argv, message", [
    (["nope"], "has no global symbol 'nope' (it has "),
    (["nope"], "; a function no tool reaches is left out of an image linked with --gc-sections"),  # a review: no hint
    (["ad"], "has no global symbol 'ad' (did you mean 'add', 'load'?)\n"),  # a walkthrough: it named none; no gc hint
    (["add", *["1"] * 9], "at most 8 integer arguments"),
    (["keep"], "'keep' is not a function: it names 0x"),  # a review: it ran, and trapped at a nameless address
    (["add", "1", "--memory", "3M"], "power of two"),
    (["add", "1", "--memory", "lots"], "size like"),
])
def test_bad_input_exits_2_with_a_message(elf, capsys, argv, message):
    assert main(["run", elf, *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["run", "--timeout", "inf"], ["run", "--timeout", "0"], ["call", "--timeout", "-1"],
                                  ["serve", "--timeout", "nan"]])
def test_every_timeout_is_a_number_of_seconds_a_declaration_could_hold(argv, capsys):
    """inf ran for ever; berm call's was refused as its one-entry declaration's, "command line 'x': timeout …"."""
    command, *options = argv
    with pytest.raises(SystemExit) as exc:
        main([command, *options, "x.elf", *(["t"] if command == "call" else ["f"] if command == "run" else [])])
    assert exc.value.code == 2
    assert f"berm {command}: error: argument --timeout: must be a number of seconds in (0, 86400], not " \
        in capsys.readouterr().err


@pytest.mark.parametrize("arg", ["zz", "0xg", str(2 ** 64), str(-(2 ** 63) - 1)])
def test_unparsable_arguments_are_usage_errors(elf, capsys, arg):
    with pytest.raises(SystemExit) as exc:
        main(["run", elf, "add", arg])
    assert exc.value.code == 2
    assert "berm run: error: argument ARG" in capsys.readouterr().err


def test_leading_zeros_are_no_digits_of_an_argument_and_a_long_one_is_shown_cut(elf, capsys):
    """Found by a review: 1 written with 67 zeros before it was refused as not fitting 64 bits, and 0x with 70 f's
    was echoed as 38 of them, with no sign of the cut."""
    assert main(["run", elf, "add", "0" * 5000 + "40", "0x" + "0" * 100 + "2"]) == 0
    assert capsys.readouterr().out == "a0=0x2a a1=0x2\n"
    with pytest.raises(SystemExit):
        main(["run", elf, "add", "0x" + "f" * 70])
    assert f"argument ARG: 0x{'f' * 38}… does not fit 64 bits" in capsys.readouterr().err


def test_not_an_elf(tmp_path, capsys):
    bad = tmp_path / "bad.elf"
    bad.write_bytes(b"not an elf at all")
    assert main(["run", str(bad), "add"]) == 2
    assert capsys.readouterr().err.startswith("berm run: ")


def test_aot_engine_gives_the_same_answer(elf, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("BERM_CACHE_DIR", str(tmp_path))
    assert main(["run", elf, "add", "40", "2", "--engine", "aot"]) == 0
    assert capsys.readouterr().out == "a0=0x2a a1=0x2\n"
    assert main(["run", elf, "load", "8", "--engine", "aot"]) == 2
    assert "guest memory fault at 0x8 (load 8 bytes, in the null page) in load" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["aot", "interp"])
def test_ctrl_c_ends_a_guest_at_once(elf, tmp_path, engine):
    """Translated code runs with the GIL released, and CPython acts on a signal only between bytecodes of the main
    thread: a guest spinning on the main thread ignored Ctrl-C until its deadline."""
    env = {**os.environ, "BERM_CACHE_DIR": str(tmp_path)}
    argv = [sys.executable, "-m", "berm_cli.main", "run", elf, "spin", "--engine", engine, "--timeout", "600"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for_the_guest_to_spin(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=GRACE)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err == "berm: interrupted\n"


def test_a_sigterm_whose_exception_was_dropped_still_ends_the_command_before_its_guest_runs():
    """Found by a review: CPython drops an exception a signal handler raises inside compile() (an import without its
    .pyc), so SIGTERM was lost and the guest ran on to its deadline. The handler's record of it is looked at before
    the guest starts (here the record is made as the handler makes it, its exception left out)."""
    done = run_python("import signal, time\n"
                      "from berm_cli import interrupt\n"
                      "with interrupt.signals_raise(signal.SIGTERM):\n"
                      "    interrupt._received.append(signal.SIGTERM)\n"
                      "    interrupt.interruptible(lambda: time.sleep(30))\n", timeout=20)
    assert (done.returncode, done.stderr) == (143, "berm: stopped by SIGTERM\n")


def _wait_for_the_guest_to_spin(pid: int) -> None:
    """Until the process has used 2 s of CPU itself: start-up and loading take well under that, so its guest is
    spinning by then."""
    tick = os.sysconf("SC_CLK_TCK")
    for _ in range(1200):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if (int(fields[11]) + int(fields[12])) / tick >= 2.0:  # utime + stime
            return
        time.sleep(0.1)
    pytest.fail("berm run never got its guest spinning")


@pytest.mark.parametrize("arg", ["0x-5", "-0x-5", "1_000", "+7", " 5", "\u0663", "0x", "9" * 5000])
def test_an_argument_that_is_not_plainly_decimal_or_hex_is_refused(elf, capsys, arg):
    """Found by a review: int() took "0x-5" (as 0xfff...fb), "1_000", "+7" and non-ASCII digits, and a 5,000-digit
    number failed as "not a decimal or 0x-hex integer" (int()'s digit limit)."""
    with pytest.raises(SystemExit):
        main(["run", elf, "add", "--", arg, "1"])
    err = capsys.readouterr().err
    assert ("does not fit 64 bits" if arg.isdigit() and arg.isascii() else "is not a decimal or 0x-hex integer") in err


@pytest.mark.parametrize("argv", [["inspect", "{f}"], ["run", "{f}", "f"], ["run", "{f}", "f", "--engine", "aot"],
                                  ["call", "{f}", "t"]])
def test_what_is_wrong_with_an_image_names_its_file_in_every_command(tmp_path, capsys, argv):
    """Found by a review: berm inspect and berm run (interp) said "not an ELF file (bad magic)" where berm call and
    berm run --engine aot named the file."""
    bad = tmp_path / "notelf"
    bad.write_bytes(b"hello\n")
    assert main([a.format(f=bad) for a in argv]) == 2
    assert capsys.readouterr().err == f"berm {argv[0]}: {bad}: not an ELF file (bad magic)\n"
