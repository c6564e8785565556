"""Row conversion of ``transform_with_state``: a batch's rows as the PySpark
``Row`` objects a processor's ``handleInputRows`` iterates, and the rows a
processor returns as Arrow.

A key's rows are made of one class per schema (:func:`row_class`), as the key is
read; the output is read by position when a row's fields are the output schema's
(a plain tuple, or a ``Row`` in order), else by field name, as Spark reads a
``Row``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any

import pyarrow as pa

__all__ = ["row_class", "row_maker", "row_slices", "rows_output"]


@functools.lru_cache(maxsize=64)
def row_class(names: tuple[str, ...]) -> type:
    """A subclass of PySpark's ``Row`` with fields ``names``: the field names live
    on the class and each field is a descriptor that reads item i (namedtuple's C
    one, or a property), so a row is made by
    ``tuple.__new__`` and read by attribute without ``Row``'s per-call work (its
    ``Row(*names)(*values)`` builds every row through Python code, and its
    ``row.name`` searches the field list). Everything else is ``Row``'s own:
    ``isinstance(row, Row)``, ``asDict``, ``row["name"]``, repr, equality with
    tuples, pickling (as a plain ``Row``). A name that is an attribute of ``Row``
    (``count``, ``index``) stays that attribute, as with ``Row``."""
    from pyspark.sql import Row

    try:  # namedtuple's field descriptor: a C-level read of item i, no Python frame
        from _collections import _tuplegetter

        def field(i: int) -> Any:
            return _tuplegetter(i, None)
    except ImportError:  # not CPython
        get = tuple.__getitem__  # not Row's __getitem__, which is Python code

        def field(i: int) -> Any:
            return property(lambda row: get(row, i))

    attrs: dict[str, Any] = {"__fields__": list(names), "__module__": __name__}
    for i, name in enumerate(names):
        if not name.startswith("__") and not hasattr(Row, name) and names.index(name) == i:
            attrs[name] = field(i)
    return type("Row", (Row,), attrs)


def row_maker(names: Sequence[str]) -> Callable[[tuple], Any]:
    """``make(values)``: a PySpark ``Row`` of the fields ``names`` holding the
    tuple ``values`` (see :func:`row_class`; one class per set of names)."""
    return functools.partial(tuple.__new__, row_class(tuple(names)))


def row_slices(
    data: pa.Table, converted: Mapping[str, list[Any]] | None = None
) -> Callable[[int, int], Callable[[], Iterator[Any]]]:
    """``make(start, end)``: the rows factory of a key whose rows are
    ``data[start:end]``, an iterator of ``Row``s made as the key is read.
    ``converted`` holds the Python values of columns already converted, by name."""
    cls = row_class(tuple(data.column_names))
    converted = converted or {}
    columns = [
        converted[name] if name in converted else column.to_pylist()
        for name, column in zip(data.column_names, data.columns, strict=True)
    ]
    new = tuple.__new__

    def make(start: int, end: int) -> Callable[[], Iterator[Any]]:
        # zip's tuple is reused once each Row has copied it, so a row costs one
        # object, not two; map calls tuple.__new__ directly (no partial between)
        return lambda: map(new, repeat(cls), zip(*[c[start:end] for c in columns], strict=True))

    return make


def rows_output(outputs: list[Any], schema: pa.Schema) -> pa.Table:
    """The rows a processor returned (tuples or ``Row``s) as one Arrow table of
    ``schema``."""
    if not outputs:
        return schema.empty_table()
    names = schema.names
    tuples = []
    for row in outputs:
        fields = getattr(row, "__fields__", None)
        if fields is None or fields == names:  # by position: a plain tuple, or in order
            tuples.append(row)
        else:  # Spark reads a Row by field name
            d = row.asDict(True)
            tuples.append(tuple(d.get(n) for n in names))
    columns = [list(c) for c in zip(*tuples, strict=True)] or [[] for _ in names]
    for i, f in enumerate(schema):
        if _holds_struct(f.type):  # nested Rows by field name, as Spark's asDict(True)
            columns[i] = [_as_dicts(v) for v in columns[i]]
    return pa.Table.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def _holds_struct(t: pa.DataType) -> bool:
    """Whether values of ``t`` may hold a struct (at any depth)."""
    if pa.types.is_struct(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _holds_struct(t.value_type)
    if pa.types.is_map(t):
        return _holds_struct(t.key_type) or _holds_struct(t.item_type)
    return False


def _as_dicts(v: Any) -> Any:
    """``v`` with its ``Row``s as dicts by field name, through lists and dict values
    (not tuples), as ``Row.asDict(recursive=True)`` converts what Spark's worker
    turns into Arrow: a nested ``Row`` is read by name, a plain tuple by position."""
    fields = getattr(v, "__fields__", None)
    if fields is not None:
        return dict(zip(fields, map(_as_dicts, v), strict=False))
    if isinstance(v, list):
        return [_as_dicts(x) for x in v]
    if isinstance(v, dict):
        return {k: _as_dicts(x) for k, x in v.items()}
    return v
