"""What the columnar operator paths share: checking that a batch qualifies, its
aggregate input columns, key group codes, and the shape of their output tables.

A columnar path (:mod:`.sessions.columns`, :mod:`.windows.columns`) takes built-in
count/sum/min/max/first/last aggregates; sums, minima and maxima read integer
columns without nulls whose total cannot overflow int64 (float sums depend on the
order of addition; exact ints do not). Output tables have the key columns,
``start``, ``end``, a ``value`` struct (int64 counts, sums, minima and maxima;
``first`` and ``last`` keep their column's type) and ``timestamp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.operators.arrow_io import epoch_millis_array
from sessionstore.operators.vectorised import SUM_LIMIT, built_in_functions

__all__ = [
    "Slot", "Prepared", "prepare", "sortable_keys", "group_key_values", "value_struct_type",
    "GroupAggregates", "result_table", "rows_result", "empty_result",
]  # fmt: skip


@dataclass
class Slot:
    """One aggregate's input: its function and, unless a count, its Arrow column
    (with the int64 values for sum, min and max)."""

    fn: str
    column: pa.Array | None
    ints: np.ndarray | None


@dataclass
class Prepared:
    """A batch that qualifies: its table, key column names, aggregate inputs, event
    times in ms with their validity (key and time non-null), and key group codes."""

    table: pa.Table
    key_names: list[str]
    slots: list[Slot]
    ts: np.ndarray
    valid: np.ndarray
    codes: np.ndarray


def prepare(
    aggregation: Any,
    batch: pa.Table | pa.RecordBatch,
    key: str | list[str],
    timestamp: str,
    value: str | list[str] | None,
) -> Prepared | None:
    """The batch's columnar input, or None when it does not qualify (then the
    record-exact path runs, and raises the error that names a bad input)."""
    if built_in_functions(aggregation) is None:
        return None
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    key_names = [key] if isinstance(key, str) else list(key)
    if table.num_rows == 0 or not {*key_names, timestamp} <= set(table.column_names):
        return None
    slots = _slots(aggregation, table, value)
    if slots is None:
        return None
    try:
        ts, valid = epoch_millis_array(table.column(timestamp))
        groups = _group_codes(table, key_names, valid)
    except (TypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if groups is None:
        return None
    codes, valid = groups
    return Prepared(table, key_names, slots, ts, valid, codes)


def sortable_keys(store: Any, table: pa.Table, key_names: list[str]) -> bool:
    """Whether the store's key codec is the default one and the key columns are of
    types it orders exactly as Arrow sorts them (strings and binaries bytewise,
    integers numerically, tuples lexicographically)."""
    if getattr(store, "key_serde", None) is not None:
        return False
    for name in key_names:
        t = table.schema.field(name).type
        if not (
            pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or (pa.types.is_integer(t) and not pa.types.is_uint64(t))
        ):
            return False
    return True


def _array(table: pa.Table, name: str) -> pa.Array:
    return table.column(name).combine_chunks()


def _slots(aggregation: Any, table: pa.Table, value: Any) -> list[Slot] | None:
    """Each aggregate's input column, or None if the batch does not qualify."""
    slots = []
    n = table.num_rows
    for fn, column in zip(aggregation.functions, aggregation.columns, strict=True):
        if fn == "count":
            slots.append(Slot(fn, None, None))
            continue
        # the value the record path would aggregate: a scalar column, or a row's field
        if isinstance(value, str) and column is None:
            name = value
        elif isinstance(value, (list, tuple)) and column in value:
            name = column
        else:
            return None
        if name not in table.column_names:
            return None
        arr = _array(table, name)
        ints = None
        if fn in ("sum", "min", "max"):
            if not pa.types.is_integer(arr.type) or arr.null_count:
                return None
            try:
                ints = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False)
            except pa.ArrowInvalid:
                return None  # uint64 beyond int64
            if fn == "sum" and n and int(np.abs(ints).max()) * n >= SUM_LIMIT:
                return None
        slots.append(Slot(fn, arr, ints))
    return slots


def _group_codes(
    table: pa.Table, key_names: list[str], valid: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """A code per row that is equal exactly for equal keys, and the rows' validity
    (key columns and time non-null)."""
    codes = None
    radix = 1
    for name in key_names:
        col = _array(table, name)
        valid = valid & col.is_valid().to_numpy(zero_copy_only=False)
        encoded = pc.dictionary_encode(col)
        size = max(len(encoded.dictionary), 1)
        if radix * size >= 2**62:
            return None
        c = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        codes = c if codes is None else codes * size + c
        radix *= size
    return codes, valid


def group_key_values(table: pa.Table, key_names: list[str], rows: np.ndarray) -> list[Any]:
    """Python values of the keys of ``rows`` (tuples for several columns)."""
    taken = [table.column(k).take(rows).to_pylist() for k in key_names]
    return taken[0] if len(taken) == 1 else [tuple(parts) for parts in zip(*taken, strict=True)]


class GroupAggregates:
    """The aggregates of consecutive groups of rows: ``rows`` (table row numbers)
    sorted by group, then by ``times`` (stably, so ties keep arrival order), with
    ``starts`` True at each group's first row. Accumulators are as the record path
    stores them: ``first``/``last`` as ``[time, value]``."""

    def __init__(
        self, rows: np.ndarray, times: np.ndarray, starts: np.ndarray, slots: list[Slot]
    ) -> None:
        m = len(rows)
        self.a = np.flatnonzero(starts)  # each group's first position
        self.b = np.append(self.a[1:], m).astype(np.int64) if m else self.a  # its end
        self.slots = slots
        self.count = self.b - self.a
        self.first_row, self.last_row = rows[self.a], rows[self.b - 1]
        self.first_ts, self.last_ts = times[self.a], times[self.b - 1]
        self.reduced: list[np.ndarray | None] = []
        for slot in slots:
            if slot.fn not in ("sum", "min", "max"):
                self.reduced.append(None)
            elif not m:  # reduceat refuses empty input
                self.reduced.append(np.zeros(0, dtype=np.int64))
            else:
                ufunc = {"sum": np.add, "min": np.minimum, "max": np.maximum}[slot.fn]
                self.reduced.append(ufunc.reduceat(slot.ints[rows], self.a))

    def slot_values(self, j: int, idx: Any) -> list[Any]:
        """Python values of aggregate ``j`` for groups ``idx`` (as stored in an acc)."""
        slot = self.slots[j]
        if slot.fn == "count":
            return self.count[idx].tolist()
        if slot.fn in ("sum", "min", "max"):
            return self.reduced[j][idx].tolist()
        if slot.fn == "first":
            times, rows = self.first_ts[idx], self.first_row[idx]
        else:
            times, rows = self.last_ts[idx], self.last_row[idx]
        values = slot.column.take(pa.array(rows, pa.int64())).to_pylist()
        return [[t, v] for t, v in zip(times.tolist(), values, strict=True)]

    def accs(self, idx: Any = slice(None)) -> list[list[Any]]:
        """The accumulators (one list per group) of groups ``idx`` (all by default)."""
        per_slot = [self.slot_values(j, idx) for j in range(len(self.slots))]
        return [list(acc) for acc in zip(*per_slot, strict=True)]


def value_struct_type(aggregation: Any, slots: list[Slot]) -> pa.StructType:
    """The ``value`` struct: int64 counts, sums, minima and maxima; ``first`` and
    ``last`` keep their column's type."""
    fields = []
    for name, slot in zip(aggregation.names, slots, strict=True):
        fields.append(
            pa.field(name, slot.column.type if slot.fn in ("first", "last") else pa.int64())
        )
    return pa.struct(fields)


def result_table(key_names, key_arrays, start, end, value) -> pa.Table:
    """An output table from its columns (``timestamp`` is the end)."""
    data = dict(zip(key_names, key_arrays, strict=True))
    data["start"] = start
    data["end"] = end
    data["value"] = value
    data["timestamp"] = end
    return pa.table(data)


def rows_result(
    table: pa.Table,
    key_names: list[str],
    keys: list[Any],
    starts: list[int],
    ends: list[int],
    values: list[Any],
    out_type: pa.StructType,
) -> pa.Table:
    """An output table from Python rows (keys are tuples for several key columns)."""
    if not keys:
        return empty_result(table, key_names, out_type)
    key_lists = [keys] if len(key_names) == 1 else [list(col) for col in zip(*keys, strict=True)]
    key_arrays = [
        pa.array(values_, table.schema.field(k).type)
        for k, values_ in zip(key_names, key_lists, strict=True)
    ]
    return result_table(
        key_names, key_arrays, pa.array(starts, pa.int64()), pa.array(ends, pa.int64()),
        pa.array(values, out_type),
    )  # fmt: skip


def empty_result(table: pa.Table, key_names: list[str], out_type: pa.StructType) -> pa.Table:
    """An output table with no rows."""
    keys = [pa.array([], table.schema.field(k).type) for k in key_names]
    ints = pa.array([], pa.int64())
    return result_table(key_names, keys, ints, ints, pa.array([], out_type))
