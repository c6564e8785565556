"""Feeding session aggregators from record tuples in tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from sessionstore.operators import ClosedSessions, SessionUpdate, SessionWindowAggregator


def process_tuples(
    agg: SessionWindowAggregator, records: Sequence[tuple], *, net: bool = False
) -> list[SessionUpdate]:
    """``agg.process_rows`` over ``(key, value, timestamp[, offset])`` tuples."""
    offsets: list[Any] | None = [r[3] for r in records] if records and len(records[0]) > 3 else None
    keys = [r[0] for r in records]
    values = [r[1] for r in records]
    timestamps = [r[2] for r in records]
    return agg.process_rows(keys, timestamps, values, offsets, net=net)


def kv_table(rows: Sequence[tuple]) -> pa.Table:
    """``(key, ts, v)`` tuples as an Arrow table of ``key`` (string), ``ts`` and ``v``
    (int64)."""
    return pa.table({
        "key": pa.array([r[0] for r in rows], pa.string()),
        "ts": pa.array([r[1] for r in rows], pa.int64()),
        "v": pa.array([r[2] for r in rows], pa.int64()),
    })  # fmt: skip


def closed_rows(closed: ClosedSessions) -> list[tuple]:
    """Sessions closed as columns as ``(key, start, end, {name: result})`` rows,
    the fields of the :class:`SessionUpdate` objects of the same close."""
    values = {
        name: c if isinstance(c, list) else c.to_pylist() for name, c in closed.values.items()
    }
    bounds = zip(closed.keys, closed.starts, closed.ends, strict=True)
    return [
        (key, start, end, {name: values[name][i] for name in values})
        for i, (key, start, end) in enumerate(bounds)
    ]
