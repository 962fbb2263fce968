"""Run hand-assembled snippets on the reference interpreter (shared by the tests/test_interp_*.py files)."""

from __future__ import annotations

from berm_aot.program import Program
from berm_host.backend import RunRequest, RunResult
from berm_host.interp import InterpBackend
from tests import progen
from tests.rvenc import Op, li

RET = Op("jalr", rs1=1)


def run_snippet(ops: list, *, regs: dict[int, int] | None = None, data: bytes = b"", helpers=(),
                table: tuple[str, ...] = (), memory_size: int = progen.MEMORY_SIZE, **request) -> RunResult:
    """Run ``ops`` as the body of ``f0`` (after ``li`` of each of ``regs``, before a final ``ret``); ``helpers`` are
    further ``progen.Function``s laid out after it. Extra keyword arguments go to the ``RunRequest``."""
    image = snippet_image(ops, regs=regs, data=data, helpers=helpers, table=table)
    backend = InterpBackend(Program.from_image(image), memory_size)
    return backend.run(RunRequest(entry=image.entry, **request))


def snippet_image(ops: list, *, regs: dict[int, int] | None = None, data: bytes = b"", helpers=(),
                  table: tuple[str, ...] = ()):
    """The image ``run_snippet`` runs."""
    setup = [op for r, v in (regs or {}).items() for op in li(r, v)]
    return progen.build_image([progen.Function("f0", [*setup, *ops, RET]), *helpers], data=data, table=table)
