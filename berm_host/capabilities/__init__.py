"""Host capabilities: the Python callables behind ``berm.fs.*``, ``berm.exec.run``, ``berm.http.fetch``,
``berm.clock.now`` and ``berm.kv.*`` (shared/DESIGN.md, "Capabilities").

One module per family (``fs``, ``fs_search``, ``exec``, ``http``, ``clock``, ``kv``), each building its callables
from its bounding argument (a root, a host list, a namespace); ``paths`` confines every path to a root. Nothing
here decides who gets what: ``berm_host.grants`` turns a declaration into a linker from these builders. Every
callable takes a request frame and returns reply bytes, raising ``CapabilityError`` for its own failures.
"""
