"""berm_aot._checksum, the code cache's integrity check (berm_aot/checksum.c), against its definition written here
in Python: CRC-32C (Castagnoli, reflected, complemented in and out) in three lanes, byte j in lane (j // 8) % 3."""

from __future__ import annotations

import os
import platform

import pytest
from hypothesis import given, settings, strategies as st

from berm_aot import _checksum as checksum


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def reference(data: bytes) -> str:
    lanes = [bytearray(), bytearray(), bytearray()]
    for j in range(0, len(data), 8):
        lanes[(j // 8) % 3] += data[j:j + 8]
    return "".join(f"{_crc32c(bytes(lane)):08x}" for lane in lanes)


def test_a_lane_is_crc32c():
    """The check value of CRC-32C (RFC 3720's): a first lane of nine bytes would split, so eight are checked whole."""
    assert _crc32c(b"123456789") == 0xE3069283
    assert checksum.data(b"12345678") == f"{_crc32c(b'12345678'):08x}" + "00000000" * 2


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_both_paths_are_the_definition(data):
    assert checksum.data(data) == checksum.portable(data) == reference(data)


@pytest.mark.parametrize("size", [0, 1, 23, 24, 25, 196607, 196608, 196609, 3 * 196608 + 17])
def test_a_file_is_read_whole_in_chunks(tmp_path, size):
    """file() reads 196,608 bytes at a time (8,192 groups of 24): sizes around a chunk, from offset 0 whatever the
    descriptor's own offset, which it leaves alone."""
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, size // 2, os.SEEK_SET)
        assert checksum.file(fd) == checksum.portable(data) == checksum.data(data)
        assert os.lseek(fd, 0, os.SEEK_CUR) == size // 2
    finally:
        os.close(fd)
    if size in (25, 196609):
        assert reference(data) == checksum.data(data)


def test_any_flipped_byte_or_cut_is_seen():
    data = bytearray(os.urandom(4096))
    whole = checksum.data(bytes(data))
    for at in range(0, len(data), 37):
        data[at] ^= 0x10
        assert checksum.data(bytes(data)) != whole
        data[at] ^= 0x10
    assert all(checksum.data(bytes(data[:n])) != whole for n in range(len(data) - 64, len(data)))


def test_only_a_regular_file_is_read(tmp_path):
    """file() reads a regular file up to its size: /dev/zero (or a file that grows for ever) held the thread, deaf to
    signals, for ever (found by a review); a directory or a FIFO is an OSError."""
    os.mkfifo(tmp_path / "fifo")
    for path, flags, error in ((tmp_path, os.O_DIRECTORY, IsADirectoryError), ("/dev/zero", 0, OSError),
                               (tmp_path / "fifo", os.O_NONBLOCK, OSError)):
        fd = os.open(path, os.O_RDONLY | flags)
        try:
            with pytest.raises(error):
                checksum.file(fd)
        finally:
            os.close(fd)
    with pytest.raises(TypeError):
        checksum.data("text")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the crc32 instruction is x86-64's (SSE4.2)")
def test_the_instruction_is_used_where_there_is_one():
    """Else data() and portable() are one path, and their agreement proves nothing."""
    assert checksum.INSTRUCTION == 1
