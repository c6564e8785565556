"""``transform_with_state`` and ``transform_with_state_in_pandas``: PySpark
``StatefulProcessor`` classes, unchanged, with their state in sessionstore.

The input is hash-partitioned by the grouping key and each partition runs the
processor in ``mapInArrow`` through
:class:`~sessionstore.operators.processors.ProcessorRunner`: state lives in the
partition's RocksDB (store kind ``processor``), with the versions, changelogs,
snapshots and exactly-once of every other operator, and a state call is a dict
look-up in the Python worker instead of a round trip to the JVM.

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

Timers fire in every partition, with or without rows. Unlike Spark, which runs
extra no-data batches for a stateful operator, timers fire at the next
micro-batch the query runs.
"""

from __future__ import annotations

import functools
import io
import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.checkpoint.filesystem import Storage, open_filesystem
from sessionstore.checkpoint.layout import (
    INITIAL_STATE_DIR,
    initial_state_complete_name,
    initial_state_name,
    initial_state_tokens,
    newest_committed,
)
from sessionstore.encoding.ints import INT64
from sessionstore.operators.arrow_io import epoch_millis_array
from sessionstore.operators.processors import (
    BatchTimes,
    ProcessorHandle,
    ProcessorRunner,
    extra_store_name,
    normalise_time_mode,
)
from sessionstore.stores.spec import StoreSpec
from spark_integration.driver.coordinator import CoordinatorAddress
from spark_integration.execution.output import arrow_schema
from spark_integration.execution.runtime import deterministic_order, state_and_inputs, task_info
from spark_integration.planning.backend import StateBackend
from spark_integration.planning.placement import state_map
from spark_integration.planning.resolve import (
    TS,
    WATERMARK_DELAY_KEY,
    checked_fields,
    key_types,
    operator_coordinator,
    resolve,
)

__all__ = ["transform_with_state", "transform_with_state_in_pandas", "parse_schema"]

#: The batch's processing time, in ms (``current_timestamp()`` in the input).
NOW = "__ss_now"
#: The processor store of every transform_with_state operator.
STORE = "processor"
_WATERMARK_AUX = "watermark"
#: The query run that committed the state (time modes only): a task of the same run
#: loading it cannot be a replay of a batch whose output a sink kept.
_RUN_AUX = "run"
#: The partition of each routed initial-state row (:func:`_route_initial_state`).
_PID = "__ss_pid"
#: A partition that committed this version ran batch 1: batch 0 never runs again
#: (:func:`_initial_state_token`).
_PAST_BATCH_0 = 2


def transform_with_state_in_pandas(
    df: Any,
    key: str | Sequence[str],
    processor: Any,
    output_schema: Any,
    time_mode: str = "None",
    backend: StateBackend | None = None,
    name: str = "transform_with_state",
    num_partitions: int | None = None,
    initial_state: Any = None,
    event_time_column: str | None = None,
) -> Any:
    """Run a ``StatefulProcessor`` written for ``transformWithStateInPandas``:
    ``handleInputRows(key, rows, timerValues)`` gets an iterator of pandas
    DataFrames (the key's rows, every input column) and yields pandas DataFrames
    of ``output_schema`` (a ``StructType`` or DDL string). ``key`` names the
    grouping column(s); the key a handler gets is a tuple of their values.
    ``initial_state`` is a DataFrame with the same key columns, given to
    ``handleInitialState`` in the first micro-batch. ``event_time_column`` (Spark's
    ``eventTimeColumnName``) names a timestamp column of the output that carries
    event time on, so that a stateful operator can follow (see docs/operators.md).

    As in Spark, a key's rows come in DataFrames of at most
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows and about
    ``spark.sql.execution.arrow.maxBytesPerBatch`` bytes, timestamps are naive
    ``datetime64[ns]`` in the session time zone, and with
    ``spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled`` an integer
    column returned for a decimal field is coerced."""
    return _transform(
        df, key, processor, output_schema, time_mode, backend, name, num_partitions,
        initial_state, "pandas", event_time_column,
    )  # fmt: skip


def transform_with_state(
    df: Any,
    key: str | Sequence[str],
    processor: Any,
    output_schema: Any,
    time_mode: str = "None",
    backend: StateBackend | None = None,
    name: str = "transform_with_state",
    num_partitions: int | None = None,
    initial_state: Any = None,
    event_time_column: str | None = None,
) -> Any:
    """Run a ``StatefulProcessor`` written for PySpark's row-based
    ``transformWithState``: rows are ``Row`` objects in and out. Parameters as in
    :func:`transform_with_state_in_pandas`."""
    return _transform(
        df, key, processor, output_schema, time_mode, backend, name, num_partitions,
        initial_state, "rows", event_time_column,
    )  # fmt: skip


def parse_schema(schema: Any) -> Any:
    """A ``StructType`` for a ``StructType`` or DDL string; PySpark's
    ``PySparkRuntimeError`` ("Error parsing string schema") for a bad one."""
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql.types import DataType, StructType

    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        from pyspark.sql.types import _parse_datatype_string

        try:
            parsed = _parse_datatype_string(schema)
        except Exception as e:  # ParseException and friends
            # the parser's first line names the problem (then it draws the SQL)
            reason = next((line for line in str(e).splitlines() if line.strip()), str(e))
            raise PySparkRuntimeError(
                f"Error parsing string schema: {reason.strip()} (schema {schema!r})"
            ) from None
        if not isinstance(parsed, StructType):
            raise PySparkRuntimeError(
                f"Error parsing string schema: {schema!r} is not a struct type"
            )
        return parsed
    if isinstance(schema, DataType):
        raise PySparkRuntimeError(f"Error parsing string schema: {schema!r} is not a StructType")
    raise PySparkRuntimeError(
        f"Error parsing string schema: a schema is a StructType or DDL string, "
        f"got {type(schema).__name__} {schema!r}"
    )


def _transform(
    df: Any,
    key: str | Sequence[str],
    processor: Any,
    output_schema: Any,
    time_mode: str,
    backend: StateBackend | None,
    name: str,
    num_partitions: int | None,
    initial_state: Any,
    api: str,
    event_time_column: str | None = None,
) -> Any:
    from pyspark import cloudpickle
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import functions as F

    keys = [key] if isinstance(key, str) else list(key)
    if not keys:
        raise ValueError("key names no grouping column")
    fields = checked_fields(df, keys)
    out_schema = parse_schema(output_schema)
    mode = normalise_time_mode(time_mode)
    for method in ("init", "handleInputRows"):
        if not callable(getattr(processor, method, None)):
            raise TypeError(f"processor {processor!r} has no {method}() method")

    # init on a copy, as Spark's driver does before the query runs: it checks the
    # schemas and names, and tells which extra stores the partitions need
    driver_copy = cloudpickle.loads(cloudpickle.dumps(processor))
    planning = ProcessorHandle(
        None, mode, parse_schema=parse_schema, key_arity=len(keys),
        runtime_error=PySparkRuntimeError,
    )  # fmt: skip
    driver_copy.init(planning)
    close = getattr(driver_copy, "close", None)
    if close is not None:
        close()

    columns = [F.col(c) for c in df.columns]
    delay = None
    marked = [
        (f.name, int(f.metadata[WATERMARK_DELAY_KEY]))
        for f in df.schema.fields
        if WATERMARK_DELAY_KEY in (f.metadata or {})
    ]
    if event_time_column is not None:
        _check_event_time_column(event_time_column, out_schema, marked)
    if mode == "EventTime":
        if not marked:
            raise ValueError(
                "time_mode='EventTime' needs an input with a watermark: call "
                "df.withWatermark(<event time column>, <delay>) first"
            )
        ts_column, delay = marked[0]
        ts_type = fields.get(ts_column) or df.schema[ts_column]
        millis = (
            F.col(ts_column).cast("long")
            if ts_type.dataType.typeName() in ("long", "integer")
            else F.unix_millis(F.col(ts_column).cast("timestamp"))
        )
        columns.append(millis.alias(TS))
    if mode != "None":
        columns.append(F.unix_millis(F.current_timestamp()).alias(NOW))
    backend, n = resolve(df, backend, num_partitions, name)
    coordinator = operator_coordinator(df, backend, name, n)
    initial = None
    if initial_state is not None:
        checked_fields(initial_state, keys, "the initial state")
        operator = open_filesystem(backend.checkpoint_uri, backend.storage_options).child(name)
        initial = _initial_state_token(
            operator, n, lambda: _route_initial_state(initial_state, df, keys, n)
        )
    task = _ProcessorTask(
        backend=backend,
        name=name,
        num_partitions=n,
        keys=keys,
        input_columns=list(df.columns),
        processor=processor,
        api=api,
        time_mode=mode,
        delay_ms=delay,
        out_schema_json=out_schema.json(),
        extra_stores=dict(planning.extra_stores),
        schemas=dict(planning.schemas),
        initial=initial,
        key_types=key_types(df, keys),
        coordinator=coordinator,
        pandas=_pandas_conf(df.sparkSession) if api == "pandas" else None,
        map_key_fields=dict(planning.map_key_fields),
        event_time_column=event_time_column,
    )
    out = state_map(df.select(*columns), keys, n, task, out_schema, name)
    if event_time_column is None:
        return out
    # Spark's UpdateEventTimeWatermarkColumn: the column carries the input's
    # watermark delay in its metadata, and the query's watermark (the input's
    # withWatermark) drives the stateful operators that follow
    metadata = {WATERMARK_DELAY_KEY: marked[0][1]}
    return out.select(
        *[
            F.col(c).alias(c, metadata=metadata) if c == event_time_column else F.col(c)
            for c in out.columns
        ]
    )


def _check_event_time_column(column: str, out_schema: Any, marked: list) -> None:
    """Spark's conditions on ``eventTimeColumnName``: a timestamp column of the
    output, and a watermark on the input to carry on."""
    from pyspark.sql.types import TimestampType

    if column not in out_schema.names:
        raise ValueError(
            f"event_time_column {column!r} is not a column of the output schema "
            f"(it has {out_schema.names})"
        )
    if not isinstance(out_schema[column].dataType, TimestampType):
        raise ValueError(
            f"event_time_column {column!r} must be a timestamp column of the output, "
            f"got {out_schema[column].dataType.simpleString()}"
        )
    if not marked:
        raise ValueError(
            f"event_time_column {column!r} carries the input's watermark on, and the "
            "input has none: call df.withWatermark(<event time column>, <delay>) first"
        )


#: Spark's default of ``spark.sql.execution.arrow.maxRecordsPerBatch``.
_MAX_RECORDS = 10_000
#: The Python worker's "no limit" on bytes per Arrow batch.
_NO_BYTE_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class PandasConf:
    """What a pandas processor's input and output depend on in Spark's conf, read
    on the driver: the session time zone (timestamps), the rows and bytes of a
    key's DataFrames, and the int-to-decimal coercion of outputs."""

    timezone: str | None = None
    max_records: int = _MAX_RECORDS
    max_bytes: int = _NO_BYTE_LIMIT
    int_to_decimal: bool = False

    def chunk_rows(self, table: pa.Table) -> int:
        """Rows per DataFrame of a key, as Spark's worker chunks them: at most
        ``max_records``, and a chunk ends once its rows times the batch's average
        Arrow row size reach ``max_bytes``."""
        rows = self.max_records if self.max_records > 0 else _NO_BYTE_LIMIT
        if self.max_bytes != _NO_BYTE_LIMIT and table.num_rows:
            average = table.nbytes / table.num_rows
            if average > 0:
                rows = min(rows, max(1, math.ceil(self.max_bytes / average)))
        return rows


def _pandas_conf(spark: Any) -> PandasConf:
    def get(key: str) -> str | None:
        value = spark.conf.get(key, None)
        return None if value is None or value == "" else value

    # the keys Spark 4.3's Python worker chunks by (its jar also names
    # ...arrow.transformWithStateInPandas.maxRecordsPerBatch, which changes nothing)
    records = get("spark.sql.execution.arrow.maxRecordsPerBatch")
    max_bytes = get("spark.sql.execution.arrow.maxBytesPerBatch")
    coercion = get("spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled")
    return PandasConf(
        timezone=get("spark.sql.session.timeZone"),
        max_records=_MAX_RECORDS if records is None else int(records),
        max_bytes=_NO_BYTE_LIMIT if max_bytes is None else _byte_size(max_bytes),
        int_to_decimal=(coercion or "").lower() == "true",
    )


_BYTE_UNITS = {"b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}


def _byte_size(value: str) -> int:
    """A Spark byte-size conf value (``67108864b``, ``64m``, ``1024``) in bytes."""
    text = value.strip().lower()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits) :] or "b"
    if not digits.isdigit() or unit not in _BYTE_UNITS:
        raise ValueError(f"not a byte size: {value!r} (e.g. 67108864b, 64m, 1g)")
    return min(int(digits) * _BYTE_UNITS[unit], _NO_BYTE_LIMIT)


def _initial_state_token(
    operator: Storage, num_partitions: int, route: Callable[[], pa.Table]
) -> str | None:
    """The token of the initial state's copy in the checkpoint
    (``initial_state/<token>/<partition>``) that the tasks of batch 0 read, or None
    when batch 0 can no longer run. ``route()`` is the Spark job that routes the
    rows to partitions (:func:`_route_initial_state`), run only when a copy is
    written.

    A task reads the copy when it loads version 0, i.e. in batch 0: its first
    attempt, a retry, or a replay by a restarted query. Spark replays a batch its
    commit log lacks (the driver died after the tasks, a ``foreachBatch`` sink
    failed), even when every partition committed version 1. So, by the newest
    version any partition committed (:func:`newest_committed`):

    * 2 or more: a partition ran batch 1, which Spark starts only once batch 0 is
      in its commit log, so batch 0 never runs again: a copy left is deleted, no
      job runs (Spark ignores the initial state of a query restarted with state).
      Deleting it sooner, in a task of batch 1, would race with an attempt of
      batch 0 still running (a speculative copy) and cost every partition a
      request, for one copy of the initial state kept until the next planning;
    * 1: batch 0 committed in some partitions, maybe not all: the copy it ran with
      is reused as is (no job, no writes), so a partition that has not committed
      batch 0, or a replay, finds the rows its peers saw. Only a whole copy (its
      ``complete`` object written) counts; without one a copy is written as for 0;
    * 0: a new copy replaces any earlier one, as the initial state the query is
      started with is the one its first batch takes.
    """
    newest = newest_committed(operator, num_partitions, enough=_PAST_BATCH_0)
    if newest >= _PAST_BATCH_0:
        if operator.list_files(INITIAL_STATE_DIR):
            operator.delete_dir(INITIAL_STATE_DIR)
        return None
    if newest >= 1:
        tokens = initial_state_tokens(operator)
        if len(tokens) == 1:  # a planning replaces the whole folder: never more than one
            return tokens[0]
    return _write_initial_state(operator, route())


def _route_initial_state(initial_state: Any, df: Any, keys: list[str], n: int) -> pa.Table:
    """The initial state's rows as one Arrow table, each row's partition in column
    :data:`_PID` (one Spark job).

    Rows are routed by Spark's own ``repartition(n, *keys)`` on the stream's key
    types, so every key lands in the partition its stream rows go to."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in df.schema.fields}
    cast = initial_state.select(
        *[
            F.col(c).cast(types[c]).alias(c) if c in keys else F.col(c)
            for c in initial_state.columns
        ]
    )
    return cast.repartition(n, *keys).withColumn(_PID, F.spark_partition_id()).toArrow()


def _write_initial_state(operator: Storage, routed: pa.Table) -> str:
    """Write the rows of each partition of ``routed`` (:func:`_route_initial_state`)
    to ``initial_state/<token>/<partition>`` (Arrow IPC) under the operator, then
    the copy's ``complete`` object, and return the new token.

    Each task of the first batch reads its own partition's rows (one read); the
    tasks' closure carries only the token, where it carried every partition's rows
    to every task of every batch. The copy of an earlier planning is deleted."""
    pids = routed.column(_PID)
    table = routed.drop_columns([_PID])
    operator.delete_dir(INITIAL_STATE_DIR)
    token = uuid.uuid4().hex

    def write(pid: int) -> None:
        part = table.filter(pc.equal(pids, pid))
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part)
        operator.write_atomic(initial_state_name(token, pid), sink.getvalue())

    partitions = pc.unique(pids).to_pylist()  # only partitions with rows get an object
    with ThreadPoolExecutor(min(16, max(1, len(partitions)))) as pool:
        list(pool.map(write, partitions))  # I/O bound: pyarrow releases the GIL
    # last: a later planning reuses only a whole copy (_initial_state_token)
    operator.write_atomic(initial_state_complete_name(token), b"")
    return token


@dataclass
class _ProcessorTask:
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
    #: the token of the initial state in the checkpoint (``_initial_state_token``)
    initial: str | None = None
    key_types: list[str] | None = None
    coordinator: CoordinatorAddress | None = None
    #: the pandas API's Spark conf (None for the row API)
    pandas: PandasConf | None = None
    event_time_column: str | None = None
    #: the user-key fields of each map state, as the driver parsed its schema
    map_key_fields: dict[str, int] = field(default_factory=dict)
    #: each state variable's schemas in Spark's JSON form, parsed on the driver
    #: (executors cannot parse DDL): what the stored values are encoded from
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        info = task_info()
        specs = [StoreSpec(STORE, "processor", 0)] + [
            StoreSpec(extra_store_name(var), kind, retention)
            for var, (kind, retention) in self.extra_stores.items()
        ]
        event_time = self.time_mode == "EventTime"
        with state_and_inputs(
            self.backend, self.name, info, specs, self.num_partitions, batches,
            shared_event_time=event_time, key_types=self.key_types,
            coordinator=self.coordinator,
        ) as (handle, provider, inputs, shared):  # fmt: skip
            store = handle[STORE]
            table = pa.Table.from_batches(inputs) if inputs else None
            times, late, max_event_time = self._times(table, shared, store, provider, info)
            late_watermark = self._late_watermark(store) if event_time else 0
            if table is not None and late is not None:
                table = table.filter(pc.invert(late))
            from pyspark.errors import PySparkRuntimeError

            handle_ = ProcessorHandle(
                store,
                self.time_mode,
                open_store=lambda kind, store_name, retention: handle[store_name],
                key_arity=len(self.keys),
                runtime_error=PySparkRuntimeError,
                map_key_fields=self.map_key_fields,
                schemas=self.schemas,
                make_struct=_row_maker,
            )
            runner = ProcessorRunner(self.processor, handle_, self.time_mode)
            groups, dropped = self._groups(store, table)
            initial = self._initial(handle.version, provider, info.partition)
            counts = runner.run_batch(groups, times, initial)
            if self.time_mode != "None":
                handle.note_processing_time(times.processing_ms)  # (processing_time.py)
                if info.run is not None:
                    store.write_aux(_RUN_AUX, info.run.encode())
            if event_time:
                handle.note_event_time(max_event_time)  # the durable record (event_time.py)
                store.write_aux(_WATERMARK_AUX, INT64.pack(times.watermark_ms))
            out = self._output(counts.outputs)
            if self.event_time_column is not None and event_time:
                _check_not_late(out, self.event_time_column, late_watermark)
            late_count = 0 if late is None else pc.sum(late).as_py() or 0
            handle.note(late_dropped=late_count + dropped, emitted=out.num_rows)
        if out.num_rows:
            yield from out.to_batches()

    # ---------------------------------------------------------------- times
    def _times(
        self, table: pa.Table | None, shared: int | None, store: Any, provider: Any, info: Any
    ) -> tuple[BatchTimes, Any, int | None]:
        """The batch's times, the late-row mask (event time) and this partition's
        event time after the batch."""
        if self.time_mode == "None":
            return BatchTimes(), None, None
        if table is not None:
            now = pc.max(table.column(NOW)).as_py()
        else:
            now = _empty_partition_now(store, provider, info)
        if self.time_mode != "EventTime":
            return BatchTimes(now, -1), None, None
        watermark = 0 if shared is None else max(0, shared - self.delay_ms)
        previous = self._late_watermark(store)
        late = None
        event_time = shared
        if table is not None:
            ms, valid = epoch_millis_array(table.column(TS))
            late = pa.array((ms <= previous) | ~valid) if previous > 0 else pa.array(~valid)
            if valid.any():
                top = int(ms[valid].max())
                event_time = top if event_time is None else max(event_time, top)
        return BatchTimes(now, watermark), late, event_time

    @staticmethod
    def _late_watermark(store: Any) -> int:
        """The watermark for late rows: the previous batch's (0 before any)."""
        raw = store.read_aux(_WATERMARK_AUX)
        return 0 if raw is None else INT64.unpack(raw)[0]

    # ---------------------------------------------------------------- input
    def _groups(self, store: Any, table: pa.Table | None) -> tuple[list, int]:
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
        table = deterministic_order(table, self.keys)
        bounds = _key_runs(table, self.keys)
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
            frame = _spark_pandas(data, conf.timezone)
            make = _pandas_slices(frame, conf.chunk_rows(data))
        else:
            make = _row_slices(data)
        groups = []
        for stored, (start, end) in zip(key_list, bounds, strict=True):
            key = (stored,) if single else stored
            groups.append((key, encode(stored), make(start, end)))
        # encoded-key order (the sort above is Arrow's: the same for str and int
        # keys, but not for every type mix)
        groups.sort(key=lambda g: g[1])
        return groups, dropped

    def _initial(
        self, version: int, provider: Any, partition: int
    ) -> dict[tuple, list[Any]] | None:
        """The partition's initial state by key, in the query's first batch only
        (one read of what the planning wrote)."""
        if self.initial is None or version != 0:
            return None
        try:
            raw = provider.operator_storage.read(initial_state_name(self.initial, partition))
        except FileNotFoundError:  # no initial rows for this partition
            return None
        table = pa.ipc.open_stream(raw).read_all()
        table = deterministic_order(table, self.keys)
        key_cols = [table.column(k).to_pylist() for k in self.keys]
        key_list = list(zip(*key_cols, strict=True))
        out: dict[tuple, list[Any]] = {}
        if self.api == "pandas":
            frame = _spark_pandas(table, (self.pandas or PandasConf()).timezone)
            for start, end in _group_bounds(key_list):
                out[key_list[start]] = [_reindexed(frame.iloc[start:end])]
        else:
            make = _row_maker(table.column_names)
            rows = list(zip(*[c.to_pylist() for c in table.columns], strict=True))
            for start, end in _group_bounds(key_list):
                out[key_list[start]] = [make(r) for r in rows[start:end]]
        return out

    # ---------------------------------------------------------------- output
    def _output(self, outputs: list[Any]) -> pa.Table:
        schema = arrow_schema(self.out_schema_json)
        if not outputs:
            return schema.empty_table()
        if self.api == "pandas":
            import pandas as pd

            frames = [f for f in outputs if len(f)]
            if not frames:
                return schema.empty_table()
            for f in frames:
                if not isinstance(f, pd.DataFrame):
                    from pyspark.errors import PySparkValueError

                    raise PySparkValueError(
                        "Invalid return type. Please make sure that the UDF returns a "
                        "pandas.DataFrame when the specified return type is StructType."
                    )
            if self.pandas is not None and self.pandas.int_to_decimal:
                frames = [_ints_as_decimals(f, schema) for f in frames]
            for f in frames:
                missing = [n for n in schema.names if n not in f.columns]
                if missing:
                    raise ValueError(
                        f"a DataFrame the processor returned has no column {missing[0]!r} of "
                        f"the output schema (it has {list(f.columns)})"
                    )
            timezone = None if self.pandas is None else self.pandas.timezone
            # datetime columns are not numpy arrays: they take the pandas path
            table = _concat_columns(frames, schema)
            if table is not None:
                return table
            frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
            frame = _localized(frame[schema.names], schema, timezone)
            return pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
        names = schema.names
        tuples = []
        for row in outputs:
            fields = getattr(row, "__fields__", None)
            if fields is None or fields == names:  # by position: a plain tuple, or in order
                tuples.append(row)
            else:  # Spark reads a Row by field name
                d = row.asDict(True)
                tuples.append(tuple(d.get(n) for n in names))
        columns = [list(c) for c in zip(*tuples, strict=True)] or [[] for _ in names]
        return pa.Table.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
        )

    #: A batch's input as the processor gets it, and its output as the task yields it:
    #: shared with :class:`spark_integration.testing.ProcessorTester` (one code path).
    groups = _groups
    output = _output


#: The task each partition runs (``mapInArrow``); ProcessorTester runs its steps.
ProcessorTask = _ProcessorTask


def _group_bounds(keys: list[Any]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal keys in a sorted list."""
    bounds = []
    start = 0
    for i in range(1, len(keys)):
        if keys[i] != keys[i - 1]:
            bounds.append((start, i))
            start = i
    if keys:
        bounds.append((start, len(keys)))
    return bounds


def _key_runs(table: pa.Table, keys: list[str]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal keys in ``table``, sorted by ``keys``
    (which hold no nulls), found by Arrow over whole columns: no Python value per
    row. Columns Arrow cannot compare go through :func:`_group_bounds`."""
    n = table.num_rows
    if n == 0:
        return []
    changed = np.zeros(n - 1, dtype=bool)
    try:
        for k in keys:
            column = table.column(k)
            differs = pc.not_equal(column.slice(1), column.slice(0, n - 1))
            changed |= differs.to_numpy(zero_copy_only=False)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError):
        cols = [table.column(k).to_pylist() for k in keys]
        return _group_bounds(cols[0] if len(keys) == 1 else list(zip(*cols, strict=True)))
    starts = [0, *(np.flatnonzero(changed) + 1).tolist()]
    return list(zip(starts, [*starts[1:], n], strict=True))


def _concat_columns(frames: list[Any], schema: pa.Schema) -> pa.Table | None:
    """The frames' rows as one table of ``schema``, column by column: each frame's
    column arrays joined with numpy, several times faster than ``pd.concat`` over
    thousands of one-row frames (one per key). None when a column is not a plain
    numpy array (extension dtypes, datetimes), and the caller concatenates with
    pandas."""
    import numpy as np

    columns = []
    try:
        for f in schema:
            parts = [frame._get_column_array(frame.columns.get_loc(f.name)) for frame in frames]
            if not all(type(p) is np.ndarray for p in parts):
                return None
            values = np.concatenate(parts) if len(parts) > 1 else parts[0]
            columns.append(pa.array(values, type=f.type, from_pandas=True))
    except (AttributeError, TypeError, ValueError, pa.ArrowException):
        return None
    return pa.Table.from_arrays(columns, schema=schema)


def _zoned(arrow_type: pa.DataType) -> bool:
    return pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None


def _localized(frame: Any, schema: pa.Schema, timezone: str | None) -> Any:
    """``frame`` with naive datetime columns for zoned timestamp fields read as the
    wall clock of ``timezone`` (Spark's reading, an ambiguous hour as standard
    time as Spark takes it; Arrow's would be UTC)."""
    if timezone is None:
        return frame
    changed = {
        f.name: frame[f.name].dt.tz_localize(timezone, ambiguous=False)
        for f in schema
        if _zoned(f.type)
        and frame[f.name].dtype.kind == "M"
        and getattr(frame[f.name].dtype, "tz", None) is None
    }
    return frame.assign(**changed) if changed else frame


def _reindexed(frame: Any) -> Any:
    """A slice of the batch's frame indexed 0..n-1, as Spark builds each key's frame
    (a new index on a view: no copy)."""
    import pandas as pd

    frame.index = pd.RangeIndex(len(frame))
    return frame


def _pandas_slices(frame: Any, chunk: int) -> Any:
    def make(start: int, end: int) -> Any:
        # a slice keeps the batch frame's row labels: re-indexing each key's slice
        # cost more than the slice itself (measured in BENCHMARKS.md)
        if end - start <= chunk:
            return lambda: iter([frame.iloc[start:end]])
        # a hot key's rows in Spark's chunks, each sliced as the processor asks
        return lambda: (frame.iloc[s : min(s + chunk, end)] for s in range(start, end, chunk))

    return make


def _spark_pandas(table: pa.Table, timezone: str | None) -> Any:
    """``table`` as the pandas DataFrame Spark's worker makes of it: timestamps as
    timezone-naive ``datetime64[ns]``, the wall clock of the session time zone
    (Arrow converts them, once per batch; other columns as ``to_pandas`` gives)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_timestamp(f.type) and (f.type.tz is not None or f.type.unit != "ns"):
            column = table.column(i)
            if f.type.tz is not None:
                zone = timezone or f.type.tz
                column = pc.local_timestamp(column.cast(pa.timestamp(f.type.unit, tz=zone)))
            table = table.set_column(i, f.name, column.cast(pa.timestamp("ns")))
    return table.to_pandas()


def _ints_as_decimals(frame: Any, schema: pa.Schema) -> Any:
    """``frame`` with its integer columns for decimal fields as ``Decimal`` values
    (Spark's ``intToDecimalCoercionEnabled``); other frames as they are."""
    from decimal import Decimal

    import pandas as pd

    changed = {
        f.name: frame[f.name].apply(lambda x: None if pd.isna(x) else Decimal(int(x)))
        for f in schema
        if pa.types.is_decimal(f.type)
        and f.name in frame.columns
        and pd.api.types.is_integer_dtype(frame[f.name])
    }
    return frame.assign(**changed) if changed else frame


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


@functools.lru_cache(maxsize=64)
def _row_class(names: tuple[str, ...]) -> type:
    """A subclass of PySpark's ``Row`` with fields ``names``: the field names live
    on the class and each field is a descriptor that reads item i (namedtuple's C
    one, or a property), so a row is made by
    ``tuple.__new__`` and read by attribute without ``Row``'s per-call work (its
    ``Row(*names)(*values)`` builds every row through Python code, and its
    ``row.name`` searches the field list). Everything else is ``Row``'s own:
    ``isinstance(row, Row)``, ``asDict``, ``row["name"]``, repr, equality with
    tuples, pickling (as a plain ``Row``). A name that is an attribute of ``Row``
    (``count``, ``index``) stays that attribute, as with ``Row``."""
    from pyspark.sql import Row

    try:  # namedtuple's field descriptor: a C-level read of item i, no Python frame
        from _collections import _tuplegetter

        def field(i: int) -> Any:
            return _tuplegetter(i, None)
    except ImportError:  # not CPython
        get = tuple.__getitem__  # not Row's __getitem__, which is Python code

        def field(i: int) -> Any:
            return property(lambda row: get(row, i))

    attrs: dict[str, Any] = {"__fields__": list(names), "__module__": __name__}
    for i, name in enumerate(names):
        if not name.startswith("__") and not hasattr(Row, name) and names.index(name) == i:
            attrs[name] = field(i)
    return type("Row", (Row,), attrs)


def _row_maker(names: Sequence[str]) -> Callable[[tuple], Any]:
    """``make(values)``: a PySpark ``Row`` of the fields ``names`` holding the
    tuple ``values`` (see :func:`_row_class`; one class per set of names)."""
    return functools.partial(tuple.__new__, _row_class(tuple(names)))


def _row_slices(data: pa.Table) -> Any:
    make_row = _row_maker(data.column_names)
    columns = [c.to_pylist() for c in data.columns]

    def make(start: int, end: int) -> Any:
        # rows made from the columns as the key is read: zip's tuple is reused
        # once each Row has copied it, so a row costs one object, not two
        return lambda: map(make_row, zip(*[c[start:end] for c in columns], strict=True))

    return make


def _empty_partition_now(store: Any, provider: Any, info: Any) -> int:
    """Processing time of a partition without rows: the wall clock, unless the
    batch was committed here before, when the time that commit recorded.

    The first attempt of a batch in the run that committed the loaded state (the
    run id the state carries) is not a replay: no request. Otherwise (a retried
    task, the first batch of a restarted query) one ranged read of the header of
    the changelog this task is about to write: present only when an earlier
    attempt committed the batch, and then its time is the one the sink may have
    kept. Tasks with rows need none of this: their time is in their input."""
    from sessionstore.checkpoint.processing_time import recorded_processing_time

    run = store.read_aux(_RUN_AUX)
    if info.attempt == 0 and info.run is not None and run == info.run.encode():
        return int(time.time() * 1000)
    recorded = recorded_processing_time(provider.operator_storage, info.batch_id, info.partition)
    return int(time.time() * 1000) if recorded is None else recorded
