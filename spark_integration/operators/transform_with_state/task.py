"""The task each partition of ``transform_with_state`` runs (``mapInArrow``):
:class:`ProcessorTask`.

It loads the partition's state, works out the batch's times, groups the input by
key in encoded-key order, runs the processor through
:class:`~sessionstore.operators.processors.ProcessorRunner` over a handle it
builds (:meth:`ProcessorTask.handle`, the one factory that
:class:`~spark_integration.testing.ProcessorTester` uses too), converts the
output to Arrow and commits.

Times, as Spark defines them:

* processing time is the micro-batch's timestamp (``current_timestamp()``, which
  Spark fixes per batch in its offset log, so a replayed batch sees the same
  time). A partition without rows takes the wall clock; every commit records the
  time in its changelog header (processing_time.py), which a task that may be a
  replay of its batch reads back (:func:`_empty_partition_now`);
* the event-time watermark of batch N is the largest event time of the batches
  before it, over all partitions, minus the ``withWatermark`` delay (never below
  0), shared through the checkpoint (``state_and_inputs(shared_event_time=True)``);
  rows at or below the previous batch's watermark are dropped as late, as Spark's
  operator drops them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.encoding.ints import INT64
from sessionstore.operators.batch_paths.arrow_io import epoch_millis_array
from sessionstore.operators.gc_pause import gc_paused
from sessionstore.operators.processors import (
    BatchTimes,
    ProcessorHandle,
    ProcessorRunner,
    extra_store_name,
)
from sessionstore.stores.spec import StoreSpec
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.names import TS
from spark_integration.coordinator.protocol import CoordinatorAddress
from spark_integration.execution.context import TaskContext
from spark_integration.execution.output import arrow_schema
from spark_integration.execution.partition_state import state_and_inputs
from spark_integration.operators.transform_with_state.frames import (
    PandasConf,
    frames_output,
    pandas_slices,
    spark_pandas,
)
from spark_integration.operators.transform_with_state.grouping import grouped_rows
from spark_integration.operators.transform_with_state.initial_state import read_initial_state
from spark_integration.operators.transform_with_state.rows import row_maker, row_slices, rows_output

__all__ = ["ProcessorTask", "NOW", "STORE"]

#: The batch's processing time, in ms (``current_timestamp()`` in the input).
NOW = "__ss_now"
#: The processor store of every transform_with_state operator.
STORE = "processor"
WATERMARK_AUX = "watermark"
#: The query run that committed the state (time modes only): a task of the same run
#: loading it cannot be a replay of a batch whose output a sink kept.
RUN_AUX = "run"


@dataclass
class ProcessorTask:
    """One partition's run of a processor per micro-batch (``mapInArrow``), as
    planned by :func:`~spark_integration.operators.transform_with_state.transform_with_state`."""

    backend: StateBackend
    name: str
    num_partitions: int
    keys: list[str]
    input_columns: list[str]
    processor: Any
    api: str
    time_mode: str
    delay_ms: int | None
    out_schema_json: str
    extra_stores: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: the token of the initial state in the checkpoint (``initial_state_token``)
    initial: str | None = None
    key_types: list[str] | None = None
    coordinator: CoordinatorAddress | None = None
    #: the pandas API's Spark conf (None for the row API)
    pandas: PandasConf | None = None
    event_time_column: str | None = None
    #: each state variable's schemas in Spark's JSON form, parsed on the driver
    #: (executors cannot parse DDL): what the stored values are encoded from, and
    #: how many fields a map state's user key has
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the operator's partition count, held in ``num_partitions`` slabs (None: not
    #: checked)
    key_groups: int | None = None

    def run(self, batches: Iterator[pa.RecordBatch], context: TaskContext) -> Iterator[Any]:
        info = context.info
        event_time = self.time_mode == "EventTime"
        with state_and_inputs(
            self.backend, self.name, context, self.store_specs(), self.num_partitions, batches,
            shared_event_time=event_time, key_types=self.key_types,
            coordinator=self.coordinator, key_groups=self.key_groups,
        ) as (stores, provider, inputs, shared):  # fmt: skip
            store = stores[STORE]
            table = pa.Table.from_batches(inputs) if inputs else None
            # the watermark for late rows: the previous batch's (0 before any)
            previous = _stored_watermark(store) if event_time else 0
            if self.time_mode == "None":
                times, late, max_event_time = BatchTimes(), None, None
            else:
                if table is not None:
                    now = pc.max(table.column(NOW)).as_py()
                else:
                    now = _empty_partition_now(store, provider, info)
                times, late, max_event_time = self._times(table, now, shared, previous)
            if table is not None and late is not None:
                table = table.filter(pc.invert(late))
            initial = None
            if self.initial is not None and stores.version == 0:  # the first batch only
                initial = read_initial_state(
                    provider.operator_storage, self.initial, info.partition, self.keys,
                    self.api, self.pandas,
                )  # fmt: skip
            out, dropped, due = self.process(stores, table, times, initial)
            if self.time_mode != "None":
                stores.note_processing_time(times.processing_ms)  # (processing_time.py)
                stores.note_deadlines(*due)  # what the due source reads (deadlines.py)
                if info.run is not None:
                    store.write_aux(RUN_AUX, info.run.encode())
            if event_time:
                stores.note_event_time(max_event_time)  # the durable record (event_time.py)
                store.write_aux(WATERMARK_AUX, INT64.pack(times.watermark_ms))
                if self.event_time_column is not None:
                    _check_not_late(out, self.event_time_column, previous)
            late_count = 0 if late is None else pc.sum(late).as_py() or 0
            stores.note(late_dropped=late_count + dropped, emitted=out.num_rows)
        if out.num_rows:
            yield from out.to_batches()

    def store_specs(self) -> list[StoreSpec]:
        """The stores of a partition: the processor store and the extra stores its
        ``init`` asked for (session and versioned state)."""
        return [StoreSpec(STORE, "processor", 0)] + [
            StoreSpec(extra_store_name(var), kind, retention)
            for var, (kind, retention) in self.extra_stores.items()
        ]

    def handle(
        self, store: Any, open_store: Callable[[str, str, int], Any] | None = None
    ) -> ProcessorHandle:
        """The processor's handle over a partition's processor ``store``
        (``open_store(kind, name, retention_ms)`` gives the extra stores): the
        schemas the driver parsed, PySpark's ``PySparkRuntimeError`` for the calls
        Spark's JVM refuses, ``Row`` for nested structs read back. The one factory
        of a Spark task and of :class:`~spark_integration.testing.ProcessorTester`."""
        from pyspark.errors import PySparkRuntimeError

        return ProcessorHandle(
            store,
            self.time_mode,
            open_store=open_store,
            key_arity=len(self.keys),
            runtime_error=PySparkRuntimeError,
            schemas=self.schemas,
            make_struct=row_maker,
        )

    def process(
        self,
        stores: Any,
        table: pa.Table | None,
        times: BatchTimes,
        initial: dict[tuple, list[Any]] | None = None,
    ) -> tuple[pa.Table, int, tuple[int | None, int | None]]:
        """Run the processor over one batch of a partition whose stores are loaded
        (``stores[name]``): the output as Arrow, how many rows had a null key, and
        when the partition next has work without input (:meth:`deadlines`)."""
        store = stores[STORE]
        handle = self.handle(store, lambda kind, store_name, retention: stores[store_name])
        # the batch allocates rows, keys and state payloads by the hundred thousand,
        # each burst a collection that traverses every live object: none while it runs
        with gc_paused():
            groups, dropped = self.groups(store, table)
            runner = ProcessorRunner(self.processor, handle, self.time_mode)
            counts = runner.run_batch(groups, times, initial)
            return self.output(counts.outputs), dropped, self.deadlines(handle.core)

    def deadlines(self, core: Any) -> tuple[int | None, int | None]:
        """When the partition next has work without input, after a batch: the
        earliest processing time (a processing-time timer, a TTL expiry) and the
        earliest shared event time (an event-time timer's expiry plus the
        watermark delay: the batch's watermark is that time minus the delay)."""
        if self.time_mode == "None":
            return None, None
        timer = core.next_timer()
        expiry = core.next_expiry()
        if self.time_mode == "ProcessingTime":
            known = [t for t in (timer, expiry) if t is not None]
            return (min(known) if known else None), None
        event = None if timer is None else timer + (self.delay_ms or 0)
        return expiry, event

    # ---------------------------------------------------------------- times
    def _times(
        self, table: pa.Table | None, now: int, shared: int | None, previous: int
    ) -> tuple[BatchTimes, Any, int | None]:
        """The batch's times, the late-row mask (event time: rows at or below the
        ``previous`` batch's watermark) and this partition's event time after it."""
        if self.time_mode != "EventTime":
            return BatchTimes(now, -1), None, None
        watermark = 0 if shared is None else max(0, shared - self.delay_ms)
        late = None
        event_time = shared
        if table is not None:
            ms, valid = epoch_millis_array(table.column(TS))
            late = pa.array((ms <= previous) | ~valid) if previous > 0 else pa.array(~valid)
            if valid.any():
                top = int(ms[valid].max())
                event_time = top if event_time is None else max(event_time, top)
        return BatchTimes(now, watermark), late, event_time

    # ---------------------------------------------------------------- input
    def groups(self, store: Any, table: pa.Table | None) -> tuple[list, int]:
        """``(key, encoded key, rows factory)`` per key, in encoded-key order, and
        how many rows had a null key (dropped: keys are never null in the store)."""
        if table is None or table.num_rows == 0:
            return [], 0
        valid = None
        for k in self.keys:
            v = table.column(k).is_valid()
            valid = v if valid is None else pc.and_(valid, v)
        dropped = table.num_rows - (pc.sum(valid).as_py() or 0)
        if dropped:
            table = table.filter(valid)
        batch = grouped_rows(table, self.keys, python_values=self.api != "pandas")
        table, bounds = batch.table, batch.bounds
        # the key values of each run's first row only: per key, not per row
        firsts = pa.array([start for start, _ in bounds], type=pa.int64())
        key_cols = [table.column(k).take(firsts).to_pylist() for k in self.keys]
        key_list = key_cols[0] if len(self.keys) == 1 else list(zip(*key_cols, strict=True))
        data = table.select(self.input_columns)
        encode = store.encode_key
        single = len(self.keys) == 1
        if self.api == "pandas":
            conf = self.pandas or PandasConf()
            # one conversion per batch; keys take slices
            frame = spark_pandas(data, conf.timezone)
            make = pandas_slices(frame, conf.chunk_rows(data))
        else:
            make = row_slices(data, batch.values)
        groups = []
        for stored, (start, end) in zip(key_list, bounds, strict=True):
            key = (stored,) if single else stored
            groups.append((key, encode(stored), make(start, end)))
        # encoded-key order (the sort above is Arrow's: the same for str and int
        # keys, but not for every type mix)
        groups.sort(key=lambda g: g[1])
        return groups, dropped

    def output(self, outputs: list[Any]) -> pa.Table:
        """What the handlers yielded, as one Arrow table of the output schema."""
        schema = arrow_schema(self.out_schema_json)
        if self.api == "pandas":
            return frames_output(outputs, schema, self.pandas)
        return rows_output(outputs, schema)


def _stored_watermark(store: Any) -> int:
    """The watermark the previous batch recorded (0 before any)."""
    raw = store.read_aux(WATERMARK_AUX)
    return 0 if raw is None else INT64.unpack(raw)[0]


def _check_not_late(out: pa.Table, column: str, watermark: int) -> None:
    """Spark's check on an output that carries event time: no row older than the
    watermark for late rows (``EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED``)."""
    if not out.num_rows or watermark <= 0:
        return
    ms, valid = epoch_millis_array(out.column(column))
    if valid.any() and int(ms[valid].min()) < watermark:
        from sessionstore.errors import StatefulProcessorError

        raise StatefulProcessorError(
            "EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED",
            f"Previous node emitted a row with eventTime={int(ms[valid].min())} ms, "
            f"which is older than current_watermark_value={watermark} ms (column "
            f"{column!r} of the processor's output).",
        )


def _empty_partition_now(store: Any, provider: Any, info: Any) -> int:
    """Processing time of a partition without rows: the wall clock, unless the
    batch was committed here before, when the time that commit recorded.

    The first attempt of a batch in the run that committed the loaded state (the
    run id the state carries) is not a replay: no request. Otherwise (a retried
    task, the first batch of a restarted query) one ranged read of the header of
    the changelog this task is about to write: present only when an earlier
    attempt committed the batch, and then its time is the one the sink may have
    kept. Tasks with rows need none of this: their time is in their input."""
    from sessionstore.checkpoint.records.processing_time import recorded_processing_time

    run = store.read_aux(RUN_AUX)
    if info.attempt == 0 and info.run is not None and run == info.run.encode():
        return int(time.time() * 1000)
    recorded = recorded_processing_time(provider.operator_storage, info.batch_id, info.partition)
    return int(time.time() * 1000) if recorded is None else recorded
