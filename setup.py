"""The native parts of the runtime live here; pyproject.toml holds the metadata.

- ``berm_host.aot._core``: the runtime core, built by cffi (berm_host/aot/_build.py);
- ``berm_host.aot._invoke``: the harness fast path, a plain CPython extension (berm_host/aot/invoke.c) that calls
  the core through a pointer it is given at import (berm_host/aot/runtime.py).
"""

from setuptools import Extension, setup

invoke = Extension(
    "berm_host.aot._invoke",
    sources=["berm_host/aot/invoke.c"],  # setuptools insists on paths relative to setup.py's directory
    include_dirs=["berm_host/aot"],
    depends=["berm_host/aot/core.h", "berm_host/aot/berm_rt.h"],  # the region's layout: rebuild when it changes
    extra_compile_args=["-O2", "-std=gnu11"],
)

setup(cffi_modules=["berm_host/aot/_build.py:ffibuilder"], ext_modules=[invoke])
