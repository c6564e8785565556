"""What every sessionstore operator task does on an executor, in one place.

A task finds its partition and micro-batch, loads version ``batchId`` of its
partition's state from the worker's warm store service, lets the operator work
and commits ``batchId + 1``; every ``snapshot_interval`` versions a snapshot is
uploaded in the background. A partition that moves to another Python worker is
handed over by the service, so it never meets a RocksDB lock. The task's input
is read here too: in a deterministic order, keys and structs as Python values.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.checkpoint import StateStoreProvider, StoreHandle
from sessionstore.checkpoint.event_time import EVENT_TIME_FIELD
from sessionstore.checkpoint.metrics import millis
from sessionstore.operators.gc_pause import gc_paused
from sessionstore.stores.segments import operator_segment_interval
from sessionstore.stores.spec import StoreSpec
from spark_integration.driver.coordinator import CoordinatorAddress, commit_arbiter, report
from spark_integration.driver.coordinator import shared_event_time as event_time_after
from spark_integration.planning.backend import StateBackend
from spark_integration.planning.resolve import TS

if TYPE_CHECKING:
    from sessionstore.operators import Aggregation
    from spark_integration.execution.output import OperatorOutput

__all__ = [
    "TaskInfo",
    "task_info",
    "partition_state",
    "state_and_inputs",
    "run_aggregator",
    "AggregatorTask",
    "deterministic_order",
    "key_values",
    "struct_values",
    "take_task_metrics",
    "keep_task_metrics",
    "running_task",
    "outlive_tasks",
]


@dataclass(frozen=True)
class TaskInfo:
    partition: int
    batch_id: int
    attempt: int
    #: the streaming query's run (a restart is a new run), if the task has one
    run: str | None = None


#: The local property of a streaming query's tasks that names the query's run:
#: Spark runs each micro-batch's jobs in a job group named after the run id.
RUN_PROPERTY = "spark.jobGroup.id"


#: The task a state server runs for a Spark worker (see :func:`running_task`).
_given_info: TaskInfo | None = None
#: This process outlives its tasks (a state server): maintenance runs after them.
_long_lived = False


def outlive_tasks() -> None:
    """Mark this process as one that outlives its tasks (a state server), so that
    snapshot uploads run on its background thread after the commit."""
    global _long_lived
    _long_lived = True


@contextmanager
def running_task(info: TaskInfo) -> Iterator[None]:
    """Run an operator task outside its Spark worker, as ``info``: a state server
    (:mod:`spark_integration.execution.state_server`) has no ``TaskContext``, so the worker
    sends what :func:`task_info` would have read there."""
    global _given_info
    _given_info = info
    try:
        yield
    finally:
        _given_info = None


def task_info() -> TaskInfo:
    """Partition, micro-batch id, attempt and query run of the running Spark task
    (or of the task a state server runs for one, :func:`running_task`)."""
    if _given_info is not None:
        return _given_info
    from pyspark import TaskContext

    ctx = TaskContext.get()
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    run = ctx.getLocalProperty(RUN_PROPERTY)
    return TaskInfo(ctx.partitionId(), int(batch or 0), ctx.attemptNumber(), run)


_task_metrics: dict[str, Any] | None = None


def take_task_metrics() -> dict[str, Any] | None:
    """The metrics record of the last task of this worker that committed (see
    :mod:`spark_integration.driver.metrics`), once: a second call returns None. A Python
    worker runs one task at a time, so the task that asks is the one that committed."""
    global _task_metrics
    record, _task_metrics = _task_metrics, None
    return record


def keep_task_metrics(record: dict[str, Any] | None) -> None:
    """Keep ``record`` for :func:`take_task_metrics`: the record of a task that a
    state server ran for this worker, sent back with the task's output."""
    global _task_metrics
    _task_metrics = record


@contextmanager
def partition_state(
    backend: StateBackend,
    name: str,
    info: TaskInfo,
    specs: list[StoreSpec],
    num_partitions: int,
    key_types: list[str] | None = None,
) -> Iterator[tuple[StoreHandle, StateStoreProvider]]:
    """The partition's stores at version ``batch_id``; committed as ``batch_id + 1``
    when the block succeeds, dropped when it raises.

    The provider comes warm from this Python worker's :class:`StoreService` (the
    database stays open between micro-batches and moves to another worker of the
    executor on request); snapshot uploads run on the service's background thread.
    Stores whose spec names no segment interval get the operators' one
    (:func:`~sessionstore.stores.segments.operator_segment_interval`).
    ``key_types`` (the key columns' Spark types, from planning) are recorded in the
    checkpoint for a later repartition.
    """
    from sessionstore.checkpoint.store_service import StoreService

    if info.partition >= num_partitions:
        # Spark numbers the tasks of a stage, not of the operator's shuffle: in a
        # union, a later child's tasks are numbered after the earlier children's, so
        # the task id is no longer the state partition (and a wrong one would mix
        # two partitions' state). Refuse before any state is touched.
        raise RuntimeError(
            f"sessionstore operator {name!r}: this task is partition {info.partition} of "
            f"its stage but the operator has {num_partitions} partitions; its output was "
            "combined with other data in one stage (for example by union), which Spark "
            "numbers as one. Run each sessionstore operator as its own query, or write "
            "the union's inputs out separately"
        )
    specs = [
        spec
        if spec.segment_interval_ms is not None
        else replace(spec, segment_interval_ms=operator_segment_interval(spec.retention_ms))
        for spec in specs
    ]
    local_dir = backend.resolved_local_dir
    # everything that shapes the provider: a query restarted with other settings,
    # stores or partition count gets a new one, which re-checks the checkpoint
    key = repr((
        backend.checkpoint_uri, local_dir, backend.snapshot_interval, backend.retain_versions,
        sorted(backend.storage_options.items()), name, info.partition, num_partitions,
        [spec.describe() for spec in specs], backend.commit_observer, key_types,
        backend.memory_max_mb, backend.orphan_grace_s,
    ))  # fmt: skip

    def make() -> StateStoreProvider:
        return StateStoreProvider(
            backend.checkpoint_uri,
            name,
            info.partition,
            specs,
            local_dir,
            snapshot_interval=backend.snapshot_interval,
            retain_versions=backend.retain_versions,
            storage_options=backend.storage_options,
            num_partitions=num_partitions,
            commit_observer=backend.commit_observer,
            key_types=key_types,
            memory_max_mb=backend.memory_max_mb,
            orphan_grace_s=backend.orphan_grace_s,
        )

    service = StoreService.instance()
    started = time.perf_counter()
    with service.provider(key, make) as provider:
        handle = provider.get_store(info.batch_id)
        # the metrics' load time includes a handover's wait for the holder
        handle.note(load_ms=millis(time.perf_counter() - started))
        try:
            yield handle, provider
        except BaseException:
            handle.abort()
            raise
        version = handle.commit()
        global _task_metrics
        _task_metrics = {
            **provider.last_metrics,
            "partition": info.partition,
            "batch": info.batch_id,
        }
    if version % backend.snapshot_interval == 0:
        # a reused worker and a state server outlive the task; others exit with it
        if os.environ.get("SPARK_REUSE_WORKER") or _long_lived:
            service.maintain_later(key)
        else:  # this worker exits with the task (os._exit): a background upload would die
            provider.do_maintenance()


_helper: tuple[int, ThreadPoolExecutor] | None = None


def _helper_thread() -> ThreadPoolExecutor:
    """This process's helper thread (one, kept for the life of the Python worker).

    Not a thread per task: ``Thread.start`` waits until the new thread runs, and
    then for the GIL, which the new thread holds through the Python part of taking
    a database, so every task would wait (~8 ms, BENCHMARKS.md, "Figures quoted in
    code"). A submit to a waiting thread returns at once. Recreated
    after a fork (PySpark forks its workers).
    """
    global _helper
    pid = os.getpid()
    if _helper is None or _helper[0] != pid:
        _helper = (pid, ThreadPoolExecutor(1, thread_name_prefix="sessionstore-take"))
    return _helper[1]


class _EnteredAhead:
    """A context manager entered on the helper thread at once, so that its set-up
    overlaps with what the caller does next; ``then(value)``, if given, runs there
    too, right after. ``__enter__`` waits for both and returns ``(value, then's
    result)``, re-raising their error on the caller's thread."""

    def __init__(self, cm: Any, then: Callable[[Any], Any] | None = None) -> None:
        self._cm = cm
        self._entered = _helper_thread().submit(self._enter, then)

    def _enter(self, then: Callable[[Any], Any] | None) -> tuple[Any, Any]:
        value = self._cm.__enter__()
        try:
            return value, None if then is None else then(value)
        except BaseException:
            self._cm.__exit__(*sys.exc_info())
            raise

    def __enter__(self) -> tuple[Any, Any]:
        return self._entered.result()

    def __exit__(self, *exc: Any) -> Any:
        return self._cm.__exit__(*exc)

    def discard(self, *exc: Any) -> None:
        """Exit with ``exc`` once entered (the caller failed before using it)."""
        if self._entered.exception() is None:
            self._cm.__exit__(*exc)


@contextmanager
def state_and_inputs(
    backend: StateBackend,
    name: str,
    info: TaskInfo,
    specs: list[StoreSpec],
    num_partitions: int,
    batches: Iterator[pa.RecordBatch],
    shared_event_time: bool = False,
    *,
    key_types: list[str] | None = None,
    coordinator: CoordinatorAddress | None = None,
) -> Iterator[tuple[StoreHandle, StateStoreProvider, list[pa.RecordBatch], int | None]]:
    """:func:`partition_state`, the task's non-empty input batches, and with
    ``shared_event_time`` the operator's event time after the previous batch (see
    :func:`run_aggregator`; else None): the answer of the driver's ``coordinator``
    (:mod:`spark_integration.driver.coordinator`), or without one the durable records.
    Once the block's commit is durable, the task reports its event time (and its
    metrics record) to the coordinator.

    The state is taken (database opened or handed over, version loaded) and the
    event time read on a helper thread while this thread receives the input from
    the JVM: all of them wait on I/O, and one after the other they would add up (a
    RocksDB open, about as long as a large input takes to arrive, and reading the
    event time; measured in BENCHMARKS.md, "Figures quoted in code").
    """
    then = None
    if shared_event_time:

        def then(entered: tuple[StoreHandle, StateStoreProvider]) -> int | None:
            storage = entered[1].operator_storage
            return event_time_after(
                coordinator, storage, info.run, info.batch_id - 1, num_partitions
            )

    state = partition_state(backend, name, info, specs, num_partitions, key_types)
    ahead = _EnteredAhead(state, then)
    try:
        inputs = [b for b in batches if b.num_rows]
    except BaseException:
        ahead.discard(*sys.exc_info())  # the state's batch is dropped, its lock freed
        raise
    with ahead as ((handle, provider), shared):
        if coordinator is not None:  # the arbiter between attempts of this batch
            handle.arbitrate(commit_arbiter(coordinator, info.run, info.partition))
        yield handle, provider, inputs, shared
    # committed: the changelog holding this event time is durable, so the report
    # can never tell the coordinator a time the durable record does not say
    if coordinator is not None:  # every operator reports: its metrics ride along
        event_time = handle.header.get(EVENT_TIME_FIELD) if shared_event_time else None
        report(coordinator, info.run, info.batch_id, info.partition, event_time, _task_metrics)


def deterministic_order(table: pa.Table, first: Sequence[str] = ()) -> pa.Table:
    """``table`` sorted by ``first``, then by every other sortable column.

    Spark does not promise that a shuffle delivers rows in the same order when a
    task is retried; sorting makes a retried or replayed task process exactly the
    same sequence, so its output and state are the same. Struct columns are sorted
    by their fields; rows equal in every sortable column are interchangeable.
    """
    flat = table.flatten()
    names = list(first) + [n for n in flat.column_names if n not in first]
    keys = [
        (n, "ascending", "at_start")
        for n in names
        if not pa.types.is_nested(flat.schema.field(n).type)
        and not pa.types.is_null(flat.schema.field(n).type)
    ]
    if not keys or table.num_rows < 2:
        return table
    return table.take(pc.sort_indices(flat, sort_keys=keys))


def key_values(table: pa.Table, keys: list[str]) -> list[Any]:
    """The key of every row: a column's values, or tuples for several columns."""
    if len(keys) == 1:
        return table.column(keys[0]).to_pylist()
    cols = [table.column(k).to_pylist() for k in keys]
    return [tuple(parts) for parts in zip(*cols, strict=True)]


def struct_values(table: pa.Table, name: str) -> list[Any]:
    """The dicts of a struct column, or Nones when no input row had it."""
    if name in table.column_names:
        return table.column(name).to_pylist()
    return [None] * table.num_rows


def run_aggregator(
    agg: Any,
    provider: StateStoreProvider,
    info: TaskInfo,
    inputs: list[pa.RecordBatch],
    keys: list[str],
    value_cols: list[str],
    shared: int | None,
    handle: StoreHandle,
    bounded: bool = False,
) -> tuple[list[Any], pa.Table | None]:
    """One batch of an event-time aggregator (session or window): advance to
    ``shared``, the operator's event time after the previous batch (from
    :func:`state_and_inputs`), process the rows in deterministic order (event time
    in column ``TS``), and record this partition's event time in ``handle``'s
    commit (the durable record the next batch's tasks advance to).

    ``bounded`` (a batch DataFrame: no later row can come) then emits every
    session and window still open (the aggregator's ``finish_input``), as Spark's
    batch ``session_window`` and Flink's final watermark do.

    Returns the updates as objects, and as a table those of the aggregator's columnar
    path (``process_table``) when the batch qualifies (else None)."""
    from sessionstore.operators.arrow_io import columns_of

    updates: list[Any] = []
    table_out = None
    if shared is not None:
        updates += agg.advance_to(shared)
    if inputs:
        with gc_paused():  # Python objects for every row, and no cycles among them
            table = deterministic_order(pa.Table.from_batches(inputs), [TS])
            key = keys[0] if len(keys) == 1 else keys
            value = value_cols or None
            table_out = agg.process_table(table, key, TS, value)
            if table_out is None:
                k, times, values = columns_of(table, key, TS, value)
                # update mode: one row per changed session or window per micro-batch
                updates += agg.process_rows(k, times, values, net=True)
    if bounded:
        updates += agg.finish_input()
    handle.note_event_time(agg.stream_time)
    # the commit's metrics: late rows and emitted rows
    emitted = len(updates) + (0 if table_out is None else table_out.num_rows)
    handle.note(late_dropped=agg.dropped_records, emitted=emitted)
    return updates, table_out


@dataclass(kw_only=True)
class AggregatorTask:
    """What each task of an event-time aggregating operator (``sessionize``,
    ``window_aggregate``) runs: picklable, so it ships to the executors.

    It takes its partition's one store (:meth:`store_spec`) with the operator's
    shared event time, runs the operator's aggregator (:meth:`aggregator`) over the
    task's rows with :func:`run_aggregator`, commits, and yields the output batches
    (:meth:`output_batches`). An operator's subclass adds its own settings.
    """

    backend: StateBackend
    name: str
    num_partitions: int
    value_cols: list[str]
    emit: str
    aggregation: Aggregation
    output: OperatorOutput
    key_types: list[str]
    coordinator: CoordinatorAddress | None = None
    #: the input is a batch DataFrame: emit everything at its end
    bounded: bool = False

    def store_spec(self) -> StoreSpec:
        """The spec of the operator's store."""
        raise NotImplementedError

    def aggregator(self, store: Any) -> Any:
        """The operator's aggregator over ``store``, the partition's store."""
        raise NotImplementedError

    def output_batches(
        self, updates: list[Any], table: pa.Table | None
    ) -> Iterator[pa.RecordBatch]:
        """The output rows of a batch's ``updates`` and of its columnar path's
        ``table`` (None when the batch took the record path)."""
        raise NotImplementedError

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        info = task_info()
        spec = self.store_spec()
        task = (self.backend, self.name, info, [spec], self.num_partitions, batches)
        with state_and_inputs(
            *task, shared_event_time=True, key_types=self.key_types, coordinator=self.coordinator
        ) as (handle, provider, inputs, shared):
            agg = self.aggregator(handle[spec.name])
            updates, table = run_aggregator(
                agg,
                provider,
                info,
                inputs,
                self.output.keys,
                self.value_cols,
                shared,
                handle,
                self.bounded,
            )
        yield from self.output_batches(updates, table)
