"""Sessions certain to close at the next advance, each kept as one row.

An emit-on-close operator judged by the time of its last advance (Spark's
watermark) cannot emit the sessions a micro-batch passes until the next advance.
A session that ends before its partition's own close time after the batch
(``stream time - gap - grace``) is certain to close then: the next advance is to a
time at least the partition's own, and no later row can merge with a closed
session. Such a session needs neither a row in the key-ordered segments nor an
entry in the end index (:mod:`sessionstore.stores.end_index`) for the one batch
it waits: it is written here once, and the next advance reads it back with its
value in the same range read that finds it, and deletes it.

Layout: the column family ``<store>.closing`` of the store's StateDB, keyed
``end ‖ start ‖ enc(key)`` as the end index (times as in
:mod:`sessionstore.encoding.session_key`), the value the session's stored value
bytes (the store's value serde), written in the same batch as everything else,
so changelogs and snapshots carry it and a restore brings it back. A repartition
routes its rows by the key at its tail, as the end index's.

Example: the session ``[1000, 5000]`` of ``"a"`` (count 2) is the row
``80 00 00 00 00 00 13 88 ‖ 80 00 00 00 00 00 03 e8 ‖ 02 61 00 01`` → ``91 02``
(msgpack ``[2]``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from sessionstore.encoding.session_key import TIMES_LEN, decode_times, encode_times

if TYPE_CHECKING:
    from sessionstore.engine.db import Database

__all__ = ["ClosingSessions", "ClosingEntry"]

#: ``(end, start, encoded key, stored value bytes)``, in (end, start, key) order.
ClosingEntry = tuple[int, int, bytes, bytes]


class ClosingSessions:
    """The sessions of a store that close at its next advance, in a StateDB family."""

    def __init__(self, db: Database, store: str, create: bool = True) -> None:
        self._db = db
        self._cf = f"{store}.closing"
        if create:
            db.create_column_family(self._cf)

    @classmethod
    def reading(cls, db: Database, store: str) -> ClosingSessions:
        """A reader of an existing family (creates nothing)."""
        return cls(db, store, create=False)

    def add_many(self, sessions: Iterable[tuple[bytes, int, int, bytes]]) -> None:
        """Keep each ``(encoded key, start, end, value bytes)``, in one pending-write
        dict (no call per session)."""
        with self._db.batch():
            self._db.bulk_writer(self._cf).update(
                (encode_times(start, end) + kb, vb) for kb, start, end, vb in sessions
            )

    def all(self) -> list[ClosingEntry]:
        """Every kept session, in (end, start, key) order."""
        return [self._decode(raw, vb) for raw, vb in self._db.scan_list(self._cf)]

    def take_all(self) -> list[ClosingEntry]:
        """:meth:`all`, and forget them (one range read, one pending-write dict)."""
        rows = self._db.scan_list(self._cf)
        if rows:
            with self._db.batch():
                self._db.bulk_writer(self._cf).update(dict.fromkeys(raw for raw, _ in rows))
        decode = self._decode
        return [decode(raw, vb) for raw, vb in rows]

    def any(self) -> bool:
        """Whether any session is kept."""
        rows = self._db.scan(self._cf)
        try:
            return next(rows, None) is not None
        finally:
            rows.close()

    @staticmethod
    def _decode(raw: bytes, vb: bytes) -> ClosingEntry:
        start, end = decode_times(raw)
        return end, start, raw[TIMES_LEN:], vb
