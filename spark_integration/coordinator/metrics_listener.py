"""The driver's end of state metrics: one line per sessionstore operator and
finished micro-batch, from the records tasks reported to the coordinator, else from
the query's observed metrics (how the records get there:
:mod:`spark_integration.execution.metrics`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from sessionstore.checkpoint.records.metrics import LOAD_KINDS, summarize_batch
from spark_integration.conf.names import METRICS_CONF, OBSERVATION_PREFIX
from spark_integration.conf.spark_session import can_coordinate

__all__ = ["StateMetricsListener", "log_state_metrics", "format_line", "batch_lines"]


def format_line(name: str, metrics: dict[str, Any]) -> str:
    """One line for an operator's metrics of a micro-batch: a ``sessionstore stats``
    row (:func:`~sessionstore.checkpoint.records.metrics.summarize_batch`) or an observed
    metrics row (its ``loads_<kind>`` counts)."""
    loads = metrics.get("loads")
    if loads is None:
        loads = {k: metrics.get(f"loads_{k}") for k in LOAD_KINDS}
    loads_text = " ".join(f"{k}:{loads[k]}" for k in LOAD_KINDS if loads.get(k))

    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:.1f}ms"

    return (
        f"sessionstore {name} batch {metrics.get('batch')}: {metrics.get('partitions')} "
        f"partitions, {metrics.get('rows_total') or 0:,} rows (+{metrics.get('rows_updated') or 0:,}"
        f" -{metrics.get('rows_removed') or 0:,}), emitted {metrics.get('emitted') or 0:,}, "
        f"late {metrics.get('late_dropped') or 0:,}, load max {ms(metrics.get('load_ms_max'))} "
        f"({loads_text or '-'}), commit p50 {ms(metrics.get('commit_ms_p50'))} max "
        f"{ms(metrics.get('commit_ms_max'))}, uploaded {metrics.get('uploaded_bytes') or 0:,} B, "
        f"snapshot lag {metrics.get('snapshot_lag_max')}, native memory "
        f"{(metrics.get('memory_bytes_max') or 0) / 2**20:.1f} MiB"
        + (f", REPAIRED {metrics['repaired']}" if metrics.get("repaired") else "")
    )


def batch_lines(run: Any, batch: int, observed: dict[str, Any] | None = None) -> list[str]:
    """The lines of micro-batch ``batch`` of query run ``run``: one per operator,
    from the records its tasks reported to this driver's coordinator, else from
    ``observed`` (the progress's observed metrics, when :data:`~spark_integration.conf.names.METRICS_CONF` is on)."""
    from spark_integration.coordinator.server import driver_coordinator

    lines: dict[str, str] = {}
    coordinator = driver_coordinator()
    if coordinator is not None:
        for name, records in coordinator.batch_metrics(run, batch).items():
            lines[name] = format_line(name, summarize_batch(name, batch, records))
    for key, row in (observed or {}).items():
        name = key[len(OBSERVATION_PREFIX) :]
        if key.startswith(OBSERVATION_PREFIX) and name not in lines:
            lines[name] = format_line(name, row.asDict() if hasattr(row, "asDict") else row)
    return [lines[name] for name in sorted(lines)]


def _listener_base() -> type:
    from pyspark.sql.streaming import StreamingQueryListener

    return StreamingQueryListener


class StateMetricsListener(_listener_base()):  # type: ignore[misc]
    """Prints one line per sessionstore operator and finished micro-batch (from the
    query's observed metrics) to ``out`` (default: stderr)."""

    def __init__(self, out: Callable[[str], None] | None = None) -> None:
        self._out = out or (lambda line: print(line, file=sys.stderr, flush=True))

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 (Spark's names)
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = event.progress
        run = None if progress.runId is None else str(progress.runId)
        for line in batch_lines(run, progress.batchId, progress.observedMetrics):
            self._out(line)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass


def log_state_metrics(spark: Any, out: Callable[[str], None] | None = None) -> Any:
    """Register a :class:`StateMetricsListener` on ``spark`` and return it (remove it
    with ``spark.streams.removeListener``): one line per sessionstore operator and
    micro-batch, from the records the tasks reported to the driver's coordinator.
    Call it before or after building the operators. Where there is no coordinator
    (it is turned off, or Spark Connect), it turns on :data:`~spark_integration.conf.names.METRICS_CONF` for the
    operators built after this call and prints their observed metrics instead."""
    from spark_integration.coordinator.server import ENABLED_CONF

    off = str(spark.conf.get(ENABLED_CONF, "true")).strip().lower() in ("false", "0", "no")
    if off or not can_coordinate(spark):
        spark.conf.set(METRICS_CONF, "true")
    listener = StateMetricsListener(out)
    spark.streams.addListener(listener)
    return listener
