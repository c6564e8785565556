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

from typing import TYPE_CHECKING

import numpy as np

from sessionstore.encoding.session_key import TIME_SIGN, TIMES_LEN

if TYPE_CHECKING:
    from sessionstore.engine.db import Database

__all__ = ["ClosingSessions", "ClosingEntry"]

#: ``(end, start, encoded key, stored value bytes)``, in (end, start, key) order.
ClosingEntry = tuple[int, int, bytes, bytes]
#: Times are stored with the sign bit flipped (``+ 2**63`` modulo ``2**64``).
_SIGN = np.uint64(TIME_SIGN)


class ClosingSessions:
    """The sessions of a store that close at its next advance, in a StateDB family."""

    def __init__(self, db: Database, store: str) -> None:
        self._db = db
        self._cf = f"{store}.closing"
        db.create_column_family(self._cf)  # nothing to do where it exists (also read-only)

    def add_many(
        self, kbs: list[bytes], starts: np.ndarray, ends: np.ndarray, values: list[bytes]
    ) -> None:
        """Keep the sessions given as columns (encoded keys, starts, ends, value
        bytes), in one pending-write dict: the time prefixes are packed at once."""
        times = np.empty((len(kbs), 2), dtype=">u8")
        times[:, 0] = np.asarray(ends, dtype=np.int64).view(np.uint64) ^ _SIGN
        times[:, 1] = np.asarray(starts, dtype=np.int64).view(np.uint64) ^ _SIGN
        packed = times.tobytes()
        prefixes = [packed[i : i + TIMES_LEN] for i in range(0, len(packed), TIMES_LEN)]
        with self._db.batch():
            self._db.bulk_writer(self._cf).update(
                zip(map(bytes.__add__, prefixes, kbs), values, strict=True)
            )

    def all(self) -> list[ClosingEntry]:
        """Every kept session, in (end, start, key) order."""
        return _decoded(self._db.scan_list(self._cf))

    def take_all(self) -> list[ClosingEntry]:
        """:meth:`all`, and forget them (one range read, one pending-write dict)."""
        rows = self._db.scan_list(self._cf)
        if rows:
            with self._db.batch():
                self._db.bulk_writer(self._cf).update(dict.fromkeys(raw for raw, _ in rows))
        return _decoded(rows)

    def any(self) -> bool:
        """Whether any session is kept."""
        rows = self._db.scan(self._cf)
        try:
            return next(rows, None) is not None
        finally:
            rows.close()


def _decoded(rows: list[tuple[bytes, bytes]]) -> list[ClosingEntry]:
    """Raw rows as entries: the time prefixes unpacked at once."""
    if not rows:
        return []
    raws = [raw for raw, _ in rows]
    times = np.frombuffer(b"".join([raw[:TIMES_LEN] for raw in raws]), dtype=">u8")
    signed = (times.astype(np.uint64) ^ _SIGN).view(np.int64).reshape(-1, 2)
    kbs = [raw[TIMES_LEN:] for raw in raws]
    return list(
        zip(signed[:, 0].tolist(), signed[:, 1].tolist(), kbs, [vb for _, vb in rows], strict=True)
    )
