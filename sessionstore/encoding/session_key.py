"""Byte layout of a session row key.

::

    enc(key) ‖ end ‖ start

``enc`` is the prefix-free key codec of :mod:`sessionstore.encoding.keys`; ``end`` and
``start`` are 8-byte big-endian with the sign bit flipped. Byte order is therefore
(key, end, start), and the rows of one key are the byte range
``[enc(key), prefix_upper_bound(enc(key)))``.

Worked example, key ``"u1"``, start 100, end 250::

    02 75 31 00 01 | 80 00 00 00 00 00 00 FA | 80 00 00 00 00 00 00 64
"""

from __future__ import annotations

import struct

__all__ = ["session_key", "times_of", "TIMES", "TIME_SIGN", "TIMES_LEN"]

TIME_SIGN = 2**63
#: ``end ‖ start`` as unsigned big-endian; subtract TIME_SIGN to get signed times.
TIMES = struct.Struct(">QQ")
TIMES_LEN = 16


def session_key(key_bytes: bytes, start: int, end: int) -> bytes:
    """Row key for the session ``[start, end]`` of the encoded user key."""
    return key_bytes + TIMES.pack(end + TIME_SIGN, start + TIME_SIGN)


def times_of(raw: bytes) -> tuple[int, int]:
    """``(start, end)`` of a row key (the inverse of :func:`session_key` for the times)."""
    end, start = TIMES.unpack_from(raw, len(raw) - TIMES_LEN)
    return start - TIME_SIGN, end - TIME_SIGN
