"""Build small guest programs for tests, cached by content so a test run compiles each snippet once.

``guest_elf(c_source)`` compiles C text for RV64IMAC and returns the ELF bytes. The cache lives under
``$BERM_TEST_CACHE`` or ``.pytest_cache/berm-guests`` and is keyed by the source, the build options, the
toolchain command, ``berm_sdk.toolchain.GUEST_CFLAGS`` and the compiler runtime's key.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from berm_sdk.runtime import runtime_key
from berm_sdk.toolchain import GUEST_CFLAGS, build_program, guest_toolchain

_ROOT = Path(__file__).resolve().parent.parent


def _cache_dir() -> Path:
    d = Path(os.environ.get("BERM_TEST_CACHE", _ROOT / ".pytest_cache" / "berm-guests"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def guest_elf(source: str, *, opt: str = "-O2", suffix: str = ".c", entry: str = "_start",
              keep: tuple[str, ...] = ()) -> bytes:
    """The ELF bytes of ``source`` (C, or assembly with ``suffix=".S"``) built as a static RV64IMAC program.

    The program needs an entry symbol (``_start`` by default); ``keep`` lists further symbols to keep alive.
    """
    tc = guest_toolchain()
    parts = [source, opt, suffix, entry, *keep, *tc.cc, *tc.ld, *GUEST_CFLAGS, runtime_key()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    out = _cache_dir() / f"{key}.elf"
    if not out.exists():
        work = _cache_dir() / f"{key}.work{os.getpid()}"
        work.mkdir(exist_ok=True)
        src = work / f"prog{suffix}"
        src.write_text(source)
        tmp = build_program([src], work / "prog.elf", opt=opt, entry=entry, keep=keep)
        os.replace(tmp, out)
    return out.read_bytes()


#: The scaffold of a harness written against raw ecalls: types, a two-argument ecall, and every host-call number
#: of berm_abi.names as a #define named by its C name (ARGS_READ, FAIL, FS_READ, …).
_RAW_PRELUDE = r"""
typedef unsigned long u64;
typedef struct { u64 ptr, len; } Pair;
static inline u64 ecall2(u64 n, u64 a0, u64 a1) {
    register u64 r_a0 __asm__("a0") = a0, r_a1 __asm__("a1") = a1, r_a7 __asm__("a7") = n;
    __asm__ volatile("ecall" : "+r"(r_a0) : "r"(r_a1), "r"(r_a7) : "memory");
    return r_a0;
}
"""


def raw_harness_elf(body: str, tools: tuple[str, ...], defines: dict[str, int] | None = None, *,
                    opt: str = "-O2", keep: tuple[str, ...] = (), parameters: object = None) -> bytes:
    """A harness image from C ``body`` (which defines ``berm_tool_<t>`` for each of ``tools``): the raw-ecall
    prelude, the call numbers and ``defines`` as ``#define``s, a ``.berm.abi`` manifest declaring ``tools`` (each
    with ``parameters``, default ``{}``) and an empty ``_start``. ``keep`` names further functions to keep alive
    (e.g. for ``berm run``-style entry)."""
    from berm_abi.names import CAPABILITY_CALLS, CORE_CALLS

    numbers = {c.c_name: c.number for c in CORE_CALLS + CAPABILITY_CALLS} | (defines or {})
    parameters = {} if parameters is None else parameters
    manifest = json.dumps({"abi_version": 0, "tools": [{"name": t, "description": "", "parameters": parameters}
                                                        for t in tools]})
    source = "\n".join([_RAW_PRELUDE, *(f"#define {k} {v:#x}ul" for k, v in numbers.items()), body,
                        '__attribute__((section(".berm.abi"), used, retain)) static const char manifest[] = '
                        f"{json.dumps(manifest)};", "void _start(void) {}", ""])
    return guest_elf(source, opt=opt, keep=(*(f"berm_tool_{t}" for t in tools), *keep))


_RELAY = r"""
static char out[256];
static char buf[256];
Pair berm_tool_ok(void) { out[0] = 'o'; out[1] = 'k'; Pair p = { (u64)out, 2 }; return p; }
Pair berm_tool_spin(void) { for (volatile u64 i = 0; ; i++) {} }
/* The arguments to x.cap; its reply, "E:" first when it is an error reply. */
Pair berm_tool_cap(void) {
    u64 n = ecall2(ARGS_READ, (u64)buf, sizeof buf);
    u64 r = ecall2(X_CAP, (u64)buf, n < sizeof buf ? n : sizeof buf);
    u64 len = r & ~(1ul << 63), off = 0;
    if (len > sizeof out - 2) len = sizeof out - 2;
    if (r >> 63) { out[0] = 'E'; out[1] = ':'; off = 2; }
    ecall2(RESULT_READ, (u64)out + off, len);
    Pair p = { (u64)out, len + off };
    return p;
}
"""


def capability_relay_elf() -> bytes:
    """A harness of three tools: ``cap`` hands its arguments to the capability ``x.cap`` and returns its reply
    (``E:`` first for an error reply), ``ok`` returns "ok", ``spin`` never returns."""
    from berm_abi.names import fnv1a64

    return raw_harness_elf(_RELAY, ("ok", "spin", "cap"), {"X_CAP": fnv1a64("x.cap")})


def analysed_function(source: str, name: str, *, keep: tuple[str, ...]):
    """``(program, analysis, info)``: assembly ``source`` built as a guest (``keep``: the symbols to keep alive),
    its program model and analysis, and the analysis of its function ``name``."""
    from berm_aot.analysis import analyse
    from berm_aot.elf import read_elf
    from berm_aot.program import Program

    program = Program.from_image(read_elf(guest_elf(source, suffix=".S", keep=keep)))
    analysis = analyse(program)
    return program, analysis, next(i for i in analysis.functions if i.func.name == name)
