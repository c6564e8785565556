"""What the columnar operator paths share: checking that a batch qualifies, its
aggregate input columns, key group codes, and the shape of their output tables.

A columnar path (:mod:`.sessions.columns`, :mod:`.windows.columns`) takes built-in
count/sum/min/max/first/last aggregates, and count(c), avg, the moments and
min_by/max_by over numeric columns (nulls allowed, doubles finite), and the lists,
sets and sketches (each group's values folded in order by the record path's own
slot functions); sums, minima
and maxima read integer columns without nulls whose total cannot overflow int64
(float sums depend on the order of addition; exact ints do not). Output tables
have the key columns, ``start``, ``end``, a ``value`` struct (int64 counts, sums,
minima and maxima, counts of distinct values; doubles for avg, the moments and
percentiles; lists of the column's type; ``first``, ``last``, ``min_by`` and
``max_by`` keep their column's type) and ``timestamp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.arrow_pandas import numpy_of
from sessionstore.operators.aggregate_functions import FOLDED, MOMENTS, bind
from sessionstore.operators.batch_paths.arrow_io import epoch_millis_array
from sessionstore.operators.batch_paths.vectorised import SUM_LIMIT, columnar_functions

__all__ = [
    "AggregateColumn", "Prepared", "prepare", "sortable_keys", "group_key_values", "value_struct_type",
    "GroupAggregates", "result_table", "rows_result", "empty_result",
]  # fmt: skip


#: Functions over a numeric column with nulls: its values and validity as numpy.
_NUMERIC = MOMENTS | {"avg", "count"}
_BY = ("min_by", "max_by")


@dataclass
class AggregateColumn:
    """One aggregate's input: its function and, unless a count of rows, its Arrow
    column, with as numpy: the int64 values for sum, min and max; for count(c),
    avg and the moments the values as doubles (``numbers``) and their validity;
    for min_by/max_by the ordering column's values (``numbers``, int64 or doubles)
    and validity, and the ordering column itself (``order``)."""

    fn: str
    column: pa.Array | None
    ints: np.ndarray | None
    numbers: np.ndarray | None = None
    valid: np.ndarray | None = None
    order: pa.Array | None = None
    #: lists, sets and sketches: the record path's slot functions, which fold
    #: each group's values
    bound: Any = None


@dataclass
class Prepared:
    """A batch that qualifies: its table, key column names, aggregate inputs, event
    times in ms with their validity (key and time non-null), and key group codes."""

    table: pa.Table
    key_names: list[str]
    slots: list[AggregateColumn]
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
    if columnar_functions(aggregation) is None:
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


def _slots(aggregation: Any, table: pa.Table, value: Any) -> list[AggregateColumn] | None:
    """Each aggregate's input column, or None if the batch does not qualify."""
    slots = []
    n = table.num_rows
    for spec in aggregation.specs:
        fn, column = spec.fn, spec.column
        if fn == "count" and column is None:
            slots.append(AggregateColumn(fn, None, None))
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
        if fn in FOLDED:
            slots.append(AggregateColumn(fn, arr, None, bound=bind(spec)))
            continue
        if fn == "count":  # of a column: its validity is all it reads
            valid = numpy_of(arr.is_valid())
            slots.append(AggregateColumn(fn, arr, None, np.zeros(n), valid))
            continue
        if fn in _NUMERIC or fn in _BY:
            source = arr
            if fn in _BY:
                if not isinstance(value, (list, tuple)) or spec.extra[0] not in value:
                    return None
                source = _array(table, spec.extra[0])
            numbers = _numbers(source, integral_ok=fn in _BY)
            if numbers is None:
                return None
            order = source if fn in _BY else None
            slots.append(AggregateColumn(fn, arr, None, numbers[0], numbers[1], order))
            continue
        if fn in ("sum", "min", "max"):
            if not pa.types.is_integer(arr.type) or arr.null_count:
                return None
            try:
                ints = numpy_of(pc.cast(arr, pa.int64()))
            except pa.ArrowInvalid:
                return None  # uint64 beyond int64
            if fn == "sum" and n and int(np.abs(ints).max()) * n >= SUM_LIMIT:
                return None
        slots.append(AggregateColumn(fn, arr, ints))
    return slots


def _numbers(arr: pa.Array, integral_ok: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """A numeric column's values (doubles; int64 kept for an ordering) and validity,
    or None when it is not numeric or holds a non-finite double (whose order and
    arithmetic the record path defines)."""
    t = arr.type
    valid = numpy_of(arr.is_valid())
    if pa.types.is_integer(t):
        if integral_ok:
            try:
                ints = numpy_of(pc.cast(arr, pa.int64()).fill_null(0))
            except pa.ArrowInvalid:
                return None
            return ints, valid
        doubles = numpy_of(pc.cast(arr, pa.float64()).fill_null(0.0))
        if np.abs(doubles).max(initial=0.0) >= 2**53:
            return None  # not exact as a double
        return doubles, valid
    if pa.types.is_floating(t):
        doubles = numpy_of(pc.cast(arr, pa.float64()).fill_null(0.0))
        if not np.isfinite(doubles).all():
            return None
        return doubles, valid
    return None


def _group_codes(
    table: pa.Table, key_names: list[str], valid: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """A code per row that is equal exactly for equal keys, and the rows' validity
    (key columns and time non-null)."""
    codes = None
    radix = 1
    for name in key_names:
        col = _array(table, name)
        valid = valid & numpy_of(col.is_valid())
        encoded = pc.dictionary_encode(col)
        size = max(len(encoded.dictionary), 1)
        if radix * size >= 2**62:
            return None
        c = numpy_of(encoded.indices.fill_null(0)).astype(np.int64)
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
        self, rows: np.ndarray, times: np.ndarray, starts: np.ndarray, slots: list[AggregateColumn]
    ) -> None:
        m = len(rows)
        self.a = np.flatnonzero(starts)  # each group's first position
        self.b = np.append(self.a[1:], m).astype(np.int64) if m else self.a  # its end
        self.slots = slots
        self.count = self.b - self.a
        self.first_row, self.last_row = rows[self.a], rows[self.b - 1]
        self.first_ts, self.last_ts = times[self.a], times[self.b - 1]
        self.reduced: list[Any] = []
        for slot in slots:
            if slot.bound is not None:
                self.reduced.append(self._folded(slot, rows))
            elif slot.numbers is not None:
                self.reduced.append(self._numeric(slot, rows, times, m))
            elif slot.fn not in ("sum", "min", "max"):
                self.reduced.append(None)
            elif not m:  # reduceat refuses empty input
                self.reduced.append(np.zeros(0, dtype=np.int64))
            else:
                ufunc = {"sum": np.add, "min": np.minimum, "max": np.maximum}[slot.fn]
                self.reduced.append(ufunc.reduceat(slot.ints[rows], self.a))

    def _folded(self, slot: AggregateColumn, rows: np.ndarray) -> list[Any]:
        """Each group's slot: its values, in order, added as the record path adds them."""
        values = slot.column.take(pa.array(rows, pa.int64())).to_pylist()
        init, add, groups = slot.bound.init, slot.bound.add, slot.bound.groups
        if groups is not None:
            return groups(values, self.a.tolist(), self.b.tolist())
        out = []
        for a, b in zip(self.a.tolist(), self.b.tolist(), strict=True):
            acc = init()
            for v in values[a:b]:
                acc = add(acc, v, 0)  # these slots ignore the time
            out.append(acc)
        return out

    def _numeric(self, slot: AggregateColumn, rows: np.ndarray, times: np.ndarray, m: int) -> Any:
        """count(c), avg and the moments: ``(n, sum, mean, m2)`` per group; min_by and
        max_by: the row of each group's extreme ordering value (-1 for none) and its
        time."""
        groups = len(self.a)
        if not m:
            zeros = np.zeros(groups)
            if slot.fn in _BY:
                return np.zeros(groups, dtype=np.int64), np.zeros(groups, dtype=np.int64)
            return (zeros,) * 4
        x, ok = slot.numbers[rows], slot.valid[rows]
        n = np.add.reduceat(ok.astype(np.int64), self.a)
        if slot.fn in _BY:
            if x.dtype == np.int64:
                far = np.iinfo(np.int64).max if slot.fn == "min_by" else np.iinfo(np.int64).min
            else:
                far = np.inf if slot.fn == "min_by" else -np.inf
            keyed = np.where(ok, x, far)
            best = (np.minimum if slot.fn == "min_by" else np.maximum).reduceat(keyed, self.a)
            owner = np.repeat(np.arange(groups), self.count)
            # the first row (by time, then arrival) holding the extreme keeps it
            hit = ok & (keyed == best[owner])
            first = np.minimum(np.minimum.reduceat(np.where(hit, np.arange(m), m), self.a), m - 1)
            return np.where(n > 0, rows[first], -1), times[first]
        total = np.add.reduceat(np.where(ok, x, 0.0), self.a)
        mean = np.divide(total, n, out=np.zeros(groups), where=n > 0)
        owner = np.repeat(np.arange(groups), self.count)
        m2 = np.add.reduceat(np.where(ok, (x - mean[owner]) ** 2, 0.0), self.a)
        return n, total, mean, m2

    def slot_values(self, j: int, idx: Any) -> list[Any]:
        """Python values of aggregate ``j`` for groups ``idx`` (as stored in an acc)."""
        slot = self.slots[j]
        if slot.fn == "count" and slot.column is None:
            return self.count[idx].tolist()
        if slot.bound is not None:
            folded = self.reduced[j]
            return [folded[i] for i in np.arange(len(folded))[idx].tolist()]
        if slot.fn in _NUMERIC:
            n, total, mean, m2 = (part[idx].tolist() for part in self.reduced[j])
            if slot.fn == "count":
                return n
            if slot.fn == "avg":
                return [[c, s] for c, s in zip(n, total, strict=True)]
            return [[c, mu, q] for c, mu, q in zip(n, mean, m2, strict=True)]
        if slot.fn in _BY:
            at, when = self.reduced[j][0][idx], self.reduced[j][1][idx]
            picked = pa.array(np.maximum(at, 0), pa.int64())
            orders = slot.order.take(picked).to_pylist()
            values = slot.column.take(picked).to_pylist()
            return [
                None if r < 0 else [o, v, t]
                for r, o, v, t in zip(at.tolist(), orders, values, when.tolist(), strict=True)
            ]
        if slot.fn in ("sum", "min", "max"):
            return self.reduced[j][idx].tolist()
        if slot.fn == "first":
            times, rows = self.first_ts[idx], self.first_row[idx]
        else:
            times, rows = self.last_ts[idx], self.last_row[idx]
        values = slot.column.take(pa.array(rows, pa.int64())).to_pylist()
        return [[t, v] for t, v in zip(times.tolist(), values, strict=True)]

    def result_array(self, j: int, idx: Any, out_type: pa.DataType) -> pa.Array:
        """Results of aggregate ``j`` for groups ``idx`` as an Arrow array of
        ``out_type``, as :meth:`Aggregations.finish` gives them."""
        slot = self.slots[j]
        fn = slot.fn
        if fn == "count" and slot.column is None:
            return pa.array(self.count[idx], pa.int64())
        if fn in ("sum", "min", "max"):
            return pa.array(self.reduced[j][idx], pa.int64())
        if fn in ("first", "last"):
            at = self.first_row if fn == "first" else self.last_row
            return slot.column.take(pa.array(at[idx], pa.int64()))
        if slot.bound is not None:
            results = slot.bound.column(self.slot_values(j, idx))
            if isinstance(results, pa.Array):
                return results.cast(out_type)
            return pa.array(results, out_type)
        if fn in _BY:
            at = self.reduced[j][0][idx]
            taken = slot.column.take(pa.array(np.maximum(at, 0), pa.int64()))
            return pc.if_else(pa.array(at >= 0), taken, pa.nulls(len(at), out_type))
        n, total, mean, m2 = (part[idx] for part in self.reduced[j])
        if fn == "count":
            return pa.array(n, pa.int64())
        if fn == "avg":
            return pa.array(np.divide(total, n, out=np.zeros(len(n)), where=n > 0), mask=n == 0)
        floor = 1 if fn.endswith("_pop") else 2
        divisor = n if fn.endswith("_pop") else n - 1
        var = np.divide(m2, divisor, out=np.zeros(len(n)), where=n >= floor)
        if fn.startswith("stddev"):
            var = np.sqrt(np.maximum(var, 0.0))
        return pa.array(var, mask=n < floor)

    def accs(self, idx: Any = slice(None)) -> list[list[Any]]:
        """The accumulators (one list per group) of groups ``idx`` (all by default)."""
        per_slot = [self.slot_values(j, idx) for j in range(len(self.slots))]
        return [list(acc) for acc in zip(*per_slot, strict=True)]


def value_struct_type(aggregation: Any, slots: list[AggregateColumn]) -> pa.StructType:
    """The ``value`` struct: int64 counts, sums, minima and maxima; double averages
    and moments; ``first``, ``last``, ``min_by`` and ``max_by`` keep their column's
    type."""
    fields = []
    for spec, slot in zip(aggregation.specs, slots, strict=True):
        if slot.fn in ("first", "last", *_BY):
            t = slot.column.type
        elif slot.fn == "avg" or slot.fn in MOMENTS:
            t = pa.float64()
        elif slot.fn in ("collect_list", "collect_set"):
            t = pa.list_(slot.column.type)
        elif slot.fn == "percentile_approx":
            many = isinstance(spec.extra[0], tuple)
            t = pa.list_(pa.float64()) if many else pa.float64()
        else:
            t = pa.int64()
        fields.append(pa.field(spec.name, t))
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
