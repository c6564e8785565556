"""The task of an event-time aggregating operator (``sessionize``,
``window_aggregate``): :func:`run_aggregator` runs one batch of its aggregator, and
:class:`AggregatorTask`, which the operators subclass, takes the partition's state,
runs it and yields the output.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

from sessionstore.checkpoint import StateStoreProvider, StoreHandle
from sessionstore.operators.gc_pause import gc_paused
from sessionstore.operators.sessions.model import ClosedSessions
from sessionstore.stores.base import Store
from sessionstore.stores.spec import StoreSpec
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.names import TS
from spark_integration.coordinator.protocol import CoordinatorAddress
from spark_integration.execution.context import TaskContext, TaskInfo
from spark_integration.execution.inputs import deterministic_order
from spark_integration.execution.partition_state import state_and_inputs

if TYPE_CHECKING:
    from sessionstore.operators import Aggregation
    from spark_integration.execution.output import OperatorOutput

__all__ = ["AggregatorTask", "Emitted", "run_aggregator", "EventTimeAggregator", "ClosesAsColumns"]


class EventTimeAggregator(Protocol):
    """What :func:`run_aggregator` asks of an engine-agnostic event-time aggregator
    (:class:`~sessionstore.operators.SessionWindowAggregator`, the window
    aggregators): the seam between ``sessionstore.operators`` and a task."""

    #: rows dropped as late so far (the commit's metrics)
    dropped_records: int

    @property
    def stream_time(self) -> int | None:
        """The largest event time seen (None before any)."""

    def advance_to(self, event_time: int) -> list[Any]:
        """Close what ``event_time`` closes; the updates it emits."""

    def finish_input(self) -> list[Any]:
        """Emit everything still open (no later row can come)."""

    def process_table(
        self, batch: pa.Table, key: str | Sequence[str], timestamp: str, value: Any
    ) -> pa.Table | None:
        """The columnar path, or None with nothing changed when the batch does not
        qualify."""

    def process_rows(
        self, keys: Sequence[Any], timestamps: Sequence[int | None], values: Sequence[Any],
        *, net: bool = False,
    ) -> list[Any]:  # fmt: skip
        """The rows as Python values; the updates they emit."""


@runtime_checkable
class ClosesAsColumns(EventTimeAggregator, Protocol):
    """An aggregator that gives what an advance closes as columns (one result
    column per aggregate, not a dict per session)."""

    def advance_columns(self, event_time: int) -> ClosedSessions:
        """:meth:`advance_to`, as columns."""

    def finish_input_columns(self) -> ClosedSessions:
        """:meth:`finish_input`, as columns."""


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
    agg: EventTimeAggregator,
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

    An aggregator that gives closed sessions as columns (:class:`ClosesAsColumns`)
    gives them so."""
    from sessionstore.operators.batch_paths.arrow_io import columns_of

    out = Emitted([], [], None)
    as_columns = isinstance(agg, ClosesAsColumns)
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
    #: the operator's partition count, held in ``num_partitions`` slabs (None: not
    #: checked)
    key_groups: int | None = None

    def store_spec(self) -> StoreSpec:
        """The spec of the operator's store."""
        raise NotImplementedError

    def aggregator(self, store: Store) -> EventTimeAggregator:
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
            *task, shared_event_time=True, key_types=self.key_types, coordinator=self.coordinator,
            key_groups=self.key_groups,
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
