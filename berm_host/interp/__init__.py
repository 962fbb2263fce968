"""The reference interpreter: the oracle every faster engine is checked against (docs/SEMANTICS.md)."""

from .backend import InterpBackend

__all__ = ["InterpBackend"]
