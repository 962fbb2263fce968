"""Translated code: the runtime core (C, built with cffi), its Python side, and the AOT backend."""

from .backend import AotBackend

__all__ = ["AotBackend"]
