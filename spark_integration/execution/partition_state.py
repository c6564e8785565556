"""What every sessionstore operator task does on an executor, in one place.

A task finds its partition and micro-batch, loads version ``batchId`` of its
partition's state from the worker's warm store service, lets the operator work
and commits ``batchId + 1``; every ``snapshot_interval`` versions a snapshot is
uploaded in the background. A partition that moves to another Python worker is
handed over by the service, so it never meets a RocksDB lock. The task's input
is taken while the state loads (:func:`state_and_inputs`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from sessionstore.checkpoint import StateStoreProvider, StoreHandle
from sessionstore.checkpoint.records.event_time import EVENT_TIME_FIELD
from sessionstore.checkpoint.records.metrics import millis
from sessionstore.checkpoint.storage.flush_group import after_flush, after_flush_together
from sessionstore.process import this_process
from sessionstore.stores.segments import operator_segment_interval
from sessionstore.stores.spec import StoreSpec
from spark_integration.conf.backend import StateBackend
from spark_integration.coordinator.client import commit_arbiter, report_many
from spark_integration.coordinator.client import shared_event_time as event_time_after
from spark_integration.coordinator.protocol import CoordinatorAddress
from spark_integration.execution.context import TaskContext, check_partition

__all__ = ["partition_state", "state_and_inputs"]


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
    key_groups: int | None = None

    def key(self) -> str:
        b = self.backend
        return repr((
            b.checkpoint_uri, b.resolved_local_dir, b.snapshot_interval, b.retain_versions,
            sorted(b.storage_options.items()), self.name, self.partition, self.num_partitions,
            [spec.describe() for spec in self.specs], b.commit_observer, self.key_types,
            b.memory_max_mb, b.orphan_grace_s, b.allow_pickle, self.key_groups,
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
            key_groups=self.key_groups,
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
    key_groups: int | None = None,
) -> Iterator[tuple[StoreHandle, StateStoreProvider]]:
    """The partition's stores at version ``batch_id``; committed as ``batch_id + 1``
    when the block succeeds (the task's metrics record then left in ``context``),
    dropped when it raises.

    The provider comes warm from this process's :class:`StoreService` (the
    database stays open between micro-batches and moves to another worker of the
    executor on request); snapshot uploads run on the service's background thread
    when the process outlives the task. Stores whose spec names no segment
    interval get the operators' one. ``key_types`` (the key columns' Spark types,
    from planning) are recorded in the checkpoint for a later repartition;
    ``key_groups``, the operator's partition count when ``num_partitions`` slabs
    hold its partitions (identity.py), is recorded and checked.
    """
    from sessionstore.checkpoint.service.store_service import StoreService

    info = context.info
    check_partition(name, info.partition, num_partitions)
    recipe = _ProviderRecipe(
        backend, name, info.partition, _segmented(specs), num_partitions, key_types, key_groups
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
        # the snapshot is built on changelog ``version``: never published (nor older
        # data deleted for it) before that changelog is durable, at the end of the
        # task's flush group if it runs in one
        if context.outlives_task:
            after_flush(lambda: service.maintain_later(key))
        else:  # this worker exits with the task (os._exit): a background upload would die
            after_flush(provider.do_maintenance)


def _helper_thread() -> ThreadPoolExecutor:
    """This process's helper thread (one, kept for the life of the Python worker,
    in its ``helper_thread`` slot: :mod:`sessionstore.process`).

    Not a thread per task: ``Thread.start`` waits until the new thread runs, and
    then for the GIL, which the new thread holds through the Python part of taking
    a database, so every task would wait (~8 ms, BENCHMARKS.md, "Figures quoted in
    code"). A submit to a waiting thread returns at once. Recreated
    after a fork (PySpark forks its workers).
    """
    return this_process().get_or_make(
        "helper_thread", lambda: ThreadPoolExecutor(1, thread_name_prefix="sessionstore-take")
    )


class _EnteredAhead:
    """A context manager entered on the helper thread at once, so that its set-up
    overlaps with what the caller does next; ``then(value)``, if given, runs there
    too, right after. ``__enter__`` waits for both and returns ``(value, then's
    result)``, re-raising their error on the caller's thread."""

    def __init__(
        self, cm: AbstractContextManager[Any], then: Callable[[Any], Any] | None = None
    ) -> None:
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
    key_groups: int | None = None,
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
            if info.batch_id == 0:  # the history's, when version 0 was bootstrapped
                return entered[1].initial_event_time
            storage = entered[1].operator_storage
            return event_time_after(
                coordinator, storage, info.run, info.batch_id - 1, num_partitions
            )

    state = partition_state(backend, name, context, specs, num_partitions, key_types, key_groups)
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
    # committed; reported once the changelog holding this event time is durable (at
    # once, or after the task's flush group), so the report can never tell the
    # coordinator a time the durable record does not say
    if coordinator is not None:  # every operator reports: its metrics ride along
        event_time = handle.header.get(EVENT_TIME_FIELD) if shared_event_time else None
        metrics = context.metrics
        # one request for every partition the task's flush group committed
        after_flush_together(
            (coordinator.host, coordinator.port, coordinator.token, info.run, info.batch_id),
            (info.partition, event_time, metrics),
            lambda reports: report_many(coordinator, info.run, info.batch_id, reports),
        )
