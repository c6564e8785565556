"""The one signed 64-bit big-endian integer format of stored metadata and values.

Stream times, committed versions and the timestamp that prefixes a versioned
store's latest value are all ``INT64``: 8 bytes, big-endian, two's complement::

    INT64.pack(250) = 00 00 00 00 00 00 00 FA
    INT64.pack(-1)  = FF FF FF FF FF FF FF FF

(Row keys that must sort by time use the sign-flipped form of
:mod:`sessionstore.encoding.session_key` instead.)
"""

from __future__ import annotations

import struct

__all__ = ["INT64"]

INT64 = struct.Struct(">q")
