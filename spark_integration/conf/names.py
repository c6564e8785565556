"""Names sessionstore gives things in a Spark plan, read on both sides of it: the
hidden columns tasks read or write, the observation names and the metrics conf key.
One module so that the driver side that builds a plan and the task that runs it
spell them the same way without importing each other."""

from __future__ import annotations

__all__ = ["SIDE", "TS", "SHARD", "METRICS_COLUMN", "OBSERVATION_PREFIX", "METRICS_CONF"]

#: Columns of a tagged union: which input a row came from, and its event time.
SIDE, TS = "__ss_side", "__ss_ts"
#: The column that carries each row's state partition to its Spark task.
SHARD = "__ss_partition"
#: The hidden column of an operator's metrics rows.
METRICS_COLUMN = "__ss_metrics"
#: Observed metrics of an operator are named this followed by the operator's name.
OBSERVATION_PREFIX = "sessionstore."
#: The Spark conf key that adds the operators' metrics to Spark's observed metrics
#: (``query.lastProgress["observedMetrics"]``) for operators built after it is set.
#: Off by default: the metrics rows and ``observe`` cost the JVM work on every
#: output row (BENCHMARKS.md, "State metrics"); ``log_state_metrics`` needs it
#: only where there is no coordinator.
METRICS_CONF = "spark.sessionstore.metrics.enabled"
