"""``window_aggregate``: tumbling and hopping event-time windows on sessionstore state.

Like :func:`~spark_integration.operators.sessionize.sessionize`: hash-partitioned by key,
:class:`~sessionstore.operators.WindowAggregator` in ``mapInArrow``, version
``batchId`` loaded and ``batchId + 1`` committed per task, and event time shared
across partitions so windows fire in partitions without new data.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sessionstore.operators import TimeWindows, WindowAggregator
from sessionstore.stores.base import Store
from sessionstore.stores.spec import StoreSpec
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.intervals import interval_ms
from spark_integration.execution.aggregator_task import AggregatorTask, Emitted
from spark_integration.operators.aggregate_skeleton import aggregate_input
from spark_integration.planning.input_columns import grace_ms

__all__ = ["window_aggregate"]


def window_aggregate(
    df: Any,
    key: str | Sequence[str],
    timestamp: str,
    size: str | int,
    advance: str | int | None = None,
    grace: str | int | None = None,
    aggregations: Mapping[str, Any] | None = None,
    emit: str = "final",
    early_every: str | int | None = None,
    backend: StateBackend | None = None,
    name: str = "window_aggregate",
    num_partitions: int | None = None,
) -> Any:
    """Windowed aggregates per key: ``[window_start, window_end)``.

    ``emit``: ``"final"`` (once, when ``end + grace`` passes; append mode),
    ``"update"`` (each window a micro-batch changed, once, with its value after
    the batch; update mode) or ``"on_time"`` (at the window end,
    then once per late row within grace). ``early_every`` adds periodic early
    results of open windows. Output: key columns, ``window_start``, ``window_end``,
    the aggregates and ``emission`` (update, early, on_time, late or final).
    ``grace`` defaults to the watermark delay declared on ``timestamp``, else 0.
    """
    from pyspark.sql import types as T

    windows = TimeWindows(
        interval_ms(size, "size"),
        None if advance is None else interval_ms(advance, "advance"),
        grace_ms(df, timestamp, grace),
    )
    plan = aggregate_input(df, key, timestamp, aggregations, "window_start", "window_end")
    out_schema = T.StructType([*plan.out_fields, T.StructField("emission", T.StringType())])
    early_every_ms = None if early_every is None else interval_ms(early_every, "early_every")
    # validate the emission settings on the driver, with a clear error
    WindowAggregator.check_settings(emit, early_every_ms)
    settings = {"windows": windows, "emit": emit, "early_every_ms": early_every_ms}
    return plan.state_map(df, _WindowTask, out_schema, backend, num_partitions, name, **settings)


@dataclass
class _WindowTask(AggregatorTask):
    windows: TimeWindows
    early_every_ms: int | None

    def store_spec(self) -> StoreSpec:
        w = self.windows
        return StoreSpec("windows", "window", w.retention_ms, window_size_ms=w.size_ms)

    def aggregator(self, store: Store) -> WindowAggregator:
        return WindowAggregator(
            store,
            self.windows,
            aggregations=self.aggregation,
            emit=self.emit,
            early_every_ms=self.early_every_ms,
            closes_on="advance",  # a batch is judged by the shared event time before it
        )

    def output_batches(self, emitted: Emitted) -> Iterator[pa.RecordBatch]:
        updates, table = emitted.updates, emitted.table
        if updates:
            yield self.output.from_updates(updates, {"emission": [u.kind for u in updates]})
        if table is not None and table.num_rows:  # the columnar path: emit="final"
            out = self.output.from_table(table, {"emission": table.column("kind")})
            yield from out.to_batches()
