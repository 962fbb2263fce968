"""Run the system C compiler on emitted translation units: one object per unit, compiled in parallel, linked
into one shared object.

Flags, and what was measured for them (on this shared 2-core machine):
- ``-O1``: on one unit of the OS harness (~1500 guest instructions) -O1 takes 1.5 s of CPU, -O2 3.2 s, -O3 3.3 s;
  on a 60-function version of tools/bench_bigguest.py -O1 took 2.4 s of CPU against 5.2 s. Kernel run times
  (tools/kernels) at -O1/-O2/-O3 were within the machine's noise of each other in two independent series
  (repeated runs swapped their order), so -O1 is the default: half the install-time compile, no measured loss.
  ``BERM_CFLAGS=-O2`` restores the other.
- ``-fcaller-saves`` (part of -O2, not of -O1): without it gcc keeps a value that lives across any call, even one
  on a cold path (the bounds slow path, a trap, a guest call), only in the six callee-saved x86-64 registers, and
  translated functions have such calls everywhere. With it, tools/kernels went from 2.01-2.10x native to
  1.80-1.85x (fib 3.0x -> 2.1x, sha256 2.4x -> 2.1x; interleaved runs, 2026-11-30), at the same compile time
  (98 KB guest: 7.9-8.7 s wall against 7.8-9.3 s). Of the other -O2 flags tried one or a group at a time on top
  (-flra-remat, -fipa-ra, -ftree-vrp, -ftree-pre, -fgcse, -fschedule-insns2, -fpeephole2, alignment,
  block reordering, tail merging, -fira-*), none moved the kernels beyond the machine's noise; -O2 as a whole
  doubles the compile.
- ``-free`` (part of -O2): drops a zero or sign extension an x86 instruction already did (a 32-bit operation
  clears the upper half; the emitter writes ``srliw`` as such a zero extension). Measured later than the flags
  above and with more rounds, interleaved in both orders: kernels 1.51-1.54x -> 1.45x native (sha256 -5-7%,
  fib -7-12%, sort -3%; callgrind: sha256 -6%, crc32 -11% instructions), compile time unchanged (98 KB guest:
  7.8 s wall against 7.9-8.9 s).
- ``-fpeephole2`` (part of -O2): x86 rewrites after register allocation, such as zeroing a register with ``xor``
  (which the core renames away) rather than ``mov $0``. The kernels execute the same instructions per unit
  (tools/bench_insns.py: fib 30,553 against 30,555, sort 68,967 against 68,956) and run faster: on an AMD EPYC Zen 5
  (2026-12-04; tools/bench_ab.py, 31 rounds, beside a control: the defaults again, another object) the geometric
  mean went 1.341x -> 1.301x and 1.336x -> 1.287x native (two processes), 1.349x -> 1.305x on a clang -O3 build of
  the kernels and 1.494x -> 1.480x on an -Os build; fib 1.14-1.27x -> 1.01-1.16x, sort 3-5% faster, tokenize equal
  except on the -Os build (2.21x -> 2.41x; its control ran at 2.25x). The largest unit of the 98 KB guest and of
  rust-keywords compiles in the same user time (1.00-1.13 s against 1.02-1.12 s, 0.76-0.88 s against 0.75-0.93 s,
  six alternated runs each). It was among the -O2 flags tried above, on another machine, where it measured within
  the noise.
- ``-falign-functions=64``: each translated function starts on a cache line, so where its hot loops fall no longer
  depends on the size of the functions before it. Without it, rebuilding the kernels' guest with a different flag
  (the same fib code, the same instruction count) moved fib from 1.83x to 1.96x native; aligned, both builds ran
  fib at 1.72-1.73x. Over the five kernels (tools/kernels, 21 interleaved rounds, 2026-12-01): on that build
  sha256 2.05 -> 1.99, sort 1.375 -> 1.368, fib 1.95 -> 1.72, tokenize 1.17 -> 1.12, crc32 equal; on the other,
  fib 1.84 -> 1.73 and the rest within +-3% either way. Compile time unchanged (98 KB guest units).
- ``-fno-tree-dse -fno-tree-ch`` (both part of -O1): dead-store elimination and loop-header copying find little to
  do in translated code (a guest's loops mostly test at the bottom already; most of its stores go to guest memory,
  which later code may read) yet cost gcc time. cc1 executes 8.4% fewer instructions on a quarter unit of the 98 KB
  guest and 8.3% fewer on a unit of the Rust guest (callgrind), and one whole unit of the 98 KB guest took 11% less
  user time (12 alternated pairs, 2.10 s against 1.86 s); the kernels execute the same instructions per unit
  (tools/bench_insns.py, within 1%) and ran 0.6-1.5% slower on the geometric mean in four processes
  (tools/bench_ab.py, 21 rounds each; tokenize, the most layout-sensitive, moved either way by up to 13%). Found on
  2026-12-02 by turning each of -O1's 41 passes off alone on one unit (user time, which moves by ~10% between runs
  here); of the others that seemed to save time, -fno-tree-bit-ccp and -fno-tree-copy-prop took nothing off cc1's
  instructions, and -fno-tree-dominator-opts costs run time (BENCHMARKS.md, session 12).
- ``-fno-dse -fno-tree-pta`` (RTL dead-store elimination and points-to analysis, part of -O1): on top of the two
  above, cc1 executes 5.7% fewer instructions on the quarter unit and 6.8% fewer on the Rust guest's unit, and the
  kernels the same instructions per unit and the same time (geometric mean 1.558x against 1.563x and 1.608x
  against 1.607x native, two processes). Of twelve other -O1 passes, turned off one at a time on top of the two
  above and counted with callgrind, none took more than 1.3% off (-fno-thread-jumps, which costs fib 29% more
  instructions: BENCHMARKS.md, session 13; loop invariant motion and register copy propagation 1.2%).
- ``-Wa,-mbranches-within-32B-boundaries`` (x86-64 hosts only; an option of GNU as since 2.34): the assembler
  pads so that no jump crosses or ends on a 32-byte boundary, which Intel cores with the "JCC erratum" microcode
  (Skylake and its successors) cannot keep in their decoded-instruction cache. On the Intel Xeon of 2026-12-02,
  over two builds of the kernels' guest (clang ``-O2`` and ``-Os``; tools/bench_ab.py, 21 rounds, four processes):
  geometric mean 1.462-1.467x -> 1.393-1.400x native and 1.542-1.546x -> 1.471-1.473x; ``fib`` (a self-call
  loop) 2.02x -> 1.55-1.60x, ``tokenize`` 1-4% slower, the rest equal or faster. The 98 KB guest's code is 3.6%
  larger and its compile takes ~1% more CPU; rust-probe's tools ran as fast or faster. ``-falign-jumps=32`` on
  top helped one build and not the other, for 7% more code. On an AMD EPYC (Zen 3, which has no such erratum) it
  costs nothing: 1.614x with it against 1.643x and 1.678x without (two processes, 21 rounds each).
- Not used, each saving compile time at a run-time cost (2026-12-02, AMD EPYC; cc1's instructions on a quarter
  unit of the 98 KB guest, callgrind): ``-fira-region=one`` -5.7% (kernels 1.590x and 1.584x native with it, 1.586x
  and 1.487x without, two processes: sort, tokenize and sha256 slower); ``-fno-tree-sink`` -1.1% (sort 2.4%
  more instructions per unit, tools/bench_insns.py); ``-fno-cprop-registers`` -1.3% (sort +2.6%, fib +2.1%);
  those two with ``-fno-forward-propagate -fno-if-conversion -fno-if-conversion2 -fno-tree-loop-optimize`` -8.3%
  (fib 21% slower). What costs gcc its time is what the checks add: with every check macro compiled out
  (tools/bench_limits.py's no-checks) the quarter unit took 27% fewer instructions, without the register stores
  of the ``trap`` block 6.5% fewer; the comments, a quarter of the C, cost nothing.
- ``-fno-plt -fvisibility=hidden``: calls between translated functions bind inside the object.
- ``-fwrapv``: guest arithmetic wraps; the emitter already computes in unsigned types, this makes the odd signed
  conversion defined too. ``-fno-strict-aliasing``: guest memory is accessed through memcpy of several types.
- ``-w``: emitted code is machine-made; warnings are noise (labels and loads gcc drops anyway).
- ``-fstack-usage``: gcc reports every function's stack frame; the largest (plus FRAME_SLACK) is compiled into
  the object as ``berm_max_frame``, and the runtime keeps room for two such frames below its native stack's floor,
  since a function's entry check may run after its frame is allocated (berm_host/aot/core.c, berm_region_code). A
  ``BERM_CC`` must write that report beside its ``-o`` (gcc and clang do; ``zig cc`` keeps it in its own cache,
  and ``-flto`` writes none): without it the compile fails with that message.
Two compile-time traps found by measurement and avoided in the emitter: a ``switch`` at every ``ret`` made
gcc's VRP quadratic (176 s for one function; now one dispatch block per function), and an out-of-line bounds
slow path at every access (now one shared fault block per function: -35% compile time).
Override with ``BERM_CC`` (the compiler command) and ``BERM_CFLAGS`` (replaces the optimisation flags); both are
part of ``identity()`` and therefore of every cache key, and so are the files the compiler, ``as`` and ``ld``
resolve to on ``PATH`` (another ``cc`` earlier on it, answering ``--version`` alike, shared the key). The
environment variables through which gcc and ld take include directories, a prefix for their own programs or a run
path (``CPATH``, ``GCC_EXEC_PREFIX``, ``LD_RUN_PATH``, …) are not passed to the compiler: they would change the
object without changing its key.

Each compiler runs in a session of its own and the whole session is killed on a timeout or an error (killing the
driver alone left ``cc1`` and ``as`` running); ``COMPILE_TIMEOUT`` bounds one whole compile, units and link. Given a
``supervisor`` (the host's ``berm-supervise``), each compiler runs under it, and everything a compiler started dies
with this process too: a host killed mid-compile left its compilers running to the end (minutes, for a large
image), bound by a timeout nobody enforced any more.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import selectors
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import berm_aot
from berm_aot.errors import CompileError

#: x86-64 only (the option belongs to GNU as for x86): see above.
_X86_64_FLAGS = ("-Wa,-mbranches-within-32B-boundaries",) if platform.machine() in ("x86_64", "AMD64") else ()
DEFAULT_OPT_FLAGS = ("-O1", "-fcaller-saves", "-free", "-fpeephole2", "-falign-functions=64", "-fno-tree-dse",
                     "-fno-tree-ch", "-fno-dse", "-fno-tree-pta", *_X86_64_FLAGS)
BASE_FLAGS = ("-fPIC", "-fno-plt", "-fvisibility=hidden", "-fwrapv", "-fno-strict-aliasing", "-w", "-std=gnu11")
#: Seconds one compile_shared may take, every unit and the link together.
COMPILE_TIMEOUT = 900
#: Seconds a supervisor has, once asked, to kill what its compiler started and exit before its session is killed.
SUPERVISOR_GRACE = 5.0
#: Environment variables that change what gcc, cc1, as or ld produce (GCC's manual, "Environment Variables
#: Affecting GCC"; ld's LD_RUN_PATH and LIBRARY_PATH), dropped from the compiler's environment; and those of clang
#: (a ``BERM_CC``, and the guest toolchain's ``zig cc``, berm_sdk/toolchain.py): CCC_OVERRIDE_OPTIONS edits its
#: command line (``+-O0`` changed every SDK object under the same cache key: found by a review), and
#: OBJCPLUS_INCLUDE_PATH; and zig's ZIG_LIB_DIR, where it finds its headers and compiler-rt's source.
_COMPILER_ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "OBJCPLUS_INCLUDE_PATH",
                 "GCC_EXEC_PREFIX", "COMPILER_PATH", "LIBRARY_PATH", "LD_RUN_PATH", "DEPENDENCIES_OUTPUT",
                 "SUNPRO_DEPENDENCIES", "GCC_COMPARE_DEBUG", "GCC_EXTRA_DIAGNOSTIC_OUTPUT", "SOURCE_DATE_EPOCH",
                 "CCC_OVERRIDE_OPTIONS", "ZIG_LIB_DIR")
#: How berm-supervise's own failures start (it could not start the compiler): berm_host/capabilities/supervise.c.
_SUPERVISOR_FAILED = "berm-supervise: "
#: Defined in every object compile_shared builds: the largest native stack frame of any function in it, in bytes.
FRAME_SYMBOL = "berm_max_frame"
#: Defined when compile_shared is given a key: the code cache key the object is compiled for, which the runtime
#: checks at load (berm_host/aot/core.c, berm_load), so an entry renamed under another image's key is refused.
KEY_SYMBOL = "berm_object_key"
#: Added to the largest frame gcc reports: a leaf function also writes up to 128 bytes below its stack pointer
#: (the x86-64 red zone), which its reported frame leaves out.
FRAME_SLACK = 256


#: Why no child's exit status can be known in a process that ignores SIGCHLD (kept across exec from a parent that
#: ignored it): the kernel reaps each child as it exits, wait() fails with ECHILD, and subprocess records 0. Every
#: command of exec "exited 0", and a compiler's failure read as a success (found by a review).
SIGCHLD_IGNORED = ("this process ignores SIGCHLD (as its parent left it), so no child's exit status can be known: "
                   "restore its default action (signal.signal(signal.SIGCHLD, signal.SIG_DFL))")


def children_unseen() -> bool:
    """Whether this process ignores SIGCHLD (``SIGCHLD_IGNORED``)."""
    return signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN


def compiler() -> list[str]:
    """``BERM_CC`` as words, the program an absolute path: the units compile in a directory of their own, where a
    relative one (``bin/mycc``, which answered ``--version``) was not found, and the error blamed the translator
    (found by a review). A program not found is left as it is given, for the error to name."""
    cmd = _words("BERM_CC", os.environ.get("BERM_CC", "cc"))
    if not cmd:
        raise CompileError("BERM_CC is empty: it names the C compiler (default: cc)")
    program = cmd[0] if os.path.isabs(cmd[0]) else _absolute(cmd[0], os.environ.get("PATH"), _cwd())
    return [program, *cmd[1:]]


def _cwd() -> str | None:
    """The working directory, None when it was removed: a relative lookup then finds nothing (found by a review:
    os.getcwd()'s FileNotFoundError made every load of a process whose directory was removed fail, cached
    ones included, with no path named)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


@functools.lru_cache(maxsize=8)
def _absolute(program: str, path: str | None, cwd: str | None) -> str:
    """``program``'s absolute path as ``path`` finds it from ``cwd``, or ``program`` itself when it is not found;
    looked up once (a lookup costs ~60 us, and every cache key asks), as ``_version`` and ``_found`` are. Its
    directory is named by its real path (its own name kept: a driver may act on it), so that one compiler found
    through /bin (a symbolic link to /usr/bin on Debian) and through /usr/bin is one identity: the cache keys
    differed, and a daemon whose PATH had another order compiled again what berm-compile had (found by a review)."""
    found = shutil.which(program, path=path)
    if not found:
        return program
    found = os.path.abspath(found)
    return os.path.join(os.path.realpath(os.path.dirname(found)), os.path.basename(found))


def opt_flags() -> tuple[str, ...]:
    env = os.environ.get("BERM_CFLAGS")
    return tuple(_words("BERM_CFLAGS", env)) if env is not None else DEFAULT_OPT_FLAGS


def _words(variable: str, value: str) -> list[str]:
    """``value`` split as a shell would split it, or a CompileError naming ``variable``."""
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise CompileError(f"{variable} is not a list of shell words ({exc}): {value!r}") from None


def compiler_env() -> dict[str, str]:
    """This process's environment without the variables that would change the compiler's output (``_COMPILER_ENV``
    and gcc's internal ``COLLECT_*``)."""
    env = {k: v for k, v in os.environ.items() if k not in _COMPILER_ENV and not k.startswith("COLLECT_")}
    env.setdefault("PATH", os.defpath)  # where identity() found as and ld: with none, collect2 found no ld (a review)
    return env


def _ask_version(cmd: tuple[str, ...]) -> str:
    """The first line ``cmd --version`` prints, running it now."""
    try:
        out = subprocess.run([*cmd, "--version"], capture_output=True, timeout=60, check=False, env=compiler_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompileError(f"the C compiler {' '.join(cmd)!r} cannot run: {exc}") from None
    if out.returncode != 0 or not out.stdout:
        raise CompileError(f"the C compiler {' '.join(cmd)!r} does not answer --version")
    return out.stdout.decode(errors="replace").splitlines()[0]


#: ``_ask_version`` once per process and command.
_version = functools.lru_cache(maxsize=8)(_ask_version)

#: Programs that run another compiler, found anew each time (ccache runs the next ``cc`` on PATH): their file stays
#: the same when the compiler behind them changes, so their version line is not kept across processes.
WRAPPERS = frozenset({"ccache", "sccache", "distcc", "icecc", "buildcache"})
#: The name of a version line kept in a BlobStore (``version``).
VERSION_BLOB = "cc-version"
#: Version lines found in this process, by ``_version_key`` and the root of the store that keeps them (a store
#: this process has not used yet is asked, and given the line when it lacks it).
_found_versions: dict[tuple[str, Path], str] = {}


class BlobStore(Protocol):
    """Where ``version`` keeps a version line across processes: the code cache (berm_aot/cache.py)."""

    root: Path

    def read_blob(self, key: str, name: str) -> bytes | None: ...

    def write_blob(self, key: str, name: str, data: bytes) -> None: ...


def version(cmd: tuple[str, ...], store: BlobStore | None = None) -> str:
    """The first line ``cmd --version`` prints, part of the compiler's identity. Running the compiler was most of a
    process's first cached load (~2 ms of 3), so the line is kept in ``store`` under the status of the compiler's
    file (``_version_key``: a replaced compiler is another key) and later processes read it there; a command whose
    line cannot be tied to one file is run once per process, as every command was before."""
    key = _version_key(cmd, _found(cmd, os.environ.get("PATH"))[0]) if store is not None else None
    if key is None:
        return _version(cmd)
    line = _found_versions.get((key, store.root))
    if line is None:
        line = _stored_line(store.read_blob(key, VERSION_BLOB))
        if line is None:
            # asked now, not the process's memo (which may be of a compiler replaced since), and kept only if the
            # file is still the one the key describes (an upgrade or an alternatives switch while it ran is not)
            line = _ask_version(cmd)
            if _version_key(cmd, _program(cmd[0])) == key:
                store.write_blob(key, VERSION_BLOB, line.encode())
        _found_versions[(key, store.root)] = line
    return line


def _stored_line(data: bytes | None) -> str | None:
    """A stored version line, None for anything ``_version`` could not have returned (then it runs again)."""
    try:
        line = data.decode() if data is not None else ""
    except UnicodeDecodeError:
        return None
    return line if line and "\n" not in line and "\r" not in line and len(line) <= 1000 else None


@functools.lru_cache(maxsize=16)  # every cache key asks
def _version_key(cmd: tuple[str, ...], program: _Program | str) -> str | None:
    """A key for ``cmd``'s version line that changes whenever the compiler's file (``program``) does: its real path,
    device, inode, size, modification and change times (a reinstall of the same compiler changes the last: it is
    asked again), and the name it is run by (gcc prints that name: ``cc (Debian 12.2.0-14) …`` and ``gcc (Debian
    …`` are one file). None when the line is not that file's alone: a command of several words (``python3 -m
    ziglang cc``), a script, a known wrapper (``WRAPPERS``), a file it cannot read."""
    if len(cmd) != 1 or not isinstance(program, _Program) or not program.elf:
        return None
    if os.path.basename(program.real) in WRAPPERS:
        return None
    st = program.st
    facts = [cmd[0], program.real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return hashlib.sha256(json.dumps(["cc-version", facts]).encode()).hexdigest()


class _Program(NamedTuple):
    """A program as ``_found`` found it: the path PATH gave, its real path, its status, whether it is an ELF file."""

    where: str
    real: str
    st: os.stat_result
    elf: bool


@functools.lru_cache(maxsize=8)
def _found(cmd: tuple[str, ...], path: str | None) -> tuple[_Program | str, ...]:
    """The compiler, ``as`` and ``ld`` as ``path`` finds them (gcc runs its assembler and linker from there), or
    each one's name when nothing is found. Looked up once per process (a first load's cache key asks)."""
    return tuple(_program(where) if (where := shutil.which(name, path=path)) else name
                 for name in (cmd[0], "as", "ld"))


def _program(where: str) -> _Program | str:
    """The file ``where`` names, through one descriptor whose /proc link names its real path (os.path.realpath
    lstat-s every component: ~90 us for /usr/bin/cc's four links); ``where`` itself when it cannot be looked at.
    Only a regular file is read (an executable FIFO on PATH is one ``shutil.which`` finds)."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # executable but not readable (0711): still a file with a status, not one to read
        try:
            return _Program(where, os.path.realpath(where), os.stat(where), False)
        except OSError:
            return where
    try:
        st = os.fstat(fd)
        head = os.pread(fd, 4, 0) if stat.S_ISREG(st.st_mode) else b""
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # no /proc
            real = os.path.realpath(where)
    except OSError:
        return where
    finally:
        os.close(fd)
    return _Program(where, real, st, head == b"\x7fELF")


def _programs(cmd: tuple[str, ...], path: str | None) -> tuple[tuple[str, int, int] | str, ...]:
    """What of ``_found``'s programs is part of the identity: each file's real path, size and modification time."""
    return tuple((p.real, p.st.st_size, p.st.st_mtime_ns) if isinstance(p, _Program) else p
                 for p in _found(cmd, path))


def identity(opt: tuple[str, ...] | None = None, store: BlobStore | None = None) -> str:
    """Everything about the compiler that changes its output: command, version line, flags, and the programs
    (with ``store``, found as ``_toolchain`` says)."""
    cmd, line, programs = _toolchain(store) if store is not None else _found_toolchain(None)
    flags = opt if opt is not None else opt_flags()
    # JSON keeps each argument whole: joined with spaces, ["-DX=1 -O0"] and ["-DX=1", "-O0"] were one identity
    return json.dumps([cmd, line, flags, BASE_FLAGS, programs])


#: The name of the toolchain memo kept in a BlobStore (``_toolchain``).
TOOLCHAIN_BLOB = "cc-toolchain"
#: What ``_toolchain`` found in this process, by what it depends on.
_toolchains: dict[tuple, "_Toolchain"] = {}
#: The command, its version line, and ``_programs``.
_Toolchain = tuple[tuple[str, ...], str, tuple]


def _toolchain(store: BlobStore) -> _Toolchain:
    """``identity``'s toolchain, found once per process and ``store``; a process's first look reads the memo a
    process before it left in ``store`` (``TOOLCHAIN_BLOB``) and checks it against the file system. Finding the
    compiler, ``as`` and ``ld`` on PATH, reading each file's status and the version line the cache keeps was a third
    of a fresh process's first cached load (0.39 of ~1.1 ms on a 2-core AMD EPYC Zen 5, 2026-12-04); checking the
    memo stats the PATH directories searched and the three programs again (~0.1 ms). The memo's key covers the
    translator's sources (this module among them): another version of this code never reads it."""
    path, given = os.environ.get("PATH"), os.environ.get("BERM_CC")
    here = (path, given, _cwd(), store.root)
    found = _toolchains.get(here)
    if found is not None:
        return found
    key = hashlib.sha256(json.dumps([TOOLCHAIN_BLOB, berm_aot.SOURCES_DIGEST, path, given]).encode()).hexdigest()
    found = _checked_memo(store.read_blob(key, TOOLCHAIN_BLOB))
    if found is None:
        # the directories before the search, so that a change during it shows at the next check; and the search
        # anew, not this process's lookups, which may be of files replaced since (found by a review: a memo paired
        # a replaced compiler's version line with its successor's status, for every later process)
        directories = {entry: _status(entry) for entry in (path or "").split(os.pathsep)}
        _found.cache_clear()
        _absolute.cache_clear()
        found = _found_toolchain(store)
        memo = _memo(found, path, given, directories)
        if memo is not None:
            store.write_blob(key, TOOLCHAIN_BLOB, memo)
    _toolchains[here] = found
    return found


def _found_toolchain(store: BlobStore | None) -> _Toolchain:
    cmd = tuple(compiler())
    return cmd, version(cmd, store), _programs(cmd, os.environ.get("PATH"))


def _status(where: str) -> list[int] | None:
    """The status of the file or directory ``where`` names, symbolic links followed, as the memo keeps it
    (``_stat_facts``), or None when there is none."""
    try:
        return _stat_facts(os.stat(where))
    except OSError:
        return None


def _stat_facts(st: os.stat_result) -> list[int]:
    """What changes when a file is replaced or written (its inode, size, times), when a symbolic link on the way to
    it is pointed elsewhere (another inode), or when a name in a directory is added, removed or renamed (its
    modification time)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _memo(found: _Toolchain, path: str | None, given: str | None,
          directories: dict[str, list[int] | None]) -> bytes | None:
    """The memo of ``found`` (``_toolchain``), its programs' status as the search saw it and the PATH directories' as
    ``directories`` saw them before it; None when status could not tell a change: a compiler or PATH entry found
    from the working directory, a version line not kept across processes (a wrapper, a script, several words:
    ``_version_key``), a program not found, or a file named like one of them in a PATH directory searched before
    its own (``shutil.which`` passes over one that is not executable, and making it so changes no directory's
    status)."""
    cmd, line, programs = found
    entries = (path or "").split(os.pathsep)
    if given is not None and os.sep in given and not os.path.isabs(given) or not all(map(os.path.isabs, entries)):
        return None
    files = _found(cmd, path)
    if not all(isinstance(f, _Program) for f in files) or _version_key(cmd, files[0]) is None:
        return None
    searched = 0  # the PATH entries searched, up to the last one a program was found in
    named = zip(("as", "ld"), files[1:]) if given is not None and os.sep in given else \
        zip((given or "cc", "as", "ld"), files)
    for name, file in named:
        # by the directory's real path: the compiler's is named so (_absolute)
        home = next((k for k, entry in enumerate(entries)
                     if os.path.realpath(entry) == os.path.realpath(os.path.dirname(file.where))), None)
        if home is None or any(os.path.lexists(os.path.join(entry, name)) for entry in entries[:home]):
            return None
        searched = max(searched, home + 1)
    statuses = [[f.where, _stat_facts(f.st)] for f in files]
    statuses += [[entry, directories[entry]] for entry in dict.fromkeys(entries[:searched])]
    return json.dumps({"found": [cmd, line, programs], "statuses": statuses}).encode()


def _checked_memo(data: bytes | None) -> _Toolchain | None:
    """The toolchain a memo holds if the file system still finds it: the same programs' files, and no name added to or
    taken from the PATH directories searched; None otherwise, or for anything ``_memo`` could not have written."""
    if data is None:
        return None
    try:
        memo = json.loads(data)
        (cmd, line, programs), statuses = memo["found"], memo["statuses"]
        program = [str, int, int]
        if not (isinstance(cmd, list) and len(cmd) == 1 and isinstance(cmd[0], str) and os.path.isabs(cmd[0])
                and isinstance(line, str) and _stored_line(line.encode()) is not None
                and isinstance(programs, list) and len(programs) == 3
                and all(list(map(type, p)) == program for p in programs)
                and isinstance(statuses, list) and len(statuses) > 3
                and all(isinstance(where, str) and os.path.isabs(where)
                        and (status is None or list(map(type, status)) == [int] * 5) for where, status in statuses)):
            return None
        if any(_status(where) != status for where, status in statuses):
            return None
        return tuple(cmd), line, tuple(map(tuple, programs))
    except (ValueError, TypeError, KeyError, RecursionError):
        return None


def compile_shared(sources: Iterable[str], out: Path, *, headers: Mapping[str, bytes] | None = None, jobs: int = 2,
                   opt: tuple[str, ...] | None = None, key: str | None = None,
                   supervisor: Path | None = None) -> None:
    """Compile C ``sources`` (texts) into the shared object ``out``, ``jobs`` compilers at a time, with
    ``FRAME_SYMBOL`` defined in it (and ``KEY_SYMBOL`` as ``key``, a cache key of hex digits, when given).
    ``headers`` (name: bytes) are written into the compile's own directory, the units' include path: the bytes the
    caller's cache key covers, not whatever is on disk by the time the compiler reads it.
    ``sources`` may be a generator that translates as it goes: each unit starts compiling as soon as it is there and
    a compiler is free, so the translation overlaps the compiles instead of preceding them all. At most one unit
    waits for a compiler (the next is translated once it has one), and a unit's source is deleted once compiled:
    the disk holds a few units' C, not the whole program's (a program of a million tiny functions is gigabytes).
    ``supervisor``: a program each compiler runs under (``supervisor PROGRAM ARG0 ARGS…``) that kills everything
    it started when SIGTERMed or when this process dies (berm_host/capabilities/supervise.c)."""
    if children_unseen():
        raise CompileError(SIGCHLD_IGNORED)
    cmd = compiler()
    launcher = [] if supervisor is None else [str(supervisor), cmd[0]]  # it runs PROGRAM by its path
    # "-I.": the units compile in the compile's directory, where the headers are written
    flags = [*(opt if opt is not None else opt_flags()), *BASE_FLAGS, "-I."]
    deadline = time.monotonic() + COMPILE_TIMEOUT
    try:
        tmp = tempfile.TemporaryDirectory(prefix="berm-cc-", dir=out.parent)
    except OSError as exc:
        raise CompileError(f"cannot write the translation into {out.parent}: {exc.strerror or exc}") from None
    with tmp:
        work = Path(tmp.name)
        for name, data in (headers or {}).items():
            _write(work / name, data)
        start = functools.partial(_start, launcher=launcher, tmpdir=work)
        pending: list[tuple[Path, Path]] = []
        objects = []
        pool = _Pool(deadline)

        def start_what_fits() -> None:
            while pending and len(pool.running) < max(1, jobs):
                src, obj = pending.pop(0)
                # by names relative to the unit's directory: the report starts each line with the source's name
                # as given, and a newline in the cache's path broke its lines
                pool.start(start(cmd, [*flags, "-fstack-usage", "-c", src.name, "-o", obj.name], cwd=work), src)
                objects.append(obj)

        try:
            for i, text in enumerate(sources):
                src = work / f"unit{i}.c"
                _write(src, text.encode())
                pending.append((src, work / f"unit{i}.o"))
                pool.reap(block=False)  # those that finished while this unit was translated
                start_what_fits()
                while len(pending) > 1:
                    pool.reap(block=True)
                    start_what_fits()
            while pending or pool.running:
                start_what_fits()
                pool.reap(block=True)
        finally:
            pool.kill()
        objects.append(_frame_object(start, cmd, work, worst_frame([obj.with_suffix(".su") for obj in objects]),
                                     key, deadline))
        link = start(cmd, ["-shared", *BASE_FLAGS, "-o", str(out), *map(str, objects)])
        output = _finish(link, deadline)
        if link.returncode != 0:
            raise CompileError(f"linking {out.name} failed:\n{output[-4000:]}")


def _write(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise CompileError(f"cannot write the translation into {path.parent}: {exc.strerror or exc}") from None


def _start(cmd: list[str], args: list[str], cwd: Path | None = None, *, launcher: Sequence[str] = (),
           tmpdir: Path | None = None) -> subprocess.Popen:
    """The compiler running ``args`` in a session of its own (so that ``_kill`` reaches cc1, as and ld too), under
    ``launcher`` (the supervisor and the compiler's path) when given, its output and errors on one pipe. ``tmpdir``
    takes the temporary files it makes: a compiler killed at the timeout never removes its ``cc*.s``, which
    piled up in /tmp (found by a review); in the compile's own directory they go with it."""
    env = compiler_env() if tmpdir is None else {**compiler_env(), "TMPDIR": str(tmpdir)}
    try:
        proc = subprocess.Popen([*launcher, *cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
                                env=env, start_new_session=True)
    except OSError as exc:
        raise CompileError(f"cannot run the C compiler {cmd[0]!r}: {exc}") from None
    proc.supervised = bool(launcher)  # type: ignore[attr-defined]
    return proc


def _finish(proc: subprocess.Popen, deadline: float) -> str:
    """``proc``'s output once it has exited; the whole session killed, and a CompileError, past ``deadline``."""
    try:
        output, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 0.001))
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise _timeout() from None
    except BaseException:
        _kill(proc)
        raise
    return output.decode(errors="replace")


def _timeout() -> CompileError:
    # the units are translated as they are compiled (a review: "cc took longer" blamed the compiler for both)
    return CompileError(f"translating and compiling took longer than {COMPILE_TIMEOUT} s, all units together")


class _Pool:
    """The unit compilers running at once. ``reap`` takes whichever finishes first, so a core never waits for an
    older unit while a younger one has finished (on two cores, waiting for the oldest left one idle for up to a
    unit's difference in compile time); every compiler's output is read as it comes, so none blocks on a full pipe
    while another is awaited. A compiler has finished when its pipe ends: the driver and the programs it started
    have all exited or closed it."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.running: dict[int, tuple[subprocess.Popen, Path, bytearray]] = {}  # by the fd of its pipe
        self._selector = selectors.DefaultSelector()

    def start(self, proc: subprocess.Popen, src: Path) -> None:
        fd = proc.stdout.fileno()
        self.running[fd] = (proc, src, bytearray())
        self._selector.register(fd, selectors.EVENT_READ)

    def reap(self, *, block: bool) -> None:
        """Reap every compiler that has finished, after waiting, when ``block``, until one has. A compiler that
        failed is a CompileError naming its unit; past the deadline, a CompileError (``kill`` ends the rest)."""
        while self.running:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise _timeout()
            events = self._selector.select(timeout=remaining if block else 0)
            if not events and not block:
                return
            for key, _ in events:
                output = self.running[key.fd][2]
                chunk = os.read(key.fd, 65536)
                output += chunk
                if not chunk:
                    self._reaped(key.fd)
                    block = False  # one has finished: reap the others that have too, then return

    def _reaped(self, fd: int) -> None:
        proc, src, output = self.running[fd]
        try:
            proc.wait(timeout=max(self.deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            raise _timeout() from None
        self._selector.unregister(fd)
        proc.stdout.close()
        del self.running[fd]
        if proc.returncode != 0:
            said = output.decode(errors="replace")
            if said.startswith(_SUPERVISOR_FAILED):  # the compiler never ran: the translation is not to blame
                raise CompileError(f"the C compiler could not be started: {said.strip()[-4000:]}")
            killed = _killed(proc.returncode, said)
            if killed:  # the OOM killer or someone else: blaming the translated code misled (found by a review)
                raise CompileError(f"{killed} compiling {src.name} (out of memory? the translated code is not at "
                                   f"fault){':' if said.strip() else ''}\n{said[-4000:]}".rstrip())
            raise CompileError(f"cc failed on {src.name} (kept nowhere; emitted code is a translator bug, unless "
                               f"the disk is full):\n{said[-4000:]}")
        src.unlink(missing_ok=True)

    def kill(self) -> None:
        """Kill every compiler still running, each with its whole session."""
        for proc, _, _ in self.running.values():
            _kill(proc)
        self.running.clear()
        self._selector.close()


#: How compiler drivers say SIGKILL ended a program they ran (gcc: "cc: fatal error: Killed signal terminated program
#: cc1"; clang: "clang: error: unable to execute command: Killed"). A crash is not one: gcc's "internal compiler
#: error: Segmentation fault signal terminated program cc1" may be the translated code's doing (found by a review).
_DRIVER_SAW_SIGKILL = ("Killed signal terminated program", "unable to execute command: Killed")


def _killed(returncode: int, said: str) -> str | None:
    """Who was killed, when SIGKILL (the OOM killer's, or someone's) ended a compiler that failed: the driver itself
    (the supervisor dies by its command's signal), or a program it ran, which the driver says in its output."""
    if returncode == -signal.SIGKILL:
        return "the C compiler was killed by SIGKILL"
    if any(words in said for words in _DRIVER_SAW_SIGKILL):
        return "a program of the C compiler was killed by SIGKILL"
    return None


def _kill(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s whole session (the driver and the programs it started) and reap the driver. A driver already
    reaped is left alone: its number may name another process group by now. A supervisor is asked first (the
    compiler leads a group of its own under it), and its session killed only if it has not ended within
    SUPERVISOR_GRACE; SIGCONT resumes a stopped one."""
    if proc.returncode is not None:
        return
    if getattr(proc, "supervised", False):
        os.kill(proc.pid, signal.SIGTERM)  # not reaped yet: the number is still its own
        os.kill(proc.pid, signal.SIGCONT)
        try:
            proc.wait(SUPERVISOR_GRACE)
        except subprocess.TimeoutExpired:
            pass
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # the session is empty: everything in it has exited
            pass
    proc.communicate()


def worst_frame(reports: list[Path]) -> int:
    """The largest frame in gcc's -fstack-usage reports (lines ``file:line:col:function<TAB>bytes<TAB>kind``; the
    bytes are an upper bound when the kind is "static" or "dynamic,bounded"). A frame that is only "dynamic" has no
    bound (alloca, variable-length arrays: emitted code has neither)."""
    worst = 0
    for report in reports:
        try:
            lines = report.read_text().splitlines()
        except OSError:
            raise CompileError(f"the C compiler wrote no stack usage report {report.name} (-fstack-usage): the "
                               "runtime needs each object's largest frame") from None
        for line in lines:
            try:
                where, size, kind = line.rsplit("\t", 2)
                size = int(size)
            except ValueError:
                raise CompileError(f"{report.name}: not a stack usage report line: {line!r}") from None
            if kind not in ("static", "dynamic,bounded"):
                raise CompileError(f"{where}: a {kind} stack frame cannot be bounded")
            worst = max(worst, size)
    return worst


def _frame_object(start: Callable[..., subprocess.Popen], cmd: list[str], work: Path, frame: int, key: str | None,
                  deadline: float) -> Path:
    """An object defining FRAME_SYMBOL as ``frame`` + FRAME_SLACK, and KEY_SYMBOL as ``key`` when given."""
    src, obj = work / "frame.c", work / "frame.o"
    text = (f'__attribute__((visibility("default"))) const unsigned long long {FRAME_SYMBOL} = '
            f"{frame + FRAME_SLACK}ULL;\n")
    if key is not None:
        if not key.isalnum() or not key.isascii():
            raise CompileError(f"a cache key is hex digits, not {key[:40]!r}")
        text += f'__attribute__((visibility("default"))) const char {KEY_SYMBOL}[] = "{key}";\n'
    _write(src, text.encode())
    proc = start(cmd, [*BASE_FLAGS, "-c", str(src), "-o", str(obj)])
    output = _finish(proc, deadline)
    if proc.returncode != 0:
        raise CompileError(f"cc failed on {src.name}:\n{output[-4000:]}")
    return obj
