"""Temporal stream-table join on a versioned store (KIP-889's motivating case).

Table-side records become versions (``put(key, value, ts)``; a None value deletes).
Each stream-side record is joined with the table value valid at the stream
record's own event time (``get(key, as_of=ts)``), so an out-of-order stream
record still meets the version it would have met in order::

    B: b0 @0, b3 @3     A: a1 @1 -> (a1, b0), a4 @4 -> (a4, b3), a2 @2 -> (a2, b0)

``how="inner"`` emits only matches; ``how="left"`` also emits stream records
without a table value, joined with None. A stream record older than the table's
history retention (``ts < table stream time - history_retention_ms``) is dropped
and counted: only the latest version survives that far back, and joining with it
would be silently wrong. So are records with a None key or timestamp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sessionstore.encoding.keys import check_timestamp
from sessionstore.operators.aggregations import record_time_type
from sessionstore.stores.versioned import VersionedStore

__all__ = ["TemporalJoin", "JoinedRecord", "STREAM", "TABLE"]

STREAM = "stream"
TABLE = "table"


class JoinedRecord(NamedTuple):
    """A stream record joined with the table value valid at its event time."""

    key: Any
    timestamp: int
    value: Any


def _pair(stream_value: Any, table_value: Any) -> tuple[Any, Any]:
    return stream_value, table_value


class TemporalJoin:
    """Join a stream with a versioned table, as of each stream record's event time.

    ``time_type``: ``"timestamp"`` when the table's times are timestamps where the
    job shows them (a Spark timestamp column); recorded in the table's metadata
    (written in its current batch), so readers show its versions' times as
    timestamps. None: epoch milliseconds, nothing recorded.
    """

    def __init__(
        self,
        table: VersionedStore,
        joiner: Callable[[Any, Any], Any] = _pair,
        how: str = "inner",
        time_type: str | None = None,
    ) -> None:
        if how not in ("inner", "left"):
            raise ValueError(f"how must be 'inner' or 'left', got {how!r}")
        if not isinstance(table, VersionedStore):
            raise TypeError(f"table must be a VersionedStore, got {type(table).__name__}")
        record_time_type(table, time_type)
        self.table = table
        self.joiner = joiner
        self.how = how
        #: Stream records dropped: None key or timestamp, or older than history retention.
        self.dropped_records = 0

    def process_table(self, key: Any, value: Any, timestamp: int) -> int:
        """Record a table version (None deletes); returns the versioned put result."""
        return self.table.put(key, value, timestamp)

    def process_stream(self, key: Any, value: Any, timestamp: int | None) -> JoinedRecord | None:
        """Join one stream record; None when nothing is emitted."""
        if key is None or timestamp is None:
            self.dropped_records += 1
            return None
        ts = check_timestamp("timestamp", timestamp)
        table = self.table
        if ts < table.grace_floor():  # the store's history rule
            self.dropped_records += 1
            return None
        return self._joined(key, value, ts, table.get(key, ts))

    def process_streams(
        self, keys: Sequence[Any], values: Sequence[Any], timestamps: Sequence[int | None]
    ) -> list[JoinedRecord | None]:
        """:meth:`process_stream` for each record, with no table record between them:
        the same results in the same order, but the store is read once per key (all
        the key's versions in the batch's time span) instead of once per record."""
        table = self.table
        floor = table.grace_floor()
        out: list[JoinedRecord | None] = [None] * len(keys)
        groups: dict[bytes, list[tuple[int, int]]] = {}
        for i, (key, timestamp) in enumerate(zip(keys, timestamps, strict=True)):
            if key is None or timestamp is None:
                self.dropped_records += 1
                continue
            ts = check_timestamp("timestamp", timestamp)
            if ts < floor:
                self.dropped_records += 1
                continue
            groups.setdefault(table.encode_key(key), []).append((i, ts))
        for rows in groups.values():
            key = keys[rows[0][0]]
            if len(rows) == 1:
                i, ts = rows[0]
                found = table.get(key, ts)
                out[i] = self._joined(key, values[i], ts, found)
                continue
            times = [ts for _, ts in rows]
            # every version valid at some time of the batch, oldest first
            versions = table.get_versions(key, min(times), max(times), ascending=True)
            for i, ts in rows:
                valid = None
                for v in versions:
                    if v.timestamp > ts:
                        break
                    if v.valid_to is None or ts < v.valid_to:
                        valid = v
                out[i] = self._joined(key, values[i], ts, valid)
        return out

    def _joined(self, key: Any, value: Any, ts: int, found: Any) -> JoinedRecord | None:
        if found is None:
            if self.how == "inner":
                return None
            return JoinedRecord(key, ts, self.joiner(value, None))
        return JoinedRecord(key, ts, self.joiner(value, found.value))

    def process_rows(
        self,
        sides: Sequence[str],
        keys: Sequence[Any],
        timestamps: Sequence[int | None],
        values: Sequence[Any],
    ) -> list[JoinedRecord]:
        """Process interleaved table and stream records in arrival order, atomically."""
        out: list[JoinedRecord] = []
        with self.table.batch():
            for side, key, ts, value in zip(sides, keys, timestamps, values, strict=True):
                if side == TABLE:
                    if key is None or ts is None:
                        self.dropped_records += 1
                        continue
                    self.process_table(key, value, ts)
                elif side == STREAM:
                    joined = self.process_stream(key, value, ts)
                    if joined is not None:
                        out.append(joined)
                else:
                    raise ValueError(f"side must be {STREAM!r} or {TABLE!r}, got {side!r}")
        return out
