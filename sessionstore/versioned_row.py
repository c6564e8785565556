"""Byte formats of the versioned store (KIP-889 layout, one row per key and segment).

Latest family, key ``enc(key)``::

    timestamp (8, signed BE) ‖ value bytes

History segment family ``<store>.<validTo // interval>``, key ``enc(key)``::

    next_ts (8) ‖ min_ts (8) ‖ count (4) ‖ count × [valid_from (8) ‖ size (4)] ‖ values

Entries run newest first. The ``valid_to`` of entry ``i`` is the ``valid_from`` of
entry ``i - 1``, and ``next_ts`` for the newest entry. ``size`` is -1 for a
tombstone, so a tombstone and an empty value stay distinct. (Kafka derives the
count by walking to ``min_ts``; an explicit count is cheaper and checkable.)

Worked example: versions ``b"x"`` from 10 and a tombstone from 15, the next
version starting at 20::

    next_ts=20 ‖ min_ts=10 ‖ count=2 ‖ (15, -1) ‖ (10, 1) ‖ 78
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

__all__ = ["VersionRow", "encode_latest", "decode_latest", "ROW_HEADER", "ENTRY"]

ROW_HEADER = struct.Struct(">qqI")
ENTRY = struct.Struct(">qi")
_TS = struct.Struct(">q")


def encode_latest(timestamp: int, value: bytes) -> bytes:
    return _TS.pack(timestamp) + value


def decode_latest(raw: bytes) -> tuple[int, bytes]:
    return _TS.unpack_from(raw)[0], raw[8:]


@dataclass
class VersionRow:
    """The versions of one key whose ``valid_to`` falls in one segment."""

    next_ts: int
    #: ``(valid_from, value bytes or None for a tombstone)``, newest first.
    entries: list[tuple[int, bytes | None]] = field(default_factory=list)

    @property
    def min_ts(self) -> int:
        return self.entries[-1][0]

    def valid_to(self, i: int) -> int:
        return self.next_ts if i == 0 else self.entries[i - 1][0]

    def first_valid_after(self, ts: int) -> int:
        """Index of the oldest entry whose ``valid_to`` is after ``ts`` (-1 if none)."""
        entries = self.entries
        for i in range(len(entries) - 1, -1, -1):
            if (self.next_ts if i == 0 else entries[i - 1][0]) > ts:
                return i
        return -1

    def encode(self) -> bytes:
        entries = self.entries
        parts = [ROW_HEADER.pack(self.next_ts, entries[-1][0], len(entries))]
        parts.extend(ENTRY.pack(ts, -1 if v is None else len(v)) for ts, v in entries)
        parts.extend(v for _, v in entries if v)
        return b"".join(parts)

    @classmethod
    def decode(cls, raw: bytes) -> VersionRow:
        try:
            next_ts, min_ts, count = ROW_HEADER.unpack_from(raw)
            pos = ROW_HEADER.size + count * ENTRY.size
            entries: list[tuple[int, bytes | None]] = []
            for i in range(count):
                ts, size = ENTRY.unpack_from(raw, ROW_HEADER.size + i * ENTRY.size)
                if size < 0:
                    entries.append((ts, None))
                else:
                    entries.append((ts, raw[pos : pos + size]))
                    pos += size
        except struct.error as exc:
            raise ValueError(f"corrupt versioned row ({len(raw)} bytes): {exc}") from exc
        if pos != len(raw) or not entries or entries[-1][0] != min_ts:
            raise ValueError(f"corrupt versioned row ({len(raw)} bytes): sizes do not add up")
        return cls(next_ts, entries)
