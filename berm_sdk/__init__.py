"""The Python side of the guest SDK: the guest toolchain driver, the generated host-call header, and
``berm build`` (a harness directory → a harness ELF)."""
