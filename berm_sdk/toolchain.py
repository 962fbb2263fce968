"""Drive the guest C toolchain: clang and ld.lld for riscv64, from PyPI ``ziglang`` by default.

Set ``BERM_GUEST_TOOLCHAIN=llvm`` to use Debian's ``clang-22``/``ld.lld-22`` instead (when installed). Every
guest is RV64IMAC, LP64, soft-float, linked with ``--emit-relocs`` (the host's CFI needs the relocations) and
against compiler-rt (berm_sdk.runtime), so ``double``, ``float`` and ``__int128`` work in guest C.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from berm_abi.errors import BermError
from berm_aot.cc import compiler_env


class ToolchainError(BermError):
    """The guest toolchain is missing, or compiling or linking a guest failed (the compiler's words attached)."""


#: The LLVM feature that lets the compiler use misaligned scalar loads and stores. Berm's guest memory serves them
#: at no extra cost (docs/SEMANTICS.md: misaligned plain accesses are allowed; atomics must be aligned), and without
#: it clang builds every possibly-misaligned word from eight byte loads: the SDK's word-at-a-time memchr and memcpy
#: ran ~30 guest instructions per word instead of one load.
UNALIGNED_FEATURE = "unaligned_scalar_mem"

#: Flags every guest object is compiled with (after the target flags).
GUEST_CFLAGS = (
    "-ffreestanding", "-fno-builtin-printf", "-nostdlib", "-fomit-frame-pointer",
    "-ffunction-sections", "-fdata-sections", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables",
    "-fno-stack-protector", "-fno-sanitize=undefined", "-g0", "-Wall",
)


@dataclass(frozen=True)
class Toolchain:
    cc: tuple[str, ...]  # command prefix for the compiler, target flags included
    ld: tuple[str, ...]  # command prefix for the linker
    name: str

    def identity(self) -> str:
        """Which compiler this is, cheaply: part of every cache key that depends on guest builds (upgrading
        ziglang, or Debian's clang-22 in place, kept the same command). The installed ziglang's version; for a
        compiler on PATH, its file's size and modification time (an upgrade replaces the file)."""
        if self.name == "ziglang":
            return f"ziglang {zig_version()}"
        try:
            st = os.stat(self.cc[0])
        except OSError:
            return f"{self.cc[0]} (missing)"
        return f"{self.cc[0]} {st.st_size} {st.st_mtime_ns}"


def zig_version() -> str:
    """The installed PyPI ziglang's version (its clang, lld and the compiler-rt sources berm_sdk.runtime builds)."""
    try:
        return importlib.metadata.version("ziglang")
    except importlib.metadata.PackageNotFoundError:
        raise ToolchainError("building a guest needs the PyPI ziglang package (its clang and lld, and compiler-rt's "
                             "soft-float and 128-bit integer helpers): pip install ziglang") from None


def zig_toolchain() -> Toolchain:
    py = sys.executable
    return Toolchain(
        cc=(py, "-m", "ziglang", "cc", "-target", "riscv64-freestanding-none",
            f"-mcpu=baseline_rv64-d-f+{UNALIGNED_FEATURE}",
            "-mcmodel=medany"),  # code addresses via auipc (PCREL_HI20), as ABI.md §6 expects
        ld=(py, "-m", "ziglang", "ld.lld"),
        name="ziglang",
    )


def _llvm() -> Toolchain:
    clang, lld = shutil.which("clang-22"), shutil.which("ld.lld-22")
    if not clang or not lld:
        raise ToolchainError("BERM_GUEST_TOOLCHAIN=llvm needs clang-22 and ld.lld-22 (apt install clang-22 lld-22)")
    return Toolchain(
        cc=(clang, "--target=riscv64-unknown-elf", "-march=rv64imac", "-mabi=lp64", "-mcmodel=medany",
            "-mno-strict-align"),  # the same as UNALIGNED_FEATURE, in clang's driver
        ld=(lld,),
        name="llvm",
    )


def guest_toolchain() -> Toolchain:
    choice = os.environ.get("BERM_GUEST_TOOLCHAIN", "zig")
    if choice == "zig":
        return zig_toolchain()
    if choice == "llvm":
        return _llvm()
    raise ToolchainError(f"BERM_GUEST_TOOLCHAIN must be 'zig' or 'llvm', not {choice!r}")


def run_tool(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    """Run a compiler or linker; its diagnostics (stderr) when it succeeds, a ToolchainError with them when not.
    It runs without the variables that would change its output (berm_aot.cc.compiler_env): what it builds is cached
    under keys that do not cover the environment (CCC_OVERRIDE_OPTIONS=+-O0 changed the SDK objects and bundled
    images one process built for every later one: found by a review)."""
    try:
        # errors="replace": a diagnostic naming a source whose name is no UTF-8 was a UnicodeDecodeError traceback
        # (found by a review)
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False, timeout=300,
                              cwd=cwd, env=compiler_env())
    except FileNotFoundError as exc:
        raise ToolchainError(f"{what}: {exc.filename} not found") from None
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what}: timed out after 300 s") from None
    if proc.returncode != 0:
        raise ToolchainError(f"{what} failed:\n{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stderr.strip()


def compile_object(source: Path, out: Path, *, opt: str = "-O2", include: tuple[Path, ...] = (),
                   defines: tuple[str, ...] = (), flags: tuple[str, ...] = (),
                   toolchain: Toolchain | None = None, warnings: list[str] | None = None) -> Path:
    """Compile ``source`` into ``out``; the compiler's warnings, if any, are appended to ``warnings``."""
    tc = toolchain or guest_toolchain()
    cmd = [*tc.cc, opt, *GUEST_CFLAGS, *flags, *[f"-I{p}" for p in include], *[f"-D{d}" for d in defines],
           "-c", str(source), "-o", str(out)]
    said = run_tool(cmd, f"compiling {source}")
    if said and warnings is not None:
        warnings.append(said)
    return out


def link(objects: list[Path], out: Path, *, entry: str = "_start", linker_script: Path | None = None,
         keep: tuple[str, ...] = (), toolchain: Toolchain | None = None) -> Path:
    """Link a static RV64 executable with ``--emit-relocs`` and ``--gc-sections``, against the compiler runtime
    (berm_sdk.runtime); ``keep`` names symbols that must survive garbage collection (``--undefined``)."""
    from .runtime import runtime_inputs  # imported here: runtime builds with this module's helpers

    tc = toolchain or guest_toolchain()
    cmd = [*tc.ld, "--emit-relocs", "--gc-sections", "-static", "-e", entry,
           *[f"--undefined={k}" for k in keep]]
    if linker_script is not None:
        cmd += ["-T", str(linker_script)]
    cmd += [str(o) for o in [*objects, *runtime_inputs()]] + ["-o", str(out)]
    run_tool(cmd, f"linking {out.name}")
    return out


def build_program(sources: list[Path], out: Path, *, opt: str = "-O2", entry: str = "_start",
                  include: tuple[Path, ...] = (), linker_script: Path | None = None,
                  keep: tuple[str, ...] = ()) -> Path:
    """Compile each C or assembly source and link them into ``out``; returns ``out``."""
    tc = guest_toolchain()
    objects = []
    for src in sources:
        obj = out.parent / f"{out.stem}.{src.stem}.o"
        compile_object(src, obj, opt=opt, include=include, toolchain=tc)
        objects.append(obj)
    return link(objects, out, entry=entry, linker_script=linker_script, keep=keep, toolchain=tc)
