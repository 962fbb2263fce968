"""Run a harness's tools on every engine, as an embedder does (``berm_host.engine``): the reference interpreter
and the translated code. One Engine per kind for the whole session, so each image is translated once."""

from __future__ import annotations

import functools

from berm_host.engine import Engine, Harness
from berm_host.linker import Linker

ENGINE_KINDS = ("interp", "aot")


@functools.cache
def engine(kind: str) -> Engine:
    return Engine(kind=kind)


def harness(kind: str, elf: bytes, linker: Linker | None = None, name: str = "test") -> Harness:
    return engine(kind).load(elf).harness(linker, name=name)


class NativeText:
    """A ``berm_sdk.native.NativeHarness`` whose ``call`` returns text, as ``Harness.call`` does."""

    def __init__(self, native):
        self.native = native

    def call(self, tool: str, args: bytes | str = b"") -> str:
        return self.native.call(tool, args).decode("utf-8")
