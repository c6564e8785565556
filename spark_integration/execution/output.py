"""How operator tasks turn their results into the Arrow record batches
``mapInArrow`` returns: the output schema from Spark's, and rows from Python
columns or a columnar path's table."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.operators.sessions.model import ClosedSessions

__all__ = ["OperatorOutput", "arrow_schema", "record_batch"]

#: Arrow timestamps are in microseconds; event times are epoch milliseconds.
_MICROS_PER_MS = pa.scalar(1000, pa.int64())


@dataclass
class OperatorOutput:
    """How an aggregating operator's results become its output rows (picklable, so
    tasks carry it): the output schema (Spark JSON), the key columns, the aggregate
    plan ``(output column, function, input column)``, whether times are timestamps
    (else epoch ms), and the names of the start and end time columns."""

    schema_json: str
    keys: list[str]
    plan: list[tuple[str, str, str | None]]
    time_is_timestamp: bool
    start: str
    end: str

    def from_updates(
        self, updates: list[Any], extra: dict[str, list[Any]] | None = None
    ) -> pa.RecordBatch:
        """Operator updates (objects with key, start, end and a ``value`` dict, None
        for a retraction) as output rows, with the ``extra`` columns given."""
        values = {
            name: [None if u.value is None else u.value[name] for u in updates]
            for name, _, _ in self.plan
        }
        bounds = ([u.key for u in updates], [u.start for u in updates], [u.end for u in updates])
        return self._rows(*bounds, values, extra)

    def from_closed(
        self, closed: ClosedSessions, extra: dict[str, list[Any]] | None = None
    ) -> pa.RecordBatch:
        """Sessions closed as columns (``ClosedSessions``: keys, starts, ends, and
        each aggregate's results, a list or an Arrow array) as output rows, with
        the ``extra`` columns given."""
        return self._rows(closed.keys, closed.starts, closed.ends, closed.values, extra)

    def _rows(
        self,
        keys: list[Any],
        starts: list[int],
        ends: list[int],
        values: dict[str, Any],
        extra: dict[str, list[Any]] | None,
    ) -> pa.RecordBatch:
        """Output rows from Python keys (tuples for several key columns), window
        bounds in ms, and each aggregate's results (a list or an Arrow array)."""
        columns: dict[str, Any] = {}
        if len(self.keys) == 1:
            columns[self.keys[0]] = keys
        else:
            parts = list(zip(*keys, strict=True)) or [()] * len(self.keys)
            for k, part in zip(self.keys, parts, strict=True):
                columns[k] = list(part)
        columns[self.start] = self._times(pa.array(starts, pa.int64()))
        columns[self.end] = self._times(pa.array(ends, pa.int64()))
        for out_name, _, _ in self.plan:
            columns[out_name] = values[out_name]
        columns.update(extra or {})
        return record_batch(arrow_schema(self.schema_json), columns)

    def _times(self, ms: Any) -> Any:
        # a typed factor: a Python int's type is inferred, which imports pandas
        # (sessionstore.arrow_pandas)
        return pc.multiply_checked(ms, _MICROS_PER_MS) if self.time_is_timestamp else ms

    def from_table(self, table: pa.Table, extra: dict[str, Any] | None = None) -> pa.Table:
        """A columnar path's output (key columns, ``start``, ``end``, ``value``
        struct) as output rows, with the ``extra`` columns given."""
        value = table.column("value")
        columns: dict[str, Any] = {k: table.column(k) for k in self.keys}
        columns[self.start] = self._times(table.column("start"))
        columns[self.end] = self._times(table.column("end"))
        for out_name, _, _ in self.plan:
            columns[out_name] = pc.struct_field(value, out_name)
        columns.update(extra or {})
        schema = arrow_schema(self.schema_json)
        return pa.table([_cast(columns[f.name], f.type) for f in schema], schema=schema)


@functools.lru_cache(maxsize=64)
def arrow_schema(spark_schema_json: str) -> pa.Schema:
    """The Arrow schema ``mapInArrow`` expects for a Spark schema (as JSON); built
    once per worker and schema (tasks of every micro-batch ask again)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    # timestamps travel as UTC instants; Spark converts them to its session zone
    return to_arrow_schema(StructType.fromJson(json.loads(spark_schema_json)), timezone="UTC")


def _cast(column: Any, to: pa.DataType) -> Any:
    # dates travel as epoch days in an int64 column, which Arrow casts to date32
    # only from int32
    if pa.types.is_date32(to) and pa.types.is_int64(column.type):
        column = column.cast(pa.int32())
    return column.cast(to)


def _holds_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_holds_map(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _holds_map(t.value_type)
    return False


def _map_pairs(value: Any, t: pa.DataType) -> Any:
    """``value`` of type ``t`` with every map as the ``(key, item)`` tuples Arrow
    takes: a map read back from a store (msgpack) is a list of ``[key, item]``
    lists, which Arrow refuses."""
    if value is None:
        return None
    if pa.types.is_map(t):
        pairs = value.items() if isinstance(value, dict) else value
        return [(_map_pairs(k, t.key_type), _map_pairs(v, t.item_type)) for k, v in pairs]
    if pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        if isinstance(value, dict):
            return {f.name: _map_pairs(value.get(f.name), f.type) for f in fields}
        return {f.name: _map_pairs(v, f.type) for f, v in zip(fields, value, strict=True)}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_map_pairs(v, t.value_type) for v in value]
    return value


def record_batch(schema: pa.Schema, columns: dict[str, Any]) -> pa.RecordBatch:
    """A record batch of ``schema`` from columns: Python lists, or Arrow arrays
    (cast to the field's type)."""
    arrays = []
    for f in schema:
        column = columns[f.name]
        if isinstance(column, pa.Array):
            arrays.append(_cast(column, f.type))
            continue
        if _holds_map(f.type):
            column = [_map_pairs(v, f.type) for v in column]
        arrays.append(pa.array(column, type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
