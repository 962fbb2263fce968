"""The translated engine's invocation boundary: capability replies of every size staged and pulled intact (the
staging buffer grows and is given back), a reply the guest reads only partly, guest memory the core wrote for host
calls restored before the next invocation, and the region registry the host-call callback uses emptying as images
go away."""

from __future__ import annotations

import gc
import weakref

import pytest

from berm_abi.names import fnv1a64
from berm_host import linker as linker_mod
from berm_host.engine import Engine
from tests.guests import raw_harness_elf

SOURCE = r"""
static char args[64];
static char out[3 << 20];
/* Send the arguments to the echo capability; return the reply (first `cap` bytes pulled, cap from args[0]). */
Pair berm_tool_echo(void) {
    u64 n = ecall2(ARGS_READ, (u64)args, sizeof args);
    u64 len = ecall2(ECHO, (u64)args, n) & ~(1ul << 63);
    u64 cap = args[0] == 'p' ? 3 : sizeof out;
    u64 got = ecall2(RESULT_READ, (u64)out, cap);
    Pair p = { (u64)out, got < cap ? got : cap };
    return len == got ? p : (Pair){ 0, 0 };
}
/* Count the non-zero bytes an earlier invocation left in out[] and big[], then have the core write the arguments
 * to big[]: a short write and one overlapping it that ends past it (one range the core widens), then six
 * scattered places (more separate ranges than the core remembers byte-exact). */
static char big[40000];
static char count[24];
Pair berm_tool_residue(void) {
    u64 dirty = 0;
    for (u64 i = 0; i < sizeof out; i++) dirty += out[i] != 0;
    for (u64 i = 0; i < sizeof big; i++) dirty += big[i] != 0;
    ecall2(ARGS_READ, (u64)big + 30001, 4);
    ecall2(ARGS_READ, (u64)big + 30003, 600);
    for (u64 k = 0; k < 6; k++) ecall2(ARGS_READ, (u64)big + 5001 * k + 3, 600);
    u64 n = 0;
    do { count[n++] = '0' + dirty % 10; dirty /= 10; } while (dirty);
    Pair p = { (u64)count, n };
    return p;
}
/* berm.args.read of every length up to 40 at two alignments, into a window of 0xAA: the bytes copied are the
 * arguments' first ones, and the window's bytes around them are untouched. "ok", or "bad <cap> <off>". */
static unsigned char window[64];
static unsigned char whole[64];
static char verdict[16];
static inline __attribute__((always_inline)) Pair slices(u64 number) {
    u64 n = ecall2(number, (u64)whole, sizeof whole);
    for (u64 off = 1; off <= 4; off += 3) {
        for (u64 cap = 0; cap <= 40; cap++) {
            for (u64 i = 0; i < sizeof window; i++) window[i] = 0xAA;
            u64 got = ecall2(number, (u64)window + off, cap);
            u64 copied = n < cap ? n : cap, bad = got != n;
            for (u64 i = 0; i < sizeof window; i++)
                bad |= window[i] != (i >= off && i < off + copied ? whole[i - off] : 0xAA);
            if (bad) {
                verdict[0] = 'b', verdict[1] = 'a', verdict[2] = 'd', verdict[3] = ' ';
                verdict[4] = '0' + cap / 10, verdict[5] = '0' + cap % 10, verdict[6] = ' ', verdict[7] = '0' + off;
                return (Pair){ (u64)verdict, 8 };
            }
        }
    }
    verdict[0] = 'o', verdict[1] = 'k';
    return (Pair){ (u64)verdict, 2 };
}
/* The number a constant the translator knows (ctx->ecall2), or read from writable data at run time (ctx->ecall). */
Pair berm_tool_slices(void) { return slices(ARGS_READ); }
static volatile u64 args_read = ARGS_READ;
Pair berm_tool_slices_later(void) { return slices(args_read); }
"""


@pytest.fixture(scope="module")
def elf() -> bytes:
    return raw_harness_elf(SOURCE, ("echo", "residue", "slices", "slices_later"), {"ECHO": fnv1a64("test.echo")})


def test_replies_of_every_size(tmp_path, elf):
    link = linker_mod.Linker()
    link.define("test.echo", lambda request: b"x" * int(request[1:]))  # "n<size>" or "p<size>"
    harness = Engine(cache_dir=tmp_path).load(elf).harness(link)
    for size in (0, 1, 255, 256, 257, 70000, (1 << 20) + 5, 4, 2 << 20, 7):
        assert harness.call("echo", f"n{size}") == "x" * size
    assert harness.call("echo", "p9") == "xxx"  # a reply pulled in part: berm.result.read returns its full length


@pytest.mark.parametrize("tool", ["slices", "slices_later"])
@pytest.mark.parametrize("kind", ["aot", "interp"])
@pytest.mark.parametrize("args", ["", "a", "abc", "0123456", "01234567", "0123456789abcdef", "0123456789abcdefg",
                                  "the arguments, thirty-nine bytes long!!", "forty-one bytes of arguments, to be cut."])
def test_every_short_copy_is_exact(tmp_path, elf, kind, args, tool):
    """The core copies a few bytes with overlapping moves instead of memcpy (core.c, copy_bytes): each length up to
    40, at two alignments, copies exactly the bytes it should and nothing around them, whether the call's number is
    one the translator knows (core_ecall2) or one read at run time (core_ecall, which hands the copies to it)."""
    assert Engine(kind=kind, cache_dir=tmp_path).load(elf).harness().call(tool, args) == "ok"


def test_core_writes_do_not_survive_the_invocation(tmp_path, elf):
    link = linker_mod.Linker()
    link.define("test.echo", lambda request: b"y" * int(request[1:]))
    harness = Engine(cache_dir=tmp_path).load(elf).harness(link)
    assert harness.call("residue", "z" * 600) == "0"
    assert harness.call("residue", "short") == "0"  # six scattered 600-byte writes restored
    assert harness.call("echo", f"n{2 << 20}") == "y" * (2 << 20)  # berm.result.read wrote 2 MiB of out[]
    assert harness.call("residue", "") == "0"


def test_a_pooled_region_dies_with_its_image(tmp_path, elf):
    """The core only borrows each region's HostCalls.serve (its Region owns it), and serve holds no reference back
    to the Region: once the image is gone, so is its pooled region."""
    link = linker_mod.Linker()
    link.define("test.echo", lambda request: b"ok")
    image = Engine(cache_dir=tmp_path).load(elf)
    assert image.harness(link).call("echo", "n0") == "ok"
    region = weakref.ref(image.backend.memory.pool[-1])
    del image
    gc.collect()
    assert region() is None


class _EmptyButTrue(list):
    """A pool another thread emptied between a check of it and its pop (which the check cannot see)."""

    def __bool__(self):
        return True


def test_an_emptied_pool_gives_a_new_region(tmp_path, elf):
    """``pool.pop() if pool else Region(...)`` raised IndexError when another thread took the last region between
    the check and the pop: the hot path and ``acquire`` pop and make a region when there was none."""
    link = linker_mod.Linker()
    link.define("test.echo", lambda request: b"ok")
    image = Engine(cache_dir=tmp_path).load(elf)
    memory = image.backend.memory
    memory.pool = _EmptyButTrue()
    assert image.harness(link).call("echo", "n0") == "ok"
    memory.pool = _EmptyButTrue()
    memory.release(memory.acquire())
