"""A task's input as the operators read it: in a deterministic order (a retried
task gives the same output), keys and structs as Python values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["deterministic_order", "key_values", "struct_values"]


def deterministic_order(table: pa.Table, first: Sequence[str] = ()) -> pa.Table:
    """``table`` sorted by ``first``, then by every other sortable column.

    Spark does not promise that a shuffle delivers rows in the same order when a
    task is retried; sorting makes a retried or replayed task process exactly the
    same sequence, so its output and state are the same. Struct columns are sorted
    by their fields; rows equal in every sortable column are interchangeable.
    """
    flat = table.flatten()
    names = list(first) + [n for n in flat.column_names if n not in first]
    keys = [
        (n, "ascending", "at_start")
        for n in names
        if not pa.types.is_nested(flat.schema.field(n).type)
        and not pa.types.is_null(flat.schema.field(n).type)
    ]
    if not keys or table.num_rows < 2:
        return table
    return table.take(pc.sort_indices(flat, sort_keys=keys))


def key_values(table: pa.Table, keys: list[str]) -> list[Any]:
    """The key of every row: a column's values, or tuples for several columns; None
    where a key column is null (a null key: operators drop such rows and count
    them, a tuple with a None in it is no key the store can hold)."""
    if len(keys) == 1:
        return table.column(keys[0]).to_pylist()
    cols = [table.column(k).to_pylist() for k in keys]
    return [None if None in parts else parts for parts in zip(*cols, strict=True)]


def struct_values(table: pa.Table, name: str) -> list[Any]:
    """The dicts of a struct column, or Nones when no input row had it."""
    if name in table.column_names:
        return table.column(name).to_pylist()
    return [None] * table.num_rows
