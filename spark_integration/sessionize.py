"""``sessionize``: session windows on a PySpark streaming DataFrame, state in sessionstore.

The input is hash-partitioned by key (``repartition``) and each partition runs
:class:`~sessionstore.operators.SessionWindowAggregator` in ``mapInArrow``, on the
batch path. A task finds its partition and micro-batch id, loads version
``batchId`` of its state through :class:`~sessionstore.StateStoreProvider` (the
state after the batches before it), processes its rows, and commits version
``batchId + 1``. A retried or replayed batch loads the same version again, so its
output is the same: exactly-once with idempotent or replay-tolerant sinks.

Event time is shared across partitions through the checkpoint
(:mod:`sessionstore.checkpoint.event_time`): before batch N every partition
advances to the largest event time of batch N-1, so sessions close in partitions
that receive no data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sessionstore.checkpoint import StoreSpec
from sessionstore.intervals import interval_ms
from sessionstore.operators import (
    Aggregation,
    Aggregations,
    SessionWindowAggregator,
    SessionWindows,
)
from spark_integration.backend import StateBackend
from spark_integration.task import (
    TS,
    arrow_schema,
    grace_ms,
    keyed_columns,
    partition_state,
    record_batch,
    resolve,
    run_aggregator,
    task_info,
)

__all__ = ["sessionize", "SessionAggregation"]

_BUILTIN = {"count", "sum", "min", "max", "first", "last", "collect"}


@dataclass(frozen=True)
class SessionAggregation:
    """A custom aggregation producing one output column of Spark type ``output_type``
    (a DDL string such as ``"bigint"`` or a DataType). ``value`` is a dict of the
    input's non-key, non-timestamp columns."""

    initializer: Callable[[], Any]
    aggregator: Callable[[Any, Any, Any], Any]
    merger: Callable[[Any, Any, Any], Any]
    output_type: Any
    finish: Callable[[Any], Any] | None = None


def _parse_aggregations(aggregations: Mapping[str, Any], columns: Sequence[str]):
    """``(Aggregation, value columns, [(output name, function, input column)])``."""
    if not isinstance(aggregations, Mapping) or not aggregations:
        raise ValueError(f"aggregations must be a non-empty dict, got {aggregations!r}")
    custom = {k: v for k, v in aggregations.items() if isinstance(v, SessionAggregation)}
    if custom:
        if len(aggregations) != 1:
            raise ValueError(
                "a SessionAggregation must be the only aggregation (it produces one column); "
                f"got {sorted(aggregations)}"
            )
        ((out_name, agg),) = custom.items()
        finish = agg.finish or (lambda acc: acc)
        aggregation = Aggregation(
            agg.initializer, agg.aggregator, agg.merger, lambda acc: {out_name: finish(acc)}
        )
        return aggregation, list(columns), [(out_name, "custom", None)]
    plan, spec, needed = [], {}, []
    for out_name, how in aggregations.items():
        if how == "count":
            fn, column = "count", None
        elif isinstance(how, (tuple, list)) and len(how) == 2 and how[0] in _BUILTIN - {"count"}:
            fn, column = how
            if column not in columns:
                raise ValueError(
                    f"aggregation {out_name!r} reads column {column!r}, which the input does not "
                    f"have (it has {sorted(columns)})"
                )
            if column not in needed:
                needed.append(column)
        else:
            raise ValueError(
                f"aggregation {out_name!r}: expected 'count', (function, column) with function in "
                f"{sorted(_BUILTIN - {'count'})}, or a SessionAggregation; got {how!r}"
            )
        spec[out_name] = "count" if fn == "count" else (fn, column)
        plan.append((out_name, fn, column))
    return Aggregations(spec), needed, plan


def _time_column(fields: dict[str, Any], timestamp: str) -> tuple[Any, Any]:
    """``(epoch-millisecond column, output time type)`` for a timestamp or long column."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    ts_type = fields[timestamp].dataType
    if isinstance(ts_type, (T.TimestampType, T.TimestampNTZType)):
        return F.unix_millis(F.col(timestamp).cast("timestamp")), T.TimestampType()
    if isinstance(ts_type, (T.LongType, T.IntegerType)):
        return F.col(timestamp).cast("long"), T.LongType()
    raise ValueError(
        f"timestamp column {timestamp!r} must be a timestamp or epoch milliseconds (long), "
        f"not {ts_type.simpleString()}"
    )


def _value_type(fn: str, column: str | None, fields: dict[str, Any], aggregations: Any) -> Any:
    """The Spark type of an aggregate's output column."""
    from pyspark.sql import types as T

    if fn == "count":
        return T.LongType()
    if fn == "custom":
        dtype = next(iter(aggregations.values())).output_type
        return T._parse_datatype_string(dtype) if isinstance(dtype, str) else dtype
    source = fields[column].dataType
    if fn == "sum":
        return T.LongType() if isinstance(source, T.IntegralType) else T.DoubleType()
    if fn == "collect":
        return T.ArrayType(source)
    return source


def sessionize(
    df: Any,
    key: str | Sequence[str],
    timestamp: str,
    gap: str | int,
    grace: str | int | None = None,
    aggregations: Mapping[str, Any] | None = None,
    emit: str = "final",
    backend: StateBackend | None = None,
    name: str = "sessionize",
    num_partitions: int | None = None,
) -> Any:
    """Session windows of a streaming (or batch) DataFrame.

    Output columns: the key columns, ``session_start`` and ``session_end`` (the
    first and last event; timestamps if ``timestamp`` is a timestamp column, epoch
    milliseconds if it is a long), the aggregates, and in update mode ``change``:
    ``"upsert"``, or ``"delete"`` for a session merged away. Use append output mode
    with ``emit="final"`` and update mode with ``emit="update"``.

    ``grace`` defaults to the input's watermark delay when ``timestamp`` carries
    one (``withWatermark``), else 0: a session is final once the event time passes
    its last event + gap + grace, and later rows for it are dropped.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if emit not in ("final", "update"):
        raise ValueError(f"emit must be 'final' or 'update', got {emit!r}")
    keys = [key] if isinstance(key, str) else list(key)
    if not keys:
        raise ValueError("key must name at least one column")
    fields = {f.name: f for f in df.schema.fields}
    for column in [*keys, timestamp]:
        if column not in fields:
            raise ValueError(f"column {column!r} is not in the input (it has {sorted(fields)})")
    gap_ms = interval_ms(gap, "gap")
    grace = grace_ms(df, timestamp, grace)
    ts_col, time_type = _time_column(fields, timestamp)
    others = [c for c in fields if c not in keys and c != timestamp]
    aggregation, value_cols, plan = _parse_aggregations(aggregations or {"count": "count"}, others)
    out_fields = [fields[k] for k in keys]
    out_fields += [
        T.StructField("session_start", time_type),
        T.StructField("session_end", time_type),
    ]
    out_fields += [
        T.StructField(out_name, _value_type(fn, column, fields, aggregations))
        for out_name, fn, column in plan
    ]
    if emit == "update":
        out_fields.append(T.StructField("change", T.StringType()))
    out_schema = T.StructType(out_fields)

    backend, n = resolve(df, backend, num_partitions)
    selected = df.select(
        *[F.col(k) for k in keys], ts_col.alias(TS), *[F.col(c) for c in value_cols]
    )
    task = _SessionizeTask(
        backend=backend,
        name=name,
        num_partitions=n,
        keys=keys,
        value_cols=value_cols,
        gap_ms=gap_ms,
        grace_ms=grace,
        emit=emit,
        aggregation=aggregation,
        plan=plan,
        time_is_timestamp=isinstance(time_type, T.TimestampType),
        out_schema_json=out_schema.json(),
    )
    return selected.repartition(n, *keys).mapInArrow(task, out_schema)


@dataclass
class _SessionizeTask:
    """What each task runs: picklable, so it ships to the executors."""

    backend: StateBackend
    name: str
    num_partitions: int
    keys: list[str]
    value_cols: list[str]
    gap_ms: int
    grace_ms: int
    emit: str
    aggregation: Aggregation
    plan: list
    time_is_timestamp: bool
    out_schema_json: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        info = task_info()
        inputs = [b for b in batches if b.num_rows]
        spec = StoreSpec("sessions", "session", self.gap_ms + self.grace_ms + 1)
        with partition_state(self.backend, self.name, info, [spec], self.num_partitions) as (
            handle,
            provider,
        ):
            agg = SessionWindowAggregator(
                handle["sessions"],
                SessionWindows(self.gap_ms, self.grace_ms),
                aggregations=self.aggregation,
                emit=self.emit,
            )
            updates = run_aggregator(agg, provider, info, inputs, self.keys, self.value_cols)
        if updates:
            yield self._to_arrow(updates)

    def _to_arrow(self, updates: list) -> pa.RecordBatch:
        columns = keyed_columns(
            updates, self.keys, self.time_is_timestamp, "session_start", "session_end"
        )
        for out_name, _, _ in self.plan:
            columns[out_name] = [None if u.value is None else u.value[out_name] for u in updates]
        if self.emit == "update":
            columns["change"] = ["delete" if u.value is None else "upsert" for u in updates]
        return record_batch(arrow_schema(self.out_schema_json), columns)
