"""Byte layout of a session row key, and the one sign-flipped time encoding.

::

    enc(key) ‖ end ‖ start

``enc`` is the prefix-free key codec of :mod:`sessionstore.encoding.keys`; ``end`` and
``start`` are 8-byte big-endian with the sign bit flipped, so that negative times
sort before positive ones::

    -1 -> 7F FF FF FF FF FF FF FF
     0 -> 80 00 00 00 00 00 00 00

Byte order is therefore (key, end, start), and the rows of one key are the byte
range ``[enc(key), prefix_upper_bound(enc(key)))``. The end index of open sessions
puts the same 16 time bytes first (``end ‖ start ‖ enc(key)``).

Worked example, key ``"u1"``, start 100, end 250::

    02 75 31 00 01 | 80 00 00 00 00 00 00 FA | 80 00 00 00 00 00 00 64
"""

from __future__ import annotations

import struct

__all__ = [
    "session_key",
    "times_of",
    "encode_times",
    "decode_times",
    "TIMES",
    "TIME_SIGN",
    "TIMES_LEN",
]

TIME_SIGN = 2**63
#: ``end ‖ start`` as unsigned big-endian; subtract TIME_SIGN to get signed times.
TIMES = struct.Struct(">QQ")
TIMES_LEN = 16


def encode_times(start: int, end: int) -> bytes:
    """The 16 bytes ``end ‖ start``, sign bits flipped (they sort by end, then start)."""
    return TIMES.pack(end + TIME_SIGN, start + TIME_SIGN)


def decode_times(raw: bytes, offset: int = 0) -> tuple[int, int]:
    """``(start, end)`` from the 16 bytes at ``offset`` (inverse of :func:`encode_times`)."""
    end, start = TIMES.unpack_from(raw, offset)
    return start - TIME_SIGN, end - TIME_SIGN


def session_key(key_bytes: bytes, start: int, end: int) -> bytes:
    """Row key for the session ``[start, end]`` of the encoded user key."""
    return key_bytes + encode_times(start, end)


def times_of(raw: bytes) -> tuple[int, int]:
    """``(start, end)`` of a row key (the inverse of :func:`session_key` for the times)."""
    return decode_times(raw, len(raw) - TIMES_LEN)
