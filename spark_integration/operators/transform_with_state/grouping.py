"""A batch's rows grouped by key: the runs of equal keys in rows sorted by them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["group_bounds", "key_runs"]


def group_bounds(keys: list[Any]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal keys in a sorted list."""
    bounds = []
    start = 0
    for i in range(1, len(keys)):
        if keys[i] != keys[i - 1]:
            bounds.append((start, i))
            start = i
    if keys:
        bounds.append((start, len(keys)))
    return bounds


def key_runs(table: pa.Table, keys: list[str]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal keys in ``table``, sorted by ``keys``
    (which hold no nulls), found by Arrow over whole columns: no Python value per
    row. Columns Arrow cannot compare go through :func:`group_bounds`."""
    n = table.num_rows
    if n == 0:
        return []
    changed = np.zeros(n - 1, dtype=bool)
    try:
        for k in keys:
            column = table.column(k)
            differs = pc.not_equal(column.slice(1), column.slice(0, n - 1))
            changed |= differs.to_numpy(zero_copy_only=False)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError):
        cols = [table.column(k).to_pylist() for k in keys]
        return group_bounds(cols[0] if len(keys) == 1 else list(zip(*cols, strict=True)))
    starts = [0, *(np.flatnonzero(changed) + 1).tolist()]
    return list(zip(starts, [*starts[1:], n], strict=True))
