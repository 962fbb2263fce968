"""Guest memory of one invocation: an anonymous private mapping of the whole guest size.

The mapping is made with ``mmap`` so that 64 MiB (or 4 GiB) of guest memory costs nothing until touched: the
kernel hands out zero pages lazily, and releasing the mapping at the end of the run frees everything. That gives
"fresh memory per invocation" for the price of copying the ELF's segment bytes.

This class only holds the bytes; what is readable or writable is ``berm_host.layout.Layout``'s to say, checked by
the instruction handlers (``semantics``) and the host calls (``hostcalls``) before every access.
"""

from __future__ import annotations

import mmap

from berm_aot.image import ElfImage
from berm_host.layout import Layout
from berm_host.traps import HostError


class GuestMemory:
    """``layout.size`` bytes, initialised from ``image``'s segments."""

    __slots__ = ("layout", "buf")

    def __init__(self, image: ElfImage, layout: Layout):
        self.layout = layout
        try:
            self.buf = mmap.mmap(-1, layout.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as exc:
            raise HostError(f"cannot map {layout.size} bytes of guest memory: {exc.strerror or exc}") from None
        for seg in image.segments:
            if seg.data:
                self.buf[seg.vaddr:seg.vaddr + len(seg.data)] = seg.data

    def close(self) -> None:
        self.buf.close()

    def copy_out(self, addr: int, n: int) -> bytes:
        """A copy of ``[addr, addr+n)`` for snapshots: bytes outside guest memory read as zero, never a fault."""
        out = bytearray(n)
        lo, hi = max(addr, 0), min(addr + n, self.layout.size)
        if lo < hi:
            out[lo - addr:hi - addr] = self.buf[lo:hi]
        return bytes(out)
