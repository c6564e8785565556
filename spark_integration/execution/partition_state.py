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
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.checkpoint import StateStoreProvider, StoreHandle
from sessionstore.checkpoint.records.event_time import EVENT_TIME_FIELD
from sessionstore.checkpoint.records.metrics import millis
from sessionstore.operators.gc_pause import gc_paused
from sessionstore.operators.sessions.model import ClosedSessions
from sessionstore.stores.segments import operator_segment_interval
from sessionstore.stores.spec import StoreSpec
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.names import TS
from spark_integration.coordinator.client import commit_arbiter, report
from spark_integration.coordinator.client import shared_event_time as event_time_after
from spark_integration.coordinator.protocol import CoordinatorAddress

if TYPE_CHECKING:
    from sessionstore.operators import Aggregation
    from spark_integration.execution.output import OperatorOutput

__all__ = [
    "TaskInfo",
    "TaskContext",
    "ContextTask",
    "SparkTask",
    "task_info",
    "spark_task_context",
    "check_partition",
    "partition_state",
    "state_and_inputs",
    "run_aggregator",
    "Emitted",
    "AggregatorTask",
    "deterministic_order",
    "key_values",
    "struct_values",
]


@dataclass(frozen=True)
class TaskInfo:
    """Which task this is: its state partition, micro-batch and attempt (what a
    state server is sent, as msgpack, in this field order)."""

    partition: int
    batch_id: int
    attempt: int
    #: the streaming query's run (a restart is a new run), if the task has one
    run: str | None = None


#: The local property of a streaming query's tasks that names the query's run:
#: Spark runs each micro-batch's jobs in a job group named after the run id.
RUN_PROPERTY = "spark.jobGroup.id"


@dataclass
class TaskContext:
    """What the code that runs an operator task gives it, and what the task gives
    back: passed to :meth:`ContextTask.run` by the worker wrapper.

    Spark's ``mapInArrow`` function (:class:`SparkTask`) makes one from Spark's
    ``TaskContext``; a state server (:mod:`spark_integration.execution.state_server`)
    from what the worker sent, having no ``TaskContext`` of its own; a Spark task
    that runs several state partitions (:mod:`spark_integration.planning.placement`)
    one per partition. The task's commit leaves its metrics record here rather
    than in a generator's return value, which a wrapper that maps the task's
    output would lose."""

    info: TaskInfo
    #: the process lives on after the task (a reused Python worker, a state
    #: server), so a snapshot upload can run after the commit, in the background
    outlives_task: bool = False
    #: the task's metrics record (:mod:`spark_integration.execution.metrics`), set
    #: when it commits
    metrics: dict[str, Any] | None = None

    def for_partition(self, partition: int) -> TaskContext:
        """A fresh context for state partition ``partition`` of this Spark task."""
        return TaskContext(replace(self.info, partition=partition), self.outlives_task)


class ContextTask(Protocol):
    """An operator task, or a wrapper of one: runs over a Spark task's input as
    ``context`` says and yields Arrow batches or tables."""

    def run(self, batches: Iterator[pa.RecordBatch], context: TaskContext) -> Iterator[Any]:
        """The task's output; its metrics record is left in ``context``."""
        ...


def task_info() -> TaskInfo:
    """Partition, micro-batch id, attempt and query run of the running Spark task."""
    from pyspark import TaskContext as SparkTaskContext

    ctx = SparkTaskContext.get()
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    run = ctx.getLocalProperty(RUN_PROPERTY)
    return TaskInfo(ctx.partitionId(), int(batch or 0), ctx.attemptNumber(), run)


def spark_task_context() -> TaskContext:
    """The context of the running Spark task, in its Python worker: a worker that
    Spark reuses (``spark.python.worker.reuse``) outlives the task, others exit
    with it."""
    return TaskContext(task_info(), outlives_task=bool(os.environ.get("SPARK_REUSE_WORKER")))


@dataclass
class SparkTask:
    """The ``mapInArrow`` function of an operator: runs ``task`` as the Spark task
    it is called in (picklable, as the task it wraps)."""

    task: ContextTask

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[Any]:
        yield from self.task.run(batches, spark_task_context())


def check_partition(name: str | None, partition: int, count: int, unit: str = "partitions") -> None:
    """Refuse a Spark task numbered ``partition`` when the operator ``name`` has
    only ``count`` of them (``unit``: its state partitions, or its Spark tasks),
    before any state is touched.

    Spark numbers the tasks of a stage, not of the operator's shuffle: in a union,
    a later child's tasks are numbered after the earlier children's, so the task
    number is no longer the state partition, and a wrong one would mix two
    partitions' state."""
    if partition >= count:
        operator = "sessionstore operator" + ("" if name is None else f" {name!r}")
        raise RuntimeError(
            f"{operator}: this task is partition {partition} of its stage but the "
            f"operator has {count} {unit}; its output was combined with other data in "
            "one stage (for example by union), which Spark numbers as one. Run each "
            "sessionstore operator as its own query, or write the union's inputs out "
            "separately"
        )


def _segmented(specs: list[StoreSpec]) -> list[StoreSpec]:
    """``specs``, those that name no segment interval given the operators' one
    (:func:`~sessionstore.stores.segments.operator_segment_interval`)."""
    return [
        spec
        if spec.segment_interval_ms is not None
        else replace(spec, segment_interval_ms=operator_segment_interval(spec.retention_ms))
        for spec in specs
    ]


@dataclass(frozen=True)
class _ProviderRecipe:
    """Everything that shapes a partition's provider: its key in the store service
    (a query restarted with other settings, stores or partition count gets a new
    provider, which re-checks the checkpoint) and how to make one. The provider of
    a key serves one incarnation of its checkpoint at a time: the first task of
    each query run confirms the checkpoint's id (``get_store(run=...)``), and a
    checkpoint deleted and created again is checked afresh, its old state dropped."""

    backend: StateBackend
    name: str
    partition: int
    specs: list[StoreSpec]
    num_partitions: int
    key_types: list[str] | None

    def key(self) -> str:
        b = self.backend
        return repr((
            b.checkpoint_uri, b.resolved_local_dir, b.snapshot_interval, b.retain_versions,
            sorted(b.storage_options.items()), self.name, self.partition, self.num_partitions,
            [spec.describe() for spec in self.specs], b.commit_observer, self.key_types,
            b.memory_max_mb, b.orphan_grace_s, b.allow_pickle,
        ))  # fmt: skip

    def make(self) -> StateStoreProvider:
        b = self.backend
        return StateStoreProvider(
            b.checkpoint_uri,
            self.name,
            self.partition,
            self.specs,
            b.resolved_local_dir,
            snapshot_interval=b.snapshot_interval,
            retain_versions=b.retain_versions,
            storage_options=b.storage_options,
            num_partitions=self.num_partitions,
            commit_observer=b.commit_observer,
            key_types=self.key_types,
            memory_max_mb=b.memory_max_mb,
            orphan_grace_s=b.orphan_grace_s,
            allow_pickle=b.allow_pickle,
        )


@contextmanager
def partition_state(
    backend: StateBackend,
    name: str,
    context: TaskContext,
    specs: list[StoreSpec],
    num_partitions: int,
    key_types: list[str] | None = None,
) -> Iterator[tuple[StoreHandle, StateStoreProvider]]:
    """The partition's stores at version ``batch_id``; committed as ``batch_id + 1``
    when the block succeeds (the task's metrics record then left in ``context``),
    dropped when it raises.

    The provider comes warm from this process's :class:`StoreService` (the
    database stays open between micro-batches and moves to another worker of the
    executor on request); snapshot uploads run on the service's background thread
    when the process outlives the task. Stores whose spec names no segment
    interval get the operators' one. ``key_types`` (the key columns' Spark types,
    from planning) are recorded in the checkpoint for a later repartition.
    """
    from sessionstore.checkpoint.service.store_service import StoreService

    info = context.info
    check_partition(name, info.partition, num_partitions)
    recipe = _ProviderRecipe(
        backend, name, info.partition, _segmented(specs), num_partitions, key_types
    )
    key = recipe.key()
    service = StoreService.instance()
    started = time.perf_counter()
    with service.provider(key, recipe.make) as provider:
        # the checkpoint's identity is confirmed at the run's first task only (an
        # offline change, or a reset checkpoint, has a new id: see provider.confirm)
        handle = provider.get_store(info.batch_id, run=info.run)
        # the metrics' load time includes a handover's wait for the holder
        handle.note(load_ms=millis(time.perf_counter() - started))
        try:
            yield handle, provider
        except BaseException:
            handle.abort()
            raise
        version = handle.commit()
        context.metrics = {
            **provider.last_metrics,
            "partition": info.partition,
            "batch": info.batch_id,
        }
    if version % backend.snapshot_interval == 0:
        if context.outlives_task:
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
    context: TaskContext,
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
    (:mod:`spark_integration.coordinator.server`), or without one the durable records.
    Once the block's commit is durable, the task reports its event time (and its
    metrics record) to the coordinator.

    The state is taken (database opened or handed over, version loaded) and the
    event time read on a helper thread while this thread receives the input from
    the JVM: all of them wait on I/O, and one after the other they would add up (a
    RocksDB open, about as long as a large input takes to arrive, and reading the
    event time; measured in BENCHMARKS.md, "Figures quoted in code").
    """
    info = context.info
    then = None
    if shared_event_time:

        def then(entered: tuple[StoreHandle, StateStoreProvider]) -> int | None:
            storage = entered[1].operator_storage
            return event_time_after(
                coordinator, storage, info.run, info.batch_id - 1, num_partitions
            )

    state = partition_state(backend, name, context, specs, num_partitions, key_types)
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
        report(coordinator, info.run, info.batch_id, info.partition, event_time, context.metrics)


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


@dataclass
class Emitted:
    """What one batch of an event-time aggregator emits: ``updates`` (objects),
    ``closed`` (the sessions its advances closed, as columns: ``ClosedSessions``)
    and ``table``, the output of the aggregator's columnar path (``process_table``)
    when the batch qualified (else None)."""

    updates: list[Any]
    closed: list[ClosedSessions]
    table: pa.Table | None

    @property
    def count(self) -> int:
        """How many rows this is."""
        table_rows = 0 if self.table is None else self.table.num_rows
        return len(self.updates) + sum(c.count for c in self.closed) + table_rows


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
) -> Emitted:
    """One batch of an event-time aggregator (session or window): advance to
    ``shared``, the operator's event time after the previous batch (from
    :func:`state_and_inputs`), process the rows in deterministic order (event time
    in column ``TS``), and record this partition's event time in ``handle``'s
    commit (the durable record the next batch's tasks advance to).

    ``bounded`` (a batch DataFrame: no later row can come) then emits every
    session and window still open (the aggregator's ``finish_input``), as Spark's
    batch ``session_window`` and Flink's final watermark do.

    An aggregator that gives closed sessions as columns (``advance_columns``: one
    result column per aggregate, not a dict per session) gives them so."""
    from sessionstore.operators.arrow_io import columns_of

    out = Emitted([], [], None)
    as_columns = hasattr(agg, "advance_columns")
    if shared is not None:
        with gc_paused():  # an object per session the advance closes, no cycles
            if as_columns:
                out.closed.append(agg.advance_columns(shared))
            else:
                out.updates += agg.advance_to(shared)
    if inputs:
        with gc_paused():  # Python objects for every row, and no cycles among them
            table = deterministic_order(pa.Table.from_batches(inputs), [TS])
            key = keys[0] if len(keys) == 1 else keys
            value = value_cols or None
            out.table = agg.process_table(table, key, TS, value)
            if out.table is None:
                k, times, values = columns_of(table, key, TS, value)
                # update mode: one row per changed session or window per micro-batch
                out.updates += agg.process_rows(k, times, values, net=True)
    if bounded:
        if as_columns:
            out.closed.append(agg.finish_input_columns())
        else:
            out.updates += agg.finish_input()
    handle.note_event_time(agg.stream_time)
    # the commit's metrics: late rows and emitted rows
    handle.note(late_dropped=agg.dropped_records, emitted=out.count)
    return out


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

    def output_batches(self, emitted: Emitted) -> Iterator[pa.RecordBatch]:
        """The output rows of what a batch emitted."""
        raise NotImplementedError

    def run(
        self, batches: Iterator[pa.RecordBatch], context: TaskContext
    ) -> Iterator[pa.RecordBatch]:
        """Run over the task's input as ``context`` (see :class:`ContextTask`)."""
        info = context.info
        spec = self.store_spec()
        task = (self.backend, self.name, context, [spec], self.num_partitions, batches)
        with state_and_inputs(
            *task, shared_event_time=True, key_types=self.key_types, coordinator=self.coordinator
        ) as (handle, provider, inputs, shared):
            agg = self.aggregator(handle[spec.name])
            emitted = run_aggregator(
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
        yield from self.output_batches(emitted)
