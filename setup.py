"""The build steps pyproject.toml cannot declare; it holds the metadata.

- ``berm_host.aot._core``: the runtime core, built by cffi (berm_host/aot/_build.py);
- ``berm_host/capabilities/berm-supervise``: the program berm.exec.run starts every command through
  (berm_host/capabilities/supervise.c), linked by ``build_ext`` beside the extension modules;
- ``berm_host.aot._invoke``: the harness fast path, a plain CPython extension (berm_host/aot/invoke.c) that calls
  the core through a pointer it is given at import (berm_host/aot/runtime.py);
- ``berm_aot._checksum``: the code cache's integrity check, CRC-32C in three lanes (berm_aot/checksum.c);
- the SDK and bundled harness sources (``harnesses/``) copied into a built ``berm_sdk`` as ``berm_sdk/harnesses``,
  where berm_sdk/cache.py looks first: a wheel has no source tree beside it. An editable install uses the tree.
"""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HARNESSES = Path(__file__).resolve().parent / "harnesses"


class build_py_with_harnesses(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            target = Path(self.build_lib) / "berm_sdk" / "harnesses"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(HARNESSES, target, ignore=shutil.ignore_patterns("target", "__pycache__", "*.o"))


class build_ext_with_supervisor(build_ext):
    SOURCE = "berm_host/capabilities/supervise.c"  # relative to setup.py's directory, as setuptools wants
    PROGRAM = "berm-supervise"

    def run(self):
        super().run()
        package = Path(self.SOURCE).parent
        out_dir = package if self.inplace else Path(self.build_lib) / package
        objects = self.compiler.compile([self.SOURCE], output_dir=self.build_temp,
                                        extra_postargs=["-O2", "-std=gnu11"])
        self.compiler.link_executable(objects, self.PROGRAM, output_dir=str(out_dir))


invoke = Extension(
    "berm_host.aot._invoke",
    sources=["berm_host/aot/invoke.c"],  # setuptools insists on paths relative to setup.py's directory
    include_dirs=["berm_host/aot"],
    depends=["berm_host/aot/core.h", "berm_host/aot/berm_rt.h", "berm_host/aot/native_stack.h"],  # its layout
    extra_compile_args=["-O2", "-std=gnu11"],
)

checksum = Extension("berm_aot._checksum", sources=["berm_aot/checksum.c"], extra_compile_args=["-O2", "-std=gnu11"])

setup(cffi_modules=["berm_host/aot/_build.py:ffibuilder"], ext_modules=[invoke, checksum],
      cmdclass={"build_py": build_py_with_harnesses, "build_ext": build_ext_with_supervisor})
