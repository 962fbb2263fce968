"""Translated code: the runtime core (C, built with cffi: ``_core``), its Python side (``runtime``), and the AOT
backend (``backend.AotBackend``). Nothing is imported here, so loading the core alone stays cheap (the interpreter
hands it its deadline: berm_host/running.py)."""
