"""``window_aggregate``: tumbling and hopping event-time windows on sessionstore state.

Like :func:`~spark_integration.sessionize.sessionize`: hash-partitioned by key,
:class:`~sessionstore.operators.WindowAggregator` in ``mapInArrow``, version
``batchId`` loaded and ``batchId + 1`` committed per task, and event time shared
across partitions so windows fire in partitions without new data.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sessionstore.checkpoint import StoreSpec
from sessionstore.checkpoint.event_time import EventTimeExchange
from sessionstore.intervals import interval_ms
from sessionstore.operators import Aggregation, TimeWindows, WindowAggregator
from sessionstore.operators.arrow_io import columns_of
from spark_integration.backend import StateBackend
from spark_integration.sessionize import _parse_aggregations, _time_column, _value_type
from spark_integration.task import (
    arrow_schema,
    deterministic_order,
    partition_state,
    record_batch,
    resolve,
    task_info,
)

__all__ = ["window_aggregate"]

_TS = "__sessionstore_ts"


def window_aggregate(
    df: Any,
    key: str | Sequence[str],
    timestamp: str,
    size: str | int,
    advance: str | int | None = None,
    grace: str | int = "0 seconds",
    aggregations: Mapping[str, Any] | None = None,
    emit: str = "final",
    early_every: str | int | None = None,
    backend: StateBackend | None = None,
    name: str = "window_aggregate",
    num_partitions: int | None = None,
) -> Any:
    """Windowed aggregates per key: ``[window_start, window_end)``.

    ``emit``: ``"final"`` (once, when ``end + grace`` passes; append mode),
    ``"update"`` (every change; update mode) or ``"on_time"`` (at the window end,
    then once per late row within grace). ``early_every`` adds periodic early
    results of open windows. Output: key columns, ``window_start``, ``window_end``,
    the aggregates and ``emission`` (update, early, on_time, late or final).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    keys = [key] if isinstance(key, str) else list(key)
    fields = {f.name: f for f in df.schema.fields}
    for column in [*keys, timestamp]:
        if column not in fields:
            raise ValueError(f"column {column!r} is not in the input (it has {sorted(fields)})")
    windows = TimeWindows(
        interval_ms(size, "size"),
        None if advance is None else interval_ms(advance, "advance"),
        interval_ms(grace, "grace"),
    )
    ts_col, time_type = _time_column(fields, timestamp)
    others = [c for c in fields if c not in keys and c != timestamp]
    aggregation, value_cols, plan = _parse_aggregations(aggregations or {"count": "count"}, others)
    out_fields = [fields[k] for k in keys]
    out_fields += [T.StructField("window_start", time_type), T.StructField("window_end", time_type)]
    out_fields += [
        T.StructField(out_name, _value_type(fn, column, fields, aggregations))
        for out_name, fn, column in plan
    ]
    out_fields.append(T.StructField("emission", T.StringType()))
    out_schema = T.StructType(out_fields)
    backend, n = resolve(df, backend, num_partitions)
    selected = df.select(
        *[F.col(k) for k in keys], ts_col.alias(_TS), *[F.col(c) for c in value_cols]
    )
    task = _WindowTask(
        backend=backend,
        name=name,
        num_partitions=n,
        keys=keys,
        value_cols=value_cols,
        windows=windows,
        emit=emit,
        early_every_ms=None if early_every is None else interval_ms(early_every, "early_every"),
        aggregation=aggregation,
        plan=plan,
        time_is_timestamp=isinstance(time_type, T.TimestampType),
        out_schema_json=out_schema.json(),
    )
    # validate the emission settings on the driver, with a clear error
    WindowAggregator.check_settings(emit, task.early_every_ms)
    return selected.repartition(n, *keys).mapInArrow(task, out_schema)


@dataclass
class _WindowTask:
    backend: StateBackend
    name: str
    num_partitions: int
    keys: list[str]
    value_cols: list[str]
    windows: TimeWindows
    emit: str
    early_every_ms: int | None
    aggregation: Aggregation
    plan: list
    time_is_timestamp: bool
    out_schema_json: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        info = task_info()
        inputs = [b for b in batches if b.num_rows]
        w = self.windows
        spec = StoreSpec("windows", "window", w.size_ms + w.grace_ms, window_size_ms=w.size_ms)
        updates = []
        with partition_state(self.backend, self.name, info, [spec], self.num_partitions) as (
            handle,
            provider,
        ):
            agg = WindowAggregator(
                handle["windows"],
                w,
                aggregations=self.aggregation,
                emit=self.emit,
                early_every_ms=self.early_every_ms,
            )
            exchange = EventTimeExchange(provider.operator_storage, info.partition)
            shared = exchange.after(info.batch_id - 1)
            if shared is not None:
                updates += agg.advance_to(shared)
            if inputs:
                table = deterministic_order(pa.Table.from_batches(inputs), [_TS])
                key = self.keys[0] if len(self.keys) == 1 else self.keys
                keys, times, values = columns_of(table, key, _TS, self.value_cols or None)
                updates += agg.process_rows(keys, times, values)
            exchange.publish(info.batch_id, agg.stream_time)
        if updates:
            columns: dict[str, list] = {}
            single = len(self.keys) == 1
            for i, k in enumerate(self.keys):
                columns[k] = [u.key if single else u.key[i] for u in updates]
            scale = 1000 if self.time_is_timestamp else 1
            columns["window_start"] = [u.start * scale for u in updates]
            columns["window_end"] = [u.end * scale for u in updates]
            for out_name, _, _ in self.plan:
                columns[out_name] = [u.value[out_name] for u in updates]
            columns["emission"] = [u.kind for u in updates]
            yield record_batch(arrow_schema(self.out_schema_json), columns)
