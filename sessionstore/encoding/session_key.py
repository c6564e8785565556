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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "session_key",
    "times_of",
    "times_of_many",
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


def times_of_many(raws: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` of many row keys as int64 arrays: :func:`times_of` of
    each, decoded together where they come as a pyarrow binary array (a reader
    decodes thousands at a time), one by one from a list of bytes. ``ValueError``
    if a key is shorter than its 16 time bytes."""
    import numpy as np

    if not hasattr(raws, "to_pylist"):
        if any(len(raw) < TIMES_LEN for raw in raws):
            raise ValueError("a row key is shorter than the 16 bytes of its times")
        both = np.array([times_of(raw) for raw in raws], dtype=np.int64).reshape(-1, 2)
        return both[:, 0], both[:, 1]
    if len(raws) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        tail = pc.binary_slice(raws, -TIMES_LEN).cast(pa.binary(TIMES_LEN))
    except pa.ArrowInvalid:
        raise ValueError("a row key is shorter than the 16 bytes of its times") from None
    packed = np.frombuffer(
        tail.buffers()[1], dtype=">u8", count=2 * len(tail), offset=tail.offset * TIMES_LEN
    )
    # flipping the sign bit of the unsigned form gives the two's complement time
    flipped = packed.astype(np.uint64) ^ np.uint64(TIME_SIGN)
    pairs = flipped.view(np.int64).reshape(-1, 2)  # (end, start) per key
    return pairs[:, 1], pairs[:, 0]
