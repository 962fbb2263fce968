"""Only the cffi build of the runtime core lives here; pyproject.toml holds the metadata."""

from setuptools import setup

setup(cffi_modules=["berm_host/aot/_build.py:ffibuilder"])
