"""berm_aot._checksum, the code cache's integrity check (berm_aot/checksum.c), against its definition written here
in Python: CRC-32C (Castagnoli, reflected, complemented in and out) in three lanes, byte j in lane (j // 8) % 3."""

from __future__ import annotations

import os

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


def test_an_unreadable_descriptor_is_an_oserror(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(IsADirectoryError):
            checksum.file(fd)
    finally:
        os.close(fd)
    with pytest.raises(TypeError):
        checksum.data("text")
