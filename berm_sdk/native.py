"""Build the SDK (and a harness's sources) for the host and call its tools in-process.

The RFC's "the SDK also builds for the host": off the guest target, ``berm_host_call`` is served by
harnesses/sdk/host/shim.c, so a tool runs exactly as the host would run it — the same argument pull, the same
failure channel, the same staged capability replies — but as ordinary native code that tests can call in
microseconds. Capabilities are served by Python stand-ins; a call with no stand-in panics naming its number.

This is a test harness for code, not a sandbox: native code runs unconfined in this process.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from berm_abi.errors import BermError
from berm_abi.names import CORE_BY_NAME, KNOWN_NAMES, fnv1a64
from berm_host.layout import failure_text
from berm_host.linker import CapabilityError
from berm_host.traps import HostError, ToolFailure

from .build import sdk_sources
from .cache import SDK_DIR
from .errors import BuildError
from .header import write_calls_header

#: Host compiler flags: freestanding like the guest, with the SDK's own mem*/malloc bound inside the library
#: (-Bsymbolic) rather than the process's libc; gcc must not turn the mem* loops into calls to themselves.
#: libgcc (added after the sources) is the host's compiler runtime, as compiler-rt is the guest's: __int128
#: division and the like.
NATIVE_CFLAGS = ("-shared", "-fPIC", "-O2", "-g", "-std=gnu11", "-ffreestanding", "-fno-builtin", "-nostdlib",
                 "-fno-stack-protector", "-fno-tree-loop-distribute-patterns", "-Wall",
                 "-Wl,-Bsymbolic", "-Wl,-z,defs")

_LOG = CORE_BY_NAME["berm.log"].number


class NativePanic(BermError):
    """The native build of a tool panicked (berm_panic, or a host call nobody serves)."""


def build_native_library(sources: Sequence[Path], out: Path, *, include: Sequence[Path] = ()) -> Path:
    """Compile the SDK, the host shim and ``sources`` with the host ``cc`` into the shared library ``out``."""
    cc = shutil.which("cc")
    if cc is None:
        raise BuildError("building the SDK for the host needs a C compiler named cc")
    with tempfile.TemporaryDirectory(prefix="berm-native-") as tmp:
        write_calls_header(Path(tmp))
        cmd = [cc, *NATIVE_CFLAGS, f"-I{SDK_DIR}", f"-I{tmp}", *[f"-I{p}" for p in include],
               *map(str, [*sdk_sources(), SDK_DIR / "host" / "shim.c", *sources]), "-lgcc", "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"building {out.name} for the host failed:\n{proc.stderr.strip()}")
    return out


class _Result(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_uint64), ("len", ctypes.c_uint64)]


_HOST_FN = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64)


class NativeHarness:
    """Tools of a natively built harness library, called like the host calls them.

    ``capabilities`` maps capability names to stand-ins (request frame bytes → reply bytes, raising
    CapabilityError for the capability's own failures). The library's state is process-global: use one
    NativeHarness per library at a time, from one thread.
    """

    def __init__(self, library: Path, capabilities: Mapping[str, Callable[[bytes], bytes]] | None = None):
        self.lib = ctypes.CDLL(str(library), mode=ctypes.RTLD_LOCAL)
        self.capabilities = {fnv1a64(name): fn for name, fn in (capabilities or {}).items()}
        self.logs: list[bytes] = []
        self._staged = ctypes.create_string_buffer(0)
        self._error: BaseException | None = None
        self._unserved: int | None = None  # a capability the tool called with no stand-in: its panic's number
        self._host = _HOST_FN(self._serve)
        self.lib.berm_shim_invoke.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                              ctypes.POINTER(_Result)]
        self.lib.berm_shim_failure.restype = ctypes.c_void_p
        self.lib.berm_shim_failure.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2
        self.lib.berm_shim_panic_text.restype = ctypes.c_char_p
        self.lib.berm_shim_stage.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_bool]
        self.lib.berm_shim_set_host.argtypes = [_HOST_FN]

    def _serve(self, number: int, request: int | None, length: int) -> bool:
        try:
            data = ctypes.string_at(request, length) if length else b""
            if number == _LOG:
                self.logs.append(data)
                return True
            fn = self.capabilities.get(number)
            if fn is None:
                self._unserved = number
                return False
            try:
                reply, is_error = bytes(fn(data)), False
            except CapabilityError as exc:
                reply, is_error = str(exc).encode("utf-8", "replace"), True
            self._staged = ctypes.create_string_buffer(reply, len(reply))
            self.lib.berm_shim_stage(self._staged, len(reply), is_error)
            return True
        except BaseException as exc:  # re-raised by call(); an exception must not unwind through C
            self._error = exc
            return False

    def call(self, tool: str, args: bytes | str = b"") -> bytes:
        """The tool's result bytes; ToolFailure when it called berm.fail, NativePanic when it panicked."""
        try:
            fn = getattr(self.lib, f"berm_tool_{tool}")
        except AttributeError:
            raise HostError(f"the library exports no tool {tool!r}") from None
        blob = args.encode("utf-8") if isinstance(args, str) else bytes(args)
        out = _Result()
        self._error = self._unserved = None
        self.lib.berm_shim_set_host(self._host)
        status = self.lib.berm_shim_invoke(ctypes.cast(fn, ctypes.c_void_p), blob, len(blob), ctypes.byref(out))
        if self._error is not None:
            raise self._error
        if status == 2:
            said = self.lib.berm_shim_panic_text().decode("utf-8", "replace")
            if self._unserved is not None:  # the shim's "no host function for call N", named
                name = KNOWN_NAMES.get(self._unserved, "a name Berm does not know")
                said += f" ({name}): no stand-in capability for it"
            raise NativePanic(f"{tool} panicked: {said}")
        if status == 1:
            n, asked = ctypes.c_size_t(), ctypes.c_size_t()
            head = ctypes.string_at(self.lib.berm_shim_failure(ctypes.byref(n), ctypes.byref(asked)), n.value)
            raise ToolFailure(tool, failure_text(head, asked.value).decode("utf-8", "replace"))
        return ctypes.string_at(out.ptr, out.len) if out.len else b""
