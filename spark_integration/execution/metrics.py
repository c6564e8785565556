"""State metrics in the job: each task's record reaches the driver, one line per
operator and micro-batch.

Every task knows its metrics once it has committed (the record its changelog
header carries, see :mod:`sessionstore.checkpoint.records.metrics`, plus its own commit
time). Reading P changelog headers per micro-batch on the driver would cost P
object-store requests per batch, so the record travels another way:

* **The coordinator (default).** Every task already tells the driver's
  coordinator (:mod:`spark_integration.coordinator.server`) that it has committed, which
  is how event time is shared; the record rides along in that report. The
  ``StateMetricsListener`` that ``log_state_metrics`` registers
  (:mod:`spark_integration.coordinator.metrics_listener`) reads the records of each finished micro-batch from the coordinator and prints one line
  per operator. No object-store request, no extra row, no Spark job: the cost per
  task is one small message (none extra for event-time operators, which report
  anyway; BENCHMARKS.md, "State metrics").
* **Observed metrics (opt-in, :data:`~spark_integration.conf.names.METRICS_CONF`).** For
  ``query.lastProgress["observedMetrics"]`` too, the task yields one more row
  whose hidden column ``__ss_metrics`` holds the record; the operator's DataFrame
  aggregates it with ``df.observe("sessionstore.<name>", ...)`` and filters those
  rows out. That costs the JVM work on every output row (5-15% of the 1M-event
  benchmark), so it is off unless asked for, and it is how metrics reach the
  driver where the coordinator cannot (Spark Connect).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sessionstore.checkpoint.records.metrics import LOAD_KINDS
from spark_integration.conf.names import METRICS_COLUMN, METRICS_CONF, OBSERVATION_PREFIX
from spark_integration.execution.context import ContextTask, SparkTask, TaskContext

__all__ = ["with_state_metrics", "metrics_enabled"]


#: The task record's fields as they travel (Spark DDL types).
_FIELDS = [
    ("batch", "bigint"), ("partition", "int"), ("rows_total", "bigint"),
    ("rows_updated", "bigint"), ("rows_removed", "bigint"), ("late_dropped", "bigint"),
    ("emitted", "bigint"), ("load_kind", "string"), ("load_ms", "double"),
    ("commit_ms", "double"), ("prepare_ms", "double"), ("upload_ms", "double"),
    ("apply_ms", "double"), ("uploaded_bytes", "bigint"), ("snapshot_lag", "bigint"),
    ("memory_bytes", "bigint"), ("repaired", "bigint"),
]  # fmt: skip
_ARROW = {"bigint": pa.int64(), "int": pa.int32(), "string": pa.string(), "double": pa.float64()}
_STRUCT = pa.struct([(name, _ARROW[kind]) for name, kind in _FIELDS])


def _spark_struct() -> Any:
    from pyspark.sql import types as T

    types = {
        "bigint": T.LongType(), "int": T.IntegerType(), "string": T.StringType(),
        "double": T.DoubleType(),
    }  # fmt: skip
    return T.StructType([T.StructField(n, types[k], True) for n, k in _FIELDS])


@dataclass
class _WithMetrics:
    """An operator task (:class:`~spark_integration.execution.context.ContextTask`)
    that passes the output of ``task`` through with the metrics column null, then
    yields the metrics record ``task`` left in its context as one more row
    (picklable, as the task it wraps)."""

    task: ContextTask
    schema_json: str  # the wrapped task's output schema, all fields nullable

    def run(self, batches: Iterator[pa.RecordBatch], context: TaskContext) -> Iterator[Any]:
        """``task``'s output, then its metrics row."""
        from spark_integration.execution.output import arrow_schema

        schema = arrow_schema(self.schema_json)
        for out in self.task.run(batches, context):
            for batch in out.to_batches() if isinstance(out, pa.Table) else [out]:
                yield pa.RecordBatch.from_arrays(
                    [*batch.columns, pa.nulls(batch.num_rows, _STRUCT)],
                    schema=schema,
                )
        record = context.metrics
        if record is not None:  # None: the task committed nothing
            row = pa.array([{n: record.get(n) for n, _ in _FIELDS}], type=_STRUCT)
            nulls = [pa.nulls(1, f.type) for f in schema][:-1]
            yield pa.RecordBatch.from_arrays([*nulls, row], schema=schema)


def metrics_enabled(spark: Any) -> bool:
    """Whether operators built now observe their tasks' metrics (:data:`~spark_integration.conf.names.METRICS_CONF`)."""
    value = spark.conf.get(METRICS_CONF, "false")
    return str(value).strip().lower() in ("true", "1", "yes")


def with_state_metrics(
    df: Any,
    task: ContextTask,
    out_schema: Any,
    name: str,
    outer: Callable[[ContextTask], Any] = SparkTask,
    observe: bool | None = None,
) -> Any:
    """``df.mapInArrow(outer(task), out_schema)``; with :data:`~spark_integration.conf.names.METRICS_CONF` on, the
    tasks' metrics are also observed as ``sessionstore.<name>`` (see the module
    doc), and the output has ``out_schema``'s columns, all nullable (the metrics
    rows travel in the same batches). ``task`` runs one state partition; ``outer``
    makes the ``mapInArrow`` function of a Spark task from it: by default
    :class:`~spark_integration.execution.context.SparkTask` (a Spark task per state
    partition), else one around several (:mod:`spark_integration.planning.placement`).
    ``observe``: whether the conf turns the metrics on, from the operator's conf
    snapshot; None reads it here."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if observe is None:
        observe = metrics_enabled(df.sparkSession)
    if not observe:
        return df.mapInArrow(outer(task), out_schema)

    fields = [T.StructField(f.name, f.dataType, True) for f in out_schema.fields]
    schema = T.StructType([*fields, T.StructField(METRICS_COLUMN, _spark_struct(), True)])
    m = F.col(METRICS_COLUMN)
    aggregates = [
        F.count(m).alias("partitions"),
        F.max(m["batch"]).alias("batch"),
        F.sum(m["rows_total"]).alias("rows_total"),
        F.sum(m["rows_updated"]).alias("rows_updated"),
        F.sum(m["rows_removed"]).alias("rows_removed"),
        F.sum(m["late_dropped"]).alias("late_dropped"),
        F.sum(m["emitted"]).alias("emitted"),
        F.max(m["load_ms"]).alias("load_ms_max"),
        *[F.count_if(m["load_kind"] == kind).alias(f"loads_{kind}") for kind in LOAD_KINDS],
        F.percentile_approx(m["commit_ms"], 0.5).alias("commit_ms_p50"),
        F.max(m["commit_ms"]).alias("commit_ms_max"),
        F.sum(m["uploaded_bytes"]).alias("uploaded_bytes"),
        F.max(m["snapshot_lag"]).alias("snapshot_lag_max"),
        F.max(m["memory_bytes"]).alias("memory_bytes_max"),
        F.sum(m["repaired"]).alias("repaired"),
    ]
    wrapped = _WithMetrics(task, schema.json())
    return (
        df.mapInArrow(outer(wrapped), schema)
        .observe(f"{OBSERVATION_PREFIX}{name}", *aggregates)
        .where(m.isNull())
        .drop(METRICS_COLUMN)
    )
