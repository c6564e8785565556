"""``sessionize``: session windows on a PySpark streaming DataFrame, state in sessionstore.

The input is hash-partitioned by key (``repartition``) and each partition runs
:class:`~sessionstore.operators.SessionWindowAggregator` in ``mapInArrow``, on the
batch path. A task finds its partition and micro-batch id, loads version
``batchId`` of its state through :class:`~sessionstore.StateStoreProvider` (the
state after the batches before it), processes its rows, and commits version
``batchId + 1``. A retried or replayed batch loads the same version again, so its
output is the same: exactly-once with idempotent or replay-tolerant sinks.

Event time is shared across partitions (:mod:`sessionstore.checkpoint.records.event_time`,
through the driver's :mod:`~spark_integration.coordinator.server`): before batch N every
partition advances to the largest event time of batch N-1, so sessions close in
partitions that receive no data. That advance is the only thing that closes
(``closes_on="advance"``): the rows of batch N extend and merge sessions, and are
late or not, judged by that shared time, never by the partition's own, so which
sessions a batch emits does not depend on which keys share a partition (Spark's
watermark, which batch N also takes from batch N-1).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sessionstore.operators import SessionWindowAggregator, SessionWindows
from sessionstore.stores.spec import StoreSpec
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.intervals import interval_ms
from spark_integration.execution.aggregator_task import AggregatorTask, Emitted
from spark_integration.operators.aggregate_skeleton import AggregateInput, aggregate_input
from spark_integration.planning.aggregation_specs import SessionAggregation
from spark_integration.planning.input_columns import grace_ms

__all__ = [
    "sessionize",
    "SessionAggregation",
    "SessionizePlan",
    "SessionizeTask",
    "plan_sessionize",
]


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
    ``"upsert"``, or ``"delete"`` for a session an earlier micro-batch emitted and
    this one merged away. Update mode emits at most one row per session per
    micro-batch (its net change), so a sink may apply a batch's rows in any order.
    Use append output mode with ``emit="final"`` and update mode with
    ``emit="update"``.

    ``grace`` defaults to the input's watermark delay when ``timestamp`` carries
    one (``withWatermark``), else 0: a session is final once the event time passes
    its last event + gap + grace, and later rows for it are dropped.
    """
    planned = plan_sessionize(df, key, timestamp, gap, grace, aggregations, emit)
    return planned.input.state_map(
        df, SessionizeTask, planned.out_schema, backend, num_partitions, name,
        **planned.settings,
    )  # fmt: skip


@dataclass
class SessionizePlan:
    """What ``sessionize`` derives from its arguments, before any state: its
    input, output schema and the settings of its task."""

    input: AggregateInput
    out_schema: Any
    settings: dict[str, Any]


def plan_sessionize(
    df: Any,
    key: str | Sequence[str],
    timestamp: str,
    gap: str | int,
    grace: str | int | None = None,
    aggregations: Mapping[str, Any] | None = None,
    emit: str = "final",
) -> SessionizePlan:
    """Check ``sessionize``'s arguments against ``df`` and plan it (shared by
    :func:`sessionize` and ``bootstrap_sessionize``, so both build the same task)."""
    from pyspark.sql import types as T

    if emit not in ("final", "update"):
        raise ValueError(f"emit must be 'final' or 'update', got {emit!r}")
    gap_ms = interval_ms(gap, "gap")
    grace = grace_ms(df, timestamp, grace)
    plan = aggregate_input(df, key, timestamp, aggregations, "session_start", "session_end")
    out_fields = list(plan.out_fields)
    if emit == "update":
        out_fields.append(T.StructField("change", T.StringType()))
    settings = {"gap_ms": gap_ms, "grace_ms": grace, "emit": emit}
    return SessionizePlan(plan, T.StructType(out_fields), settings)


@dataclass
class SessionizeTask(AggregatorTask):
    """What each task runs: picklable, so it ships to the executors."""

    gap_ms: int
    grace_ms: int

    def store_spec(self) -> StoreSpec:
        windows = SessionWindows(self.gap_ms, self.grace_ms)
        return StoreSpec("sessions", "session", windows.retention_ms)

    def aggregator(self, store: Any) -> SessionWindowAggregator:
        windows = SessionWindows(self.gap_ms, self.grace_ms)
        return SessionWindowAggregator(
            store,
            windows,
            aggregations=self.aggregation,
            emit=self.emit,
            closes_on="advance",  # a batch is judged by the shared event time before it
        )

    def output_batches(self, emitted: Emitted) -> Iterator[pa.RecordBatch]:
        for closed in emitted.closed:  # emit-on-close: its advance's sessions
            if closed.count:
                yield self.output.from_closed(closed)
        if emitted.updates:
            extra = {}
            if self.emit == "update":
                changes = ["delete" if u.value is None else "upsert" for u in emitted.updates]
                extra["change"] = changes
            yield self.output.from_updates(emitted.updates, extra)
        table = emitted.table
        if table is not None and table.num_rows:  # the columnar path: emit-on-close
            yield from self.output.from_table(table).to_batches()
