"""Run a harness's tools the way the host does, on the engines that exist: the reference interpreter
(``berm_host.interp``) and the native build of the SDK (``berm_sdk.native``). Shared by the SDK's harness tests."""

from __future__ import annotations

from berm_aot.elf import read_elf
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.interp import InterpBackend
from berm_host.linker import Linker
from berm_host.traps import Trap, ToolFailure


class Interp:
    """Calls a tool as the host does (ABI.md §3): a trap raises Trap, a failure beats the result (ToolFailure),
    and the result must be UTF-8."""

    def __init__(self, elf: bytes, linker: Linker | None = None):
        self.program = Program.from_image(read_elf(elf))
        self.backend = InterpBackend(self.program)
        self.linker = linker or Linker()

    def run(self, tool: str, args: bytes = b""):
        return self.backend.run(RunRequest(entry=self.program.symbol(f"berm_tool_{tool}"), args=args,
                                           linker=self.linker, read_result=True))

    def call(self, tool: str, args: bytes | str = b"") -> bytes:
        result = self.run(tool, args.encode() if isinstance(args, str) else args)
        if result.trap is not None:
            raise Trap(result.trap, tool)
        if result.failure is not None:
            raise ToolFailure(tool, result.failure.decode("utf-8", "replace"))
        assert result.result is not None, "the result points outside guest memory"
        result.result.decode("utf-8")
        return result.result
