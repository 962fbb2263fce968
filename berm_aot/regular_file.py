"""Reading a file that must be a regular file of bounded size: an image, a harness.toml, a declarations file.

Each is named by someone other than the reader (a package, a harness directory, an operator), and a plain
``read_bytes`` of a FIFO waited for ever for a writer (``berm build``, ``berm serve``, ``berm-compile`` all hung:
found by reviews), of ``/dev/zero`` never ended, and of a huge file took all memory.
"""

from __future__ import annotations

import os
import stat


class FileRefused(Exception):
    """A file that is not read: its reason completes a sentence that names the file ("is not a regular file");
    ``oversized`` when it holds too many bytes."""

    def __init__(self, reason: str, *, oversized: bool = False):
        super().__init__(reason)
        self.oversized = oversized


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of ``path``: an OSError when it cannot be opened or read, FileRefused when it is not a regular file
    or holds more than ``limit`` bytes (checked before it is read, and again as it is: it may grow meanwhile)."""
    # O_NONBLOCK: opening a FIFO with no writer waits for one; a regular file reads as ever
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused("is not a regular file")
        if st.st_size > limit:
            raise FileRefused(f"is {st.st_size} bytes", oversized=True)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileRefused(f"grew past {limit} bytes while it was read", oversized=True)
    return data
