"""Feeding session aggregators from record tuples in tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sessionstore.operators import SessionUpdate, SessionWindowAggregator


def process_tuples(
    agg: SessionWindowAggregator, records: Sequence[tuple], *, net: bool = False
) -> list[SessionUpdate]:
    """``agg.process_rows`` over ``(key, value, timestamp[, offset])`` tuples."""
    offsets: list[Any] | None = [r[3] for r in records] if records and len(records[0]) > 3 else None
    keys = [r[0] for r in records]
    values = [r[1] for r in records]
    timestamps = [r[2] for r in records]
    return agg.process_rows(keys, timestamps, values, offsets, net=net)
