"""cffi build script for the runtime core (API mode): ``berm_host.aot._core``.

Run by ``pip install -e .`` through ``setup.py``'s ``cffi_modules``; ``python berm_host/aot/_build.py`` builds it
in place by hand (``setup.py build_ext --inplace``). The core-call numbers and the reply error bit are derived from
``berm_abi.names`` here, never typed into C.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # setup.py runs this file outside the installed package

from berm_abi.names import CORE_CALLS, ERROR_BIT  # noqa: E402

CDEF_TEMPLATE = """
typedef struct berm_ctx {
    volatile int32_t *interrupt;
    volatile uintptr_t native_limit;
    uintptr_t native_floor;
    volatile uint32_t depth_limit;
    int32_t trap_kind;
    uint32_t trap_detail;
    uint64_t trap_pc;
    uint64_t trap_addr;
    uint64_t regs[32];
    uint8_t *mem;
    uint32_t trace_frames;
    uint64_t trace[...];
    ...;
} berm_ctx;

typedef struct berm_image berm_image;

typedef struct berm_native_stack {
    uintptr_t lo;
    uintptr_t top;
    ...;
} berm_native_stack;

typedef struct berm_region {
    berm_ctx ctx;
    uint64_t int_args[8];
    uint64_t call_ptr;
    uint64_t call_len;
    uint8_t *fail;
    uint64_t fail_len;
    int has_fail;
    uint64_t logged;
    uint64_t staged_cap;
    char trap_msg[200];
    uint64_t generation;
    uint64_t max_result;
    berm_native_stack native;
    ...;
} berm_region;

#define BERM_RUN_OK ...
#define BERM_RUN_TRAPPED ...
#define BERM_RUN_FAILED ...
#define BERM_RUN_BAD_RESULT ...
#define BERM_RUN_BIG_RESULT ...
#define BERM_RUN_BUSY ...
#define BERM_RUN_TRIM ...
#define BERM_RESIDENT_KEEP ...
#define BERM_FAIL_KEEP ...
#define BERM_LOG_KEEP ...
#define BERM_STAGE_KEEP ...
#define BERM_NATIVE_STACK ...
#define BERM_NATIVE_MARGIN ...
#define BERM_TRACE_KEEP ...

{api}"""


def _api_declarations() -> str:
    """The function declarations of core.h (between its API markers), so they are written once."""
    text = (HERE / "core.h").read_text()
    return text[text.index("/* API (begin)"):text.index("/* API (end) */")].split("\n", 1)[1]


CDEF = CDEF_TEMPLATE.replace("{api}", _api_declarations())
CALL_MACROS = [(f"BERM_CALL_{c.c_name}", f"{c.number:#x}ULL") for c in CORE_CALLS]
CALL_MACROS.append(("BERM_ERROR_BIT", f"{ERROR_BIT:#x}ULL"))

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "berm_host.aot._core",
    '#include "core.h"',
    # setuptools insists on paths relative to setup.py's directory
    sources=["berm_host/aot/core.c", "berm_host/aot/native_stack.c"],
    depends=["berm_host/aot/core.h", "berm_host/aot/berm_rt.h", "berm_host/aot/native_stack.h"],  # rebuilt on change
    include_dirs=[str(HERE)],
    define_macros=CALL_MACROS,
    extra_compile_args=["-O2", "-std=gnu11"],
    libraries=["dl", "pthread"],
    py_limited_api=False,  # core.c calls capabilities through the full CPython C API (PyObject_Vectorcall)
)

if __name__ == "__main__":  # build in place, as pip install -e . does
    import subprocess

    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=HERE.parent.parent, check=True)
