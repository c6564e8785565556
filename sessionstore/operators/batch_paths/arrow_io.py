"""Arrow in, Arrow out: turning record batches into the operators' columns and
their emitted updates back into tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.arrow_pandas import numpy_of

__all__ = ["columns_of", "epoch_millis", "epoch_millis_array", "updates_to_arrow"]

_UNIT_TO_MS = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}
#: Seconds to milliseconds, typed: a Python int's type is inferred, which imports
#: pandas (sessionstore.arrow_pandas).
_MS_PER_S = pa.scalar(1000, pa.int64())


def epoch_millis_array(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """``(epoch milliseconds as int64, validity)`` of an integer or timestamp column;
    null rows hold 0. Sub-millisecond times are floored, exactly."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    valid = numpy_of(column.is_valid())
    if pa.types.is_timestamp(column.type):
        ints = numpy_of(pc.cast(column, pa.int64()).fill_null(0))
        unit = column.type.unit
        if unit == "s":
            ints = numpy_of(pc.multiply_checked(pa.array(ints), _MS_PER_S))
        elif unit != "ms":
            ints = np.floor_divide(ints, _UNIT_TO_MS[unit])
        return ints.astype(np.int64, copy=False), valid
    if pa.types.is_integer(column.type):
        # a safe cast: uint64 times beyond int64 raise ArrowInvalid
        ints = numpy_of(pc.cast(column, pa.int64()).fill_null(0))
        return ints, valid
    raise TypeError(
        f"timestamp column must be an integer (epoch ms) or timestamp type, got {column.type}"
    )


def epoch_millis(column: pa.Array | pa.ChunkedArray) -> list[int | None]:
    """Epoch milliseconds of an integer or timestamp column (nulls stay None)."""
    if pa.types.is_integer(column.type):
        return column.to_pylist()  # exact for any width; the operators check the range
    ints, valid = epoch_millis_array(column)
    out = ints.tolist()
    if not valid.all():
        for i in np.flatnonzero(~valid).tolist():
            out[i] = None
    return out


def _column(batch: Any, name: str) -> Any:
    try:
        return batch.column(name)
    except KeyError:
        raise KeyError(f"column {name!r} not in batch; it has {batch.schema.names}") from None


def columns_of(
    batch: Any,
    key: str | Sequence[str],
    timestamp: str,
    value: str | Sequence[str] | None,
) -> tuple[list[Any], list[int | None], list[Any]]:
    """``(keys, timestamps, values)`` as Python lists from a table or record batch."""
    if isinstance(key, str):
        keys = _column(batch, key).to_pylist()
    else:
        cols = [_column(batch, k).to_pylist() for k in key]
        keys = [
            None if any(p is None for p in parts) else tuple(parts)
            for parts in zip(*cols, strict=True)
        ]
    timestamps = epoch_millis(_column(batch, timestamp))
    if value is None:
        values: list[Any] = [None] * batch.num_rows
    elif isinstance(value, str):
        values = _column(batch, value).to_pylist()
    else:
        cols = [_column(batch, v).to_pylist() for v in value]
        values = [dict(zip(value, row, strict=True)) for row in zip(*cols, strict=True)]
    return keys, timestamps, values


def updates_to_arrow(updates: Sequence[Any], key: str | Sequence[str] = "key") -> pa.Table:
    """A table with the key column(s), ``start``, ``end``, ``value`` and ``timestamp``."""
    data: dict[str, Any] = {}
    if isinstance(key, str):
        data[key] = [u.key for u in updates]
    else:
        for i, name in enumerate(key):
            data[name] = [u.key[i] for u in updates]
    data["start"] = pa.array([u.start for u in updates], pa.int64())
    data["end"] = pa.array([u.end for u in updates], pa.int64())
    data["value"] = [u.value for u in updates]
    data["timestamp"] = pa.array([u.timestamp for u in updates], pa.int64())
    return pa.table(data)
