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

from sessionstore.encoding.ints import INT64

__all__ = [
    "VersionRow",
    "lookup",
    "push_newest",
    "encode_latest",
    "decode_latest",
    "ROW_HEADER",
    "ENTRY",
    "LATEST_TS",
]

ROW_HEADER = struct.Struct(">qqI")
ENTRY = struct.Struct(">qi")
#: The timestamp that prefixes a latest value (``encode_latest``).
LATEST_TS = INT64


def encode_latest(timestamp: int, value: bytes) -> bytes:
    return LATEST_TS.pack(timestamp) + value


def decode_latest(raw: bytes) -> tuple[int, bytes]:
    return LATEST_TS.unpack_from(raw)[0], raw[LATEST_TS.size :]


_ENTRIES: dict[int, struct.Struct] = {}


def _entries_struct(count: int) -> struct.Struct:
    fmt = _ENTRIES.get(count)
    if fmt is None:
        fmt = _ENTRIES[count] = struct.Struct(">" + "qi" * count)
    return fmt


def lookup(raw: bytes, ts: int) -> tuple[int, int, bytes | None] | None:
    """Find, without decoding the whole row, the oldest version whose ``valid_to`` is
    after ``ts``: ``(valid_from, valid_to, value or None for a tombstone)``.

    Returns None when every version of the row ends at or before ``ts``.
    """
    next_ts, _min_ts, count = ROW_HEADER.unpack_from(raw)
    if next_ts <= ts:
        return None
    flat = _entries_struct(count).unpack_from(raw, ROW_HEADER.size)
    # flat = (from_0, size_0, from_1, size_1, ...), newest first
    i = count - 1
    while i > 0 and flat[2 * i - 2] <= ts:
        i -= 1
    valid_to = next_ts if i == 0 else flat[2 * i - 2]
    size = flat[2 * i + 1]
    if size < 0:
        return flat[2 * i], valid_to, None
    pos = ROW_HEADER.size + count * ENTRY.size
    for j in range(i):
        if flat[2 * j + 1] > 0:
            pos += flat[2 * j + 1]
    return flat[2 * i], valid_to, raw[pos : pos + size]


def push_newest(raw: bytes | None, from_ts: int, value: bytes | None, next_ts: int) -> bytes:
    """Row bytes with ``(from_ts, value)`` added as the newest entry, valid until
    ``next_ts``, without decoding the rest (the common, in-order write).

    A newest entry that already starts at ``from_ts`` (a zero-length tombstone) is
    replaced rather than stacked.
    """
    size = -1 if value is None else len(value)
    if raw is None:
        return ROW_HEADER.pack(next_ts, from_ts, 1) + ENTRY.pack(from_ts, size) + (value or b"")
    _next, min_ts, count = ROW_HEADER.unpack_from(raw)
    top_ts = ENTRY.unpack_from(raw, ROW_HEADER.size)[0]
    if top_ts == from_ts:
        row = VersionRow.decode(raw)
        row.entries[0] = (from_ts, value)
        row.next_ts = next_ts
        return row.encode()
    split = ROW_HEADER.size + count * ENTRY.size
    return b"".join(
        (
            ROW_HEADER.pack(next_ts, min_ts, count + 1),
            ENTRY.pack(from_ts, size),
            raw[ROW_HEADER.size : split],
            value or b"",
            raw[split:],
        )
    )


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
