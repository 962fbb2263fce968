"""Translated code is specialised to its guest memory layout: its bounds checks compare against the windows of the
image in memory of one size, as constants (berm_host/aot/berm_code.h). The windows must say exactly what the
layout allows; code translated for one size must never run on memory of another (the core refuses it); and one image
on engines of different sizes must fault at each size's own edges, exactly as the interpreter does."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from berm_aot import cc
from berm_aot.elf import read_elf
from berm_aot.errors import ElfError
from berm_aot.program import Program
from berm_aot.windows import Windows
from berm_host.aot.backend import AotBackend
from berm_host.aot.objects import compile_programs
from berm_host.aot.runtime import load_code
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.layout import Layout, layout_for
from berm_host.traps import HostError
from tests.guests import guest_elf

SOURCE = r"""
typedef unsigned long u64;
u64 data_word = 5;
/* Store v at addr, then load it back: the store and the load each check their own window. */
u64 poke(u64 addr, u64 v) {
    u64 out;
    __asm__ volatile("sd %2, 0(%1)\n ld %0, 0(%1)" : "=r"(out) : "r"(addr), "r"(v) : "memory");
    return out;
}
/* Load 4 bytes at addr. */
u64 peek(u64 addr, u64 unused) {
    unsigned out;
    __asm__ volatile("lw %0, 0(%1)" : "=r"(out) : "r"(addr) : "memory");
    return out + data_word;
}
void _start(void) {}
"""

#: From the smallest memory an image linked at 64 KiB fits in to the largest ABI.md §5 allows (above 2**31 and
#: 2**32: found untested by a review).
SIZES = (128 << 10, 256 << 10, 1 << 20, 4 << 20, 64 << 20, 2 << 30, 4 << 30)


@pytest.fixture(scope="module")
def elf():
    return guest_elf(SOURCE, keep=("poke", "peek"))


def inside(lo: int, span: int, addr: int, n: int) -> bool:
    """berm_code.h's one-compare window test."""
    return (addr - lo) % (1 << 64) <= span + 8 - n


def edges(layout: Layout) -> list[int]:
    points = {layout.image_lo, layout.writable_lo, layout.image_end, layout.heap_start, layout.guard_lo,
              layout.stack_lo, layout.size}
    return sorted({p + d for p in points for d in (-9, -8, -7, -4, -1, 0, 1, 4, 7, 8)} | {0, 2**64 - 4, 2**64 - 8})


@pytest.mark.parametrize("size", SIZES)
def test_windows_say_exactly_what_the_layout_allows(elf, size):
    layout = layout_for(read_elf(elf), size)
    w = layout.windows()
    for addr in edges(layout):
        for n in (1, 2, 4, 8):
            loadable = inside(w.load_lo, w.load_span, addr, n) or inside(w.stack_lo, w.stack_span, addr, n)
            storable = inside(w.store_lo, w.store_span, addr, n) or inside(w.stack_lo, w.stack_span, addr, n)
            assert loadable == layout.readable(addr, n), (hex(addr), n)
            assert storable == layout.writable(addr, n), (hex(addr), n)


def test_the_core_compares_every_layout_number():
    """berm_load compares BERM_LAYOUT_WORDS numbers: exactly the fields of Windows, which the object exports."""
    from dataclasses import fields

    from berm_aot.windows import C_NAMES, Windows
    from berm_host.aot.runtime import lib

    assert len(fields(Windows)) == len(C_NAMES) == lib.BERM_LAYOUT_WORDS


def test_windows_values_are_the_fields_in_order():
    """``values()`` is what the C defines and the core's layout check read, by position."""
    fields = [f.name for f in dataclasses.fields(Windows)]
    assert Windows(*range(6)).values() == tuple(range(6)) and len(fields) == 6


def test_a_read_only_segment_above_writable_data_is_refused_for_either_engine():
    """Stores are allowed from one address up (``writable_lo``): a read-only segment above writable data would be
    writable. Found untested by a review."""
    data = SimpleNamespace(vaddr=0x10000, memsz=0x100, end=0x10100, writable=True)
    code = SimpleNamespace(vaddr=0x11000, memsz=0x100, end=0x11100, writable=False)
    with pytest.raises(ElfError, match="read-only segment at 0x11000 lies above writable data at 0x10000"):
        layout_for(SimpleNamespace(segments=[data, code]), 1 << 20)
    above = SimpleNamespace(vaddr=0x12000, memsz=0x100, end=0x12100, writable=True)
    assert layout_for(SimpleNamespace(segments=[code, above]), 1 << 20).writable_lo == 0x12000


def test_a_window_of_one_to_seven_bytes_is_refused_for_either_engine():
    """Translated code's windows cannot hold 1..7 bytes. The refusal was in ``windows``, which only the translated
    engine asks for, so the interpreter ran the image (found by a review); ``layout_for`` serves both."""
    code = SimpleNamespace(vaddr=0x10000, memsz=0x100, end=0x10100, writable=False)
    data = SimpleNamespace(vaddr=0xBEFFB, memsz=5, end=0xBF000, writable=True)  # 1 MiB: the guard at 0xBF000
    with pytest.raises(ElfError, match="the writable data at 0xbeffb leaves only 5 bytes before the guard page"):
        layout_for(SimpleNamespace(segments=[code, data]), 1 << 20)
    base = dict(size=1 << 20, image_lo=0x1000, image_end=0x2000, heap_start=0x2000, stack_lo=0xC0000)
    empty = Layout(writable_lo=0xBF000, guard_lo=0xBF000, **base).windows()
    assert (empty.store_lo, empty.store_span) == (empty.stack_lo, empty.stack_span)  # repeats the stack's


def test_code_for_other_memory_is_refused(elf, tmp_path):
    """An object translated for 64 MiB would check 16 MiB of memory against 64 MiB's bounds: the core refuses it."""
    program = Program.from_image(read_elf(elf))
    so = tmp_path / "big.so"
    compile_programs([(program, layout_for(program.image, 64 << 20).windows(), "")], so)
    AotBackend(program, 64 << 20, code=(so, ""))  # the size it was translated for loads
    with pytest.raises(HostError, match="translated for another memory layout") as refused:
        AotBackend(program, 16 << 20, code=(so, ""))
    # found by a review: the stack window's start was named whatever differed ("0xc0000, not 0xc0000")
    big, small = (layout_for(program.image, size).windows().values() for size in (64 << 20, 16 << 20))
    names = ["load window's start", "load window's span", "store window's start", "store window's span",
             "stack window's start", "stack window's span"]
    w = next(i for i in range(6) if big[i] != small[i])
    assert f"(its {names[w]} is {big[w]:#x}, this memory's {small[w]:#x})" in str(refused.value)


@pytest.mark.parametrize("unit, message", [
    ("const int berm_rt_abi = 9;", "was built for runtime ABI 9, this runtime is"),  # before berm_max_frame
    ("int other(void) { return 0; }", "is not a translated image"),
])
def test_objects_of_another_runtime_or_none_are_refused_by_name(elf, tmp_path, unit, message):
    so = tmp_path / "other.so"
    cc.compile_shared([f'__attribute__((visibility("default"))) {unit}'], so)
    with pytest.raises(HostError, match=message):
        load_code(str(so), "", layout_for(read_elf(elf)).windows())


@pytest.mark.parametrize("size", SIZES)
def test_one_image_faults_at_each_sizes_own_edges(elf, size, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "layout-cache"
    image = read_elf(elf)
    layout = layout_for(image, size)
    backends = [Engine(kind=kind, memory_size=size, cache_dir=cache).load(elf).backend for kind in ("aot", "interp")]
    poke, peek = (next(s.value for s in image.symbols if s.name == name) for name in ("poke", "peek"))
    for addr in edges(layout):
        for entry in (poke, peek):
            request = RunRequest(entry=entry, int_args=(addr, 0x1122334455667788))
            aot, interp = (b.run(request) for b in backends)
            assert aot.trap == interp.trap, (hex(addr), size)
            assert aot.a0 == interp.a0, (hex(addr), size)
