"""A batch's rows grouped by key, in replay-safe order: :func:`grouped_rows`.

Spark does not promise that a shuffle delivers a partition's rows in the same
order when a task is retried or a batch replayed, and a processor's output and
state may depend on the order it sees rows in (a list it appends to). So the
order a processor sees is a function of the batch's content alone: rows sorted
by the grouping key, then by every other sortable column, as
:func:`~spark_integration.execution.inputs.deterministic_order` sorts them;
rows equal in every sortable column are interchangeable.

:func:`grouped_rows` gets that order without Arrow's multi-column sort, whose
string comparisons were about a fifth of a task: each sortable column becomes
its dense rank (a hash pass, ``dictionary_encode``, then a sort of its distinct
values only), the ranks are packed into one int64 per row (mixed radix: key
columns first, nulls first, as the multi-column sort orders them), and one
integer ``argsort`` orders the rows. Equal codes are rows equal in every sortable
column, so the sort need not be stable. A batch with a column this does not rank
(a float, a decimal, a struct) is sorted by Arrow as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.arrow_pandas import numpy_of
from spark_integration.execution.inputs import deterministic_order

__all__ = ["KeyGroups", "grouped_rows", "group_bounds", "key_runs"]

#: Largest packed code: ranks are combined into one int64.
_CODE_LIMIT = 2**63


@dataclass
class KeyGroups:
    """A batch in replay-safe order (see the module doc)."""

    #: the rows, sorted
    table: pa.Table
    #: ``(start, end)`` of each run of equal keys in ``table``
    bounds: list[tuple[int, int]]
    #: Python values of some of ``table``'s columns by name (string and binary
    #: columns, made from their distinct values as a by-product of ranking them);
    #: a column not here is converted by the caller
    values: dict[str, list[Any]] = field(default_factory=dict)


def _text(t: pa.DataType) -> bool:
    """Whether ``t`` is a string or binary type (whose Python values are made once
    per distinct value)."""
    return (
        pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )  # fmt: skip


def _ranked(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` is ranked through its distinct values: types
    whose equal values are identical (no float ``-0.0 == 0.0``, no NaN)."""
    return (
        pa.types.is_integer(t)
        or _text(t)
        or pa.types.is_boolean(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
        or pa.types.is_time(t)
    )


def _dense_rank(column: pa.Array) -> tuple[np.ndarray, int, pa.Array, np.ndarray]:
    """``(rank of each row, distinct ranks, distinct values, dictionary index of each
    row)``: rank 0 is null, 1 the least value; the index of a null row is
    ``len(distinct values)``."""
    encoded = pc.dictionary_encode(column)
    dictionary = encoded.dictionary
    n = len(dictionary)
    rank = np.empty(n + 1, dtype=np.int64)
    rank[numpy_of(pc.array_sort_indices(dictionary))] = np.arange(1, n + 1, dtype=np.int64)
    rank[n] = 0
    indices = encoded.indices
    if indices.null_count:
        indices = pc.fill_null(indices, n)
    index = numpy_of(indices)
    return rank[index], n + 1, dictionary, index


def grouped_rows(table: pa.Table, keys: list[str], python_values: bool = False) -> KeyGroups:
    """``table`` (whose ``keys`` hold no nulls) in replay-safe order, with the runs
    of equal keys (see the module doc); ``python_values``: with the Python values
    of the string and binary columns it ranked (:attr:`KeyGroups.values`)."""
    n = table.num_rows
    if n == 0:
        return KeyGroups(table, [])
    schema = table.schema
    others = [name for name in schema.names if name not in keys]
    sortable = []
    for name in [*keys, *others]:
        t = schema.field(name).type
        if _ranked(t):
            sortable.append(name)
        elif pa.types.is_struct(t) or not (pa.types.is_nested(t) or pa.types.is_null(t)):
            return _arrow_sorted(table, keys)  # a column ranks cannot order exactly
        # lists and maps are not sorted by (as deterministic_order does)
    if sortable[: len(keys)] != keys:  # a key that is a list
        return _arrow_sorted(table, keys)
    table = table.combine_chunks()
    ranks, sizes, distinct = [], [], {}
    for name in sortable:
        rank, size, dictionary, index = _dense_rank(table.column(name).chunk(0))
        ranks.append(rank)
        sizes.append(size)
        if python_values and _text(dictionary.type):
            distinct[name] = (dictionary, index)
    order = _order(ranks, sizes)
    changed = np.zeros(n - 1, dtype=bool)
    for rank in ranks[: len(keys)]:
        sorted_rank = rank[order]
        changed |= sorted_rank[1:] != sorted_rank[:-1]
    starts = [0, *(np.flatnonzero(changed) + 1).tolist()]
    bounds = list(zip(starts, [*starts[1:], n], strict=True))
    values = {}
    for name, (dictionary, index) in distinct.items():
        # one Python object per distinct value, shared by its rows
        objects = np.empty(len(dictionary) + 1, dtype=object)
        objects[: len(dictionary)] = dictionary.to_pylist()
        values[name] = objects[index[order]].tolist()
    return KeyGroups(table.take(pa.array(order)), bounds, values)


def _arrow_sorted(table: pa.Table, keys: list[str]) -> KeyGroups:
    """The batch sorted by Arrow's multi-column sort (columns not ranked)."""
    ordered = deterministic_order(table, keys)
    return KeyGroups(ordered, key_runs(ordered, keys))


def _order(ranks: list[np.ndarray], sizes: list[int]) -> np.ndarray:
    """The row order of the lexicographic order of ``ranks`` (each ``< sizes[i]``)."""
    total = 1
    for size in sizes:
        total *= size
    if total >= _CODE_LIMIT:  # too many distinct values to pack: a multi-pass sort
        return np.lexsort(ranks[::-1])
    code = ranks[0]
    for rank, size in zip(ranks[1:], sizes[1:], strict=True):
        code = code * size + rank
    # equal codes are rows equal in every sortable column: no stable sort needed
    return np.argsort(code)


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
            changed |= numpy_of(differs)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError):
        cols = [table.column(k).to_pylist() for k in keys]
        return group_bounds(cols[0] if len(keys) == 1 else list(zip(*cols, strict=True)))
    starts = [0, *(np.flatnonzero(changed) + 1).tolist()]
    return list(zip(starts, [*starts[1:], n], strict=True))
