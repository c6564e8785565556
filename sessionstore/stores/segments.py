"""Time segments of one store, each a RocksDB column family named ``<store>.<id>``.

A row lands in segment ``ts // interval`` (floor division, so negative times get
negative ids). Segment ``s`` holds times ``[s * interval, (s + 1) * interval)``.
Expiring a segment drops its column family, which is O(1) whatever it holds.

The live ids of a store are kept in a small sorted list, rebuilt from the
database's column families when the store is opened.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessionstore.engine.db import Database

__all__ = [
    "Segments",
    "default_segment_interval",
    "operator_segment_interval",
    "MIN_SEGMENT_INTERVAL_MS",
    "MIN_OPERATOR_SEGMENT_INTERVAL_MS",
]

MIN_SEGMENT_INTERVAL_MS = 60_000
#: Operators (sessionize, window_aggregate, the joins) use segments of at least an hour.
MIN_OPERATOR_SEGMENT_INTERVAL_MS = 3_600_000


def default_segment_interval(retention_ms: int) -> int:
    """Kafka-like default: two segments per retention period, at least one minute."""
    return max(retention_ms // 2, MIN_SEGMENT_INTERVAL_MS)


def operator_segment_interval(retention_ms: int) -> int:
    """Segment interval of an operator's stores: the default, but at least an hour.

    Creating or dropping a column family is costly: RocksDB writes its MANIFEST
    and rewrites its OPTIONS file, with fsyncs (figures in BENCHMARKS.md, "Figures
    quoted in code"). An operator's retention is short (a session gap plus grace),
    so one-minute segments make a micro-batch that moves event time by minutes, as
    a job catching up on a backlog does, create and drop a family or two per
    partition, a large share of a sessionize task's time in
    ``bench/spark_sessionize.py``. Hour-long segments do it about once per hour of
    event time. The price: rows past retention stay on disk, invisible and never
    read, for up to an hour more before their family is dropped.
    """
    return max(default_segment_interval(retention_ms), MIN_OPERATOR_SEGMENT_INTERVAL_MS)


class Segments:
    """Maps timestamps to segment column families of one store and expires them."""

    __slots__ = ("_db", "_prefix", "interval", "_ids", "names")

    def __init__(self, db: Database, store: str, interval: int) -> None:
        if type(interval) is not int or interval <= 0:
            raise ValueError(f"segment_interval_ms must be a positive int, got {interval!r}")
        self._db = db
        self._prefix = store + "."
        self.interval = interval
        self._ids: list[int] = []
        #: Column family name of each live segment id (updated in place).
        self.names: dict[int, str] = {}
        self.reload()

    def reload(self) -> None:
        """Rebuild the live-segment index from the database's column families."""
        ids = []
        plen = len(self._prefix)
        for name in self._db.column_families():
            if name.startswith(self._prefix):
                suffix = name[plen:]
                if suffix.lstrip("-").isdigit():
                    ids.append(int(suffix))
        self._ids = sorted(ids)
        self.names.clear()
        self.names.update((i, f"{self._prefix}{i}") for i in self._ids)

    def segment_id(self, ts: int) -> int:
        return ts // self.interval

    def name(self, segment_id: int) -> str | None:
        """Column family of a live segment, or None if it does not exist."""
        return self.names.get(segment_id)

    def get_or_create(self, segment_id: int) -> str:
        name = self.names.get(segment_id)
        if name is None:
            name = f"{self._prefix}{segment_id}"
            self._db.create_column_family(name)
            insort(self._ids, segment_id)
            self.names[segment_id] = name
        return name

    def ids(self) -> list[int]:
        return list(self._ids)

    def names_from(self, min_id: int, reverse: bool = False) -> Iterator[tuple[int, str]]:
        """Live segments with id >= ``min_id``, ascending (or descending)."""
        ids = self._ids[bisect_left(self._ids, min_id) :]
        if reverse:
            ids.reverse()
        names = self.names
        return ((i, names[i]) for i in ids)

    def live_names_from(self, min_id: int, reverse: bool = False) -> list[str]:
        """Column families of the live segments with id >= ``min_id``, ascending
        (or descending): :meth:`names_from` without the ids, as a list."""
        ids, names = self._ids, self.names
        out = [names[i] for i in ids[bisect_left(ids, min_id) :]]
        if reverse:
            out.reverse()
        return out

    def expire_below(self, min_live_ts: int) -> int:
        """Drop every segment whose times are all below ``min_live_ts``.

        Returns how many segments were dropped. Inside a batch the drop itself
        happens at commit, after the batch's writes.
        """
        first_live = self.segment_id(min_live_ts)
        ids = self._ids
        if not ids or ids[0] >= first_live:
            return 0
        cut = bisect_left(ids, first_live)
        expired, self._ids = ids[:cut], ids[cut:]
        for seg in expired:
            self._db.drop_column_family(self.names.pop(seg))
        return len(expired)
