"""Bootstrapping an operator's state from a batch DataFrame, before its first
micro-batch: ``bootstrap_sessionize`` (the sessions a history leaves open) and
``bootstrap_temporal_join`` (a versioned table's history).

One Spark job, one task per state partition: the history is hash-partitioned by
the operator's keys as the operator routes its input (``repartition(P, keys)``,
Spark's own hash), and each task runs **the operator's own task** over its rows,
as batch 0 of a scratch checkpoint in a temporary directory of the executor (so
the history is processed exactly as the query's first micro-batch would process
it). The state that batch committed becomes the partition's version 0, staged as
a snapshot of the real checkpoint
(:mod:`sessionstore.checkpoint.offline.bootstrap`); the driver then commits the
change for every partition at once, with the history's event time, which the
query's batch 0 starts from. Through DataFrames only (``mapInArrow``), so a Spark
Connect session runs it as a classic one does.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sessionstore.checkpoint.offline.bootstrap import (
    BOOTSTRAP_KIND,
    check_metadata,
    commit_bootstrap,
    finish_pending,
    open_bootstrap,
    version_zero,
)
from sessionstore.checkpoint.offline.change import (
    DEFAULT_QUIET_S,
    ChangeError,
    ChangeTarget,
    abandon_change,
    begin_change,
    partition_answers,
    stage_database,
)
from sessionstore.checkpoint.records.event_time import max_event_time, partition_event_time
from sessionstore.checkpoint.records.layout import LocalPartition, read_metadata
from sessionstore.checkpoint.service.store_service import StoreService
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from spark_integration.conf.backend import StateBackend
from spark_integration.execution.context import TaskContext, TaskInfo, check_partition
from spark_integration.operators.join_skeleton import join_task
from spark_integration.operators.sessionize import SessionizeTask, plan_sessionize
from spark_integration.operators.temporal_join import TemporalJoinTask, plan_temporal_join
from spark_integration.planning.resolve import resolve

__all__ = ["bootstrap_sessionize", "bootstrap_temporal_join", "run_bootstrap"]

_FIELDS = ("partition", "commit", "event_time", "events", "metadata", "error")


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("partition", pa.int64()), ("commit", pa.string()), ("event_time", pa.int64()),
        ("events", pa.int64()), ("metadata", pa.string()), ("error", pa.string()),
    ])  # fmt: skip


_SCHEMA = (
    "partition long, commit string, event_time long, events long, metadata string, error string"
)


def _counted(batches: Iterator[Any], seen: list[int]) -> Iterator[Any]:
    for batch in batches:
        seen[0] += batch.num_rows
        yield batch


def _scratch_backend(backend: StateBackend, scratch: str) -> StateBackend:
    """``backend`` pointed at a checkpoint and a local directory in ``scratch``
    (no snapshot of its one version, no observer: nothing leaves the task)."""
    return replace(
        backend,
        checkpoint_uri=os.path.join(scratch, "checkpoint"),
        local_dir=os.path.join(scratch, "local"),
        storage_options={},
        commit_observer=None,
        snapshot_interval=2,
    )


def build_partition(
    task: Any, target: ChangeTarget, change_id: str, partition: int, batches: Iterator[Any]
) -> dict[str, Any]:
    """Run operator ``task`` over one state partition's history as batch 0 of a
    scratch checkpoint, then stage the state it committed as version 0 of
    ``target``'s partition ``partition``; what the driver needs of it."""
    check_partition(task.name, partition, target.partitions)
    with tempfile.TemporaryDirectory(prefix="sessionstore-bootstrap-") as scratch:
        backend = _scratch_backend(task.backend, scratch)
        inner = replace(task, backend=backend, coordinator=None)
        if hasattr(inner, "bounded"):
            inner = replace(inner, bounded=False)  # the history is followed by the stream
        seen = [0]
        context = TaskContext(TaskInfo(partition, 0, 0, None))
        for _ in inner.run(_counted(batches, seen), context):
            pass  # what the history's batch emits goes nowhere (docs/rewrite.md)
        StoreService.instance().close_under(backend.resolved_local_dir)
        operator = open_filesystem(backend.checkpoint_uri).child(task.name)
        event_time = partition_event_time(operator, 0, partition)
        metadata = read_metadata(operator)
        db_path = LocalPartition(backend.resolved_local_dir, task.name, partition).db
        snapshot, commit = version_zero(db_path, os.path.join(scratch, "out"))
        stage_database(target, partition, snapshot, commit, change_id)
    return {
        "partition": partition, "commit": commit, "event_time": event_time,
        "events": seen[0], "metadata": json.dumps(metadata, sort_keys=True), "error": None,
    }  # fmt: skip


@dataclass
class _BootstrapTasks:
    """The ``mapInArrow`` function of the job: one state partition per Spark task."""

    task: Any
    target: ChangeTarget
    change_id: str

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext as SparkTaskContext

        partition = SparkTaskContext.get().partitionId()
        try:
            row = build_partition(self.task, self.target, self.change_id, partition, batches)
        except ChangeError as exc:  # the driver raises it, by its own words
            row = dict.fromkeys(_FIELDS) | {"partition": partition, "error": str(exc)}
        yield pa.RecordBatch.from_pylist([row], schema=_arrow_schema())


def _job(selected: Any, keys: list[str], tasks: _BootstrapTasks) -> list[dict[str, Any]]:
    """Run the job; its rows in partition order, the first error raised."""
    n = tasks.target.partitions
    routed = selected.repartition(n, *keys)  # as the operator routes: Spark's hash
    rows = routed.mapInArrow(tasks, _SCHEMA).collect()
    return partition_answers((r.asDict() for r in rows), n)


def run_bootstrap(
    selected: Any,
    keys: list[str],
    task: Any,
    quiet_s: float = DEFAULT_QUIET_S,
) -> dict[str, Any]:
    """Bootstrap the operator of ``task`` (its backend, name and partition count)
    from ``selected``, the history as the operator's task reads its input; returns
    what was done (see :func:`bootstrap_sessionize`)."""
    backend, name, n = task.backend, task.name, task.num_partitions
    uri, options = backend.checkpoint_uri, backend.storage_options
    pending = finish_pending(uri, name, options)
    audit = (pending or {}).get("audit") or {}
    if pending is not None and audit.get("kind") == BOOTSTRAP_KIND:
        # killed after its commit point: finished now, the history is not read again
        return _result(name, pending["version"], audit, resumed=pending["id"])
    target = open_bootstrap(uri, name, n, options, quiet_s)
    change_id = begin_change(target)
    try:
        rows = _job(selected, keys, _BootstrapTasks(task, target, change_id))
        metadata = check_metadata(target, json.loads(rows[0]["metadata"]))
    except BaseException:
        abandon_change(target, change_id)
        raise
    event_time = max_event_time(r["event_time"] for r in rows)
    audit = {
        "operator": name, "partitions": n, "events": sum(r["events"] for r in rows),
        "event_time": event_time,
    }  # fmt: skip
    commits = [r["commit"] for r in rows]
    record = commit_bootstrap(target, change_id, commits, metadata, event_time, audit)
    return _result(name, record["version"], record["audit"], resumed=None)


def _result(name: str, version: int, audit: dict[str, Any], resumed: str | None) -> dict[str, Any]:
    return {
        "operator": name, "version": version, "partitions": audit.get("partitions"),
        "events": audit.get("events"), "event_time": audit.get("event_time"),
        "resumed": resumed,
    }  # fmt: skip


def bootstrap_sessionize(
    history: Any,
    key: str | Sequence[str],
    timestamp: str,
    gap: str | int,
    grace: str | int | None = None,
    aggregations: Mapping[str, Any] | None = None,
    emit: str = "final",
    backend: StateBackend | None = None,
    name: str = "sessionize",
    num_partitions: int | None = None,
    quiet_s: float = DEFAULT_QUIET_S,
) -> dict[str, Any]:
    """Build the state of ``sessionize(stream, ...)`` with the same arguments from
    ``history``, a batch DataFrame of the stream's columns, before the query's first
    micro-batch: the state the query would hold had it processed the history as the
    micro-batch before its first (docs/rewrite.md, "Bootstrapping"). The query then
    started on the checkpoint (a new Spark ``checkpointLocation``) continues from
    it: its first batch starts from the history's event time, emits the sessions
    it closes, and extends those it does not.

    One Spark job (a classic or a Spark Connect session), one task per state
    partition. Refused (``ChangeError``, nothing changed): a checkpoint whose
    operator already holds committed state, or that a running query holds
    (``CheckpointBusyError``); ``_metadata`` recording another shape. Bad input
    (a missing column, a time column of the wrong type) is refused as
    ``sessionize`` refuses it. Returns ``{"operator", "version": 0, "partitions",
    "events", "event_time", "resumed"}``; ``resumed`` is the id of a bootstrap
    killed after its commit point that this call finished instead (the history is
    then not read again)."""
    if history.isStreaming:
        raise ValueError(
            "bootstrap_sessionize needs a batch DataFrame of the history; got a streaming one"
        )
    planned = plan_sessionize(history, key, timestamp, gap, grace, aggregations, emit)
    backend, n, k, _ = resolve(history, backend, num_partitions, name)
    task = planned.input.task(
        SessionizeTask, planned.out_schema, backend, n, name, None,
        key_groups=k, **planned.settings,
    )  # fmt: skip
    return run_bootstrap(planned.input.selected, planned.input.keys, task, quiet_s)


def bootstrap_temporal_join(
    stream_df: Any,
    table_history: Any,
    key: str | Sequence[str],
    stream_timestamp: str,
    table_timestamp: str,
    history_retention: str | int,
    how: str = "inner",
    backend: StateBackend | None = None,
    name: str = "temporal_join",
    num_partitions: int | None = None,
    quiet_s: float = DEFAULT_QUIET_S,
) -> dict[str, Any]:
    """Build the state of ``temporal_join(stream_df, table_df, ...)`` with the same
    arguments from ``table_history``, a batch DataFrame of the table's rows (each
    version with its validity time, in the table's columns), before the query's
    first micro-batch: the versioned table the query would hold had it read the
    history as the micro-batch before its first (docs/rewrite.md, "Bootstrapping").
    ``stream_df`` is the query's stream (or any DataFrame of its columns): only its
    schema is used. Refusals and result as :func:`bootstrap_sessionize`."""
    if table_history.isStreaming:
        raise ValueError(
            "bootstrap_temporal_join needs a batch DataFrame of the table's history; got a "
            "streaming one"
        )
    spark = table_history.sparkSession
    no_stream = spark.createDataFrame([], stream_df.schema)
    sides, keys, out_schema, settings = plan_temporal_join(
        no_stream, table_history, key, stream_timestamp, table_timestamp, history_retention, how
    )
    backend, n, k, _ = resolve(table_history, backend, num_partitions, name)
    combined, task = join_task(
        sides, keys, TemporalJoinTask, out_schema, backend, n, name, None,
        key_groups=k, **settings,
    )  # fmt: skip
    return run_bootstrap(combined, keys, task, quiet_s)
