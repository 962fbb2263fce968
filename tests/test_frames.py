"""The request wire format (ABI.md §2) at its edges: every truncation is an error, never a shorter field; the
integer and text fields' errors name what is wrong."""

from __future__ import annotations

import pytest

from berm_abi.errors import FrameError
from berm_abi.frames import decode_frame, encode_frame, field_int, field_text


def test_every_truncation_of_a_frame_is_an_error_not_a_shorter_field():
    frame = encode_frame(["path", b"content", ""])
    assert decode_frame(frame) == [b"path", b"content", b""]
    cuts = [n for n in range(len(frame)) if n not in (0, 8, 19)]  # 0, 8, 19: whole fields
    for n in cuts:
        with pytest.raises(FrameError):
            decode_frame(frame[:n])
    with pytest.raises(FrameError, match="claims 7 bytes, only 6 remain"):
        decode_frame(frame[:18])


def test_field_int_takes_forty_characters_at_most():
    assert field_int(b"-" + b"9" * 39, "n") == -int("9" * 39)
    with pytest.raises(FrameError, match="n is longer than 40 characters"):  # not "not a decimal integer"
        field_int(b"9" * 41, "n")
    with pytest.raises(FrameError, match="n is not a decimal integer: '9x'"):
        field_int(b"9x", "n")


def test_field_text_names_the_offset_of_the_first_bad_byte():
    with pytest.raises(FrameError, match=r"key is not valid UTF-8 \(byte 2\)"):
        field_text(b"ab\xe2\x82cd", "key")
