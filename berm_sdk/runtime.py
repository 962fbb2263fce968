"""The compiler runtime every guest links against: compiler-rt's helpers for RV64IMAC soft-float.

A guest is built ``-nostdlib`` for a target without F/D, so the compiler lowers ``double``/``float`` arithmetic and
conversions, ``__int128`` multiplication and division and the like to calls (``__adddf3``, ``__divti3``, …). The
PyPI ``ziglang`` package ships compiler-rt's source; it is built once per zig version and flag set into a static
archive in the SDK cache, and the linker pulls in only what a guest references (``--gc-sections`` drops the rest).
Both guest toolchains (zig and ``BERM_GUEST_TOOLCHAIN=llvm``) link this same runtime.

compiler-rt's division rounds subnormal quotients wrongly, so harnesses/sdk/runtime/divide.c replaces
``__divdf3`` and ``__divsf3``: an object linked ahead of the archive, whose definitions (strong) win over
compiler-rt's (weak). zig's compiler-rt always rounds to nearest-even and never reads ``frm``/``fflags``, and for
this target it holds no F/D or CSR instruction, so the images stay legal Berm guests; ``berm build`` checks every
image anyway.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
from pathlib import Path

from .cache import SDK_DIR, cache_root, cached_dir
from .toolchain import GUEST_CFLAGS, ToolchainError, compile_object, run_tool, zig_toolchain, zig_version

#: How compiler-rt is compiled: the guest target and code model (code addresses via auipc, ABI.md §6), small
#: code, one section per function so unused helpers are garbage-collected, and no unwind tables (.eh_frame would
#: bring relocations the host has no use for). ``+relax`` matters: zig names compiler-rt's internal functions
#: ``.L…``, which the program model (berm_aot/program.py) never takes for function starts, so an unrelaxed
#: ``auipc``/``jalr`` call to one is an indirect call to an unknown target and traps. Relaxable, ld.lld turns every
#: such call into a direct ``jal`` (compiler-rt's code is contiguous and far smaller than jal's ±1 MiB reach), and
#: a direct call's target is a function start.
RUNTIME_FLAGS = (
    "-target", "riscv64-freestanding-none", "-mcpu=baseline_rv64-d-f+relax", "-mcmodel=medany", "-OReleaseSmall",
    "-ffunction-sections", "-fdata-sections", "-fno-unwind-tables", "-fomit-frame-pointer",
    "-fno-stack-protector", "-fno-emit-h",
)
#: The C that replaces compiler-rt members, compiled like guest code by the zig toolchain.
OVERRIDES = (SDK_DIR / "runtime" / "divide.c",)
_ARCHIVE = "libcompiler_rt.a"


def runtime_key() -> str:
    """A digest of what the runtime is built from (the zig version, the flags, the overriding C): its cache key, and
    part of the key of anything cached that links it."""
    parts = ["compiler-rt", zig_version(), *RUNTIME_FLAGS, *zig_toolchain().cc, *GUEST_CFLAGS]  # overrides: zig cc
    digest = hashlib.sha256("\0".join(parts).encode())
    for path in OVERRIDES:
        digest.update(b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]


def _compiler_rt_source() -> Path:
    spec = importlib.util.find_spec("ziglang")
    roots = list(spec.submodule_search_locations or ()) if spec else []
    for root in roots:
        path = Path(root) / "lib" / "compiler_rt.zig"
        if path.is_file():
            return path
    raise ToolchainError(f"the ziglang package ({', '.join(roots) or 'not found'}) has no lib/compiler_rt.zig")


def _build(work: Path) -> None:
    """Compile the overrides and compiler-rt into ``work``."""
    for source in OVERRIDES:
        compile_object(source, work / f"{source.stem}.o", toolchain=zig_toolchain())
    # cwd=work: zig names the archive's member after its (relative) cache path.
    run_tool([sys.executable, "-m", "ziglang", "build-lib", "-static", *RUNTIME_FLAGS, "-j1", "--name", "compiler_rt",
          "--cache-dir", "zig-cache", f"-femit-bin={work / _ARCHIVE}", str(_compiler_rt_source())],
         "building compiler-rt", cwd=work)
    shutil.rmtree(work / "zig-cache", ignore_errors=True)
    if not (work / _ARCHIVE).is_file():
        raise ToolchainError(f"building compiler-rt wrote no {_ARCHIVE}")


def runtime_inputs() -> list[Path]:
    """What every guest link appends after its own objects: the override objects, then the compiler-rt archive.
    Built into the cache the first time (a few seconds)."""
    cached = cached_dir(cache_root() / "compiler-rt" / runtime_key(), _build)
    return [*(cached / f"{source.stem}.o" for source in OVERRIDES), cached / _ARCHIVE]
