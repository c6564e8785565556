"""Open sessions ordered by (end, start, key): what emit-on-close reads.

The session store orders rows by key, so finding every session that closes when
stream time moves would need a scan of whole segments. The index holds only the
sessions not yet emitted, keyed ``end ‖ start ‖ enc(key)`` (times as in
:mod:`sessionstore.encoding.session_key`), so closing them is one range read of the index.

:class:`RocksDBEndIndex` lives in the column family ``<store>.open`` of the store's
StateDB and is written in the same batch; :class:`MemoryEndIndex` pairs with the
in-memory session store.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sessionstore.encoding.keys import TS_MIN
from sessionstore.encoding.session_key import TIMES_LEN, decode_times, encode_times

if TYPE_CHECKING:
    from sessionstore.engine.db import Database

__all__ = ["RocksDBEndIndex", "MemoryEndIndex"]

Entry = tuple[int, int, bytes]  # (end, start, encoded key)


def _index_key(kb: bytes, start: int, end: int) -> bytes:
    return encode_times(start, end) + kb


class RocksDBEndIndex:
    """End-ordered index of open sessions in a StateDB column family."""

    def __init__(self, db: Database, store: str) -> None:
        self._db = db
        self._cf = f"{store}.open"
        db.create_column_family(self._cf)

    def add(self, kb: bytes, start: int, end: int) -> None:
        self._db.put(self._cf, _index_key(kb, start, end), b"")

    def discard(self, kb: bytes, start: int, end: int) -> None:
        self._db.delete(self._cf, _index_key(kb, start, end))

    def add_many(self, sessions: Iterable[tuple[bytes, int, int]]) -> None:
        """:meth:`add` for each ``(encoded key, start, end)``, in one pending-write
        dict (no call per session)."""
        with self._db.batch():
            self._db.bulk_writer(self._cf).update(
                (encode_times(start, end) + kb, b"") for kb, start, end in sessions
            )

    def below(self, end: int, from_end: int | None = None) -> list[Entry]:
        """Entries with ``from_end <= end' < end``, in (end, start, key) order (no
        lower bound when ``from_end`` is None)."""
        return [self._decode(raw) for raw in self._raw_below(end, from_end)]

    def _raw_below(self, end: int, from_end: int | None) -> list[bytes]:
        """The index keys :meth:`below` decodes."""
        hi = encode_times(TS_MIN, end)
        lo = None if from_end is None else encode_times(TS_MIN, from_end)
        return [raw for raw, _ in self._db.scan_list(self._cf, lo, hi)]

    def take_below(self, end: int, from_end: int | None = None) -> list[Entry]:
        """:meth:`below`, and forget those entries: what a close emits, read and
        deleted in one pass (one pending-write dict, no call per entry)."""
        raws = self._raw_below(end, from_end)
        if raws:
            with self._db.batch():
                self._db.bulk_writer(self._cf).update(dict.fromkeys(raws))
        decode = self._decode
        return [decode(raw) for raw in raws]

    def all(self) -> list[Entry]:
        return [self._decode(raw) for raw, _ in self._db.scan_list(self._cf)]

    @staticmethod
    def _decode(raw: bytes) -> Entry:
        start, end = decode_times(raw)
        return end, start, raw[TIMES_LEN:]


class MemoryEndIndex:
    """End-ordered index of open sessions held in memory."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []

    def add(self, kb: bytes, start: int, end: int) -> None:
        entry = (end, start, kb)
        i = bisect_left(self._entries, entry)
        if i == len(self._entries) or self._entries[i] != entry:
            insort(self._entries, entry)

    def discard(self, kb: bytes, start: int, end: int) -> None:
        entry = (end, start, kb)
        i = bisect_left(self._entries, entry)
        if i < len(self._entries) and self._entries[i] == entry:
            del self._entries[i]

    def add_many(self, sessions: Iterable[tuple[bytes, int, int]]) -> None:
        for kb, start, end in sessions:
            self.add(kb, start, end)

    def below(self, end: int, from_end: int | None = None) -> list[Entry]:
        lo = 0 if from_end is None else bisect_left(self._entries, (from_end, -(2**63), b""))
        return self._entries[lo : bisect_left(self._entries, (end, -(2**63), b""))]

    def take_below(self, end: int, from_end: int | None = None) -> list[Entry]:
        lo = 0 if from_end is None else bisect_left(self._entries, (from_end, -(2**63), b""))
        hi = bisect_left(self._entries, (end, -(2**63), b""))
        taken = self._entries[lo:hi]
        del self._entries[lo:hi]
        return taken

    def all(self) -> list[Entry]:
        return list(self._entries)
