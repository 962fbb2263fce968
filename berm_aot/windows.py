"""The guest memory layout translated code is specialised to: its three bounds windows (berm_host/aot/berm_code.h).

Every bounds check compares against these numbers as C constants, so no register holds a bound; the object exports
them (``berm_layout``) and the core refuses to run it on memory with other windows. They come from the image and
the memory size (berm_host.layout.Layout.windows), and are part of the object's cache key.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The C names of the fields, in order (berm_code.h checks that a unit defines all of them).
C_NAMES = ("BERM_LOAD_LO", "BERM_LOAD_SPAN", "BERM_STORE_LO", "BERM_STORE_SPAN", "BERM_STACK_LO", "BERM_STACK_SPAN")


@dataclass(frozen=True)
class Windows:
    """Each window as (lo, span): an n-byte access at a is inside iff ``(a - lo) mod 2^64 <= span + 8 - n``
    (span = the window's size - 8; an empty window repeats the stack's)."""

    load_lo: int
    load_span: int
    store_lo: int
    store_span: int
    stack_lo: int
    stack_span: int

    def values(self) -> tuple[int, ...]:
        # not dataclasses.astuple, which deep-copies every field: ~50 us of a ~600 us cached load
        return (self.load_lo, self.load_span, self.store_lo, self.store_span, self.stack_lo, self.stack_span)

    def loads_cover_stores(self) -> bool:
        """Whether every byte of the store window lies in the load or the stack window: then an access a store's
        check passed, a load may make unchecked (berm_aot.emit.frames)."""
        def holds(lo: int, span: int) -> bool:
            return (self.store_lo - lo) % 2**64 + self.store_span <= span

        return holds(self.load_lo, self.load_span) or holds(self.stack_lo, self.stack_span)

    def defines(self) -> list[str]:
        """The ``#define`` lines a unit starts with."""
        return [f"#define {name} {value:#x}ull" for name, value in zip(C_NAMES, self.values())]
