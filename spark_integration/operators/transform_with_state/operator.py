"""The operator: ``transform_with_state`` (row API) and
``transform_with_state_in_pandas`` (pandas API), planned on the driver.

Planning checks the processor and the schemas (the processor's ``init`` runs on
a copy, as Spark's driver does: :func:`plan_processor`), adds the times the task
needs to the input (the batch's processing time, the event time in ms), plans
the initial state, and hands the partitions a
:class:`~spark_integration.operators.transform_with_state.task.ProcessorTask`
through :func:`~spark_integration.planning.placement.state_map`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.operators.processors import ProcessorHandle, normalise_time_mode
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.names import TS
from spark_integration.operators.transform_with_state.frames import pandas_conf
from spark_integration.operators.transform_with_state.initial_state import (
    initial_state_token,
    route_initial_state,
)
from spark_integration.operators.transform_with_state.task import NOW, ProcessorTask
from spark_integration.planning.due_batches import with_due_batches
from spark_integration.planning.due_timers import DueTimers
from spark_integration.planning.input_columns import WATERMARK_DELAY_KEY, checked_fields, key_types
from spark_integration.planning.operator_conf import operator_conf
from spark_integration.planning.placement import state_map

__all__ = [
    "transform_with_state",
    "transform_with_state_in_pandas",
    "parse_schema",
    "plan_processor",
]


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


def plan_processor(
    processor: Any, time_mode: str, key_arity: int, parse: Callable[[Any], Any]
) -> ProcessorHandle:
    """The handle of the processor's ``init`` run on a copy (then ``close``), as
    Spark's driver runs it before the query: it checks the schemas (``parse``
    turns each into a ``StructType``, raising for a bad one) and the names, and
    tells which variables (:attr:`ProcessorHandle.schemas`) and extra stores
    (:attr:`ProcessorHandle.extra_stores`) the partitions' tasks declare."""
    from pyspark import cloudpickle
    from pyspark.errors import PySparkRuntimeError

    for method in ("init", "handleInputRows"):
        if not callable(getattr(processor, method, None)):
            raise TypeError(f"processor {processor!r} has no {method}() method")
    copy = cloudpickle.loads(cloudpickle.dumps(processor))
    planning = ProcessorHandle(
        None, time_mode, parse_schema=parse, key_arity=key_arity,
        runtime_error=PySparkRuntimeError,
    )  # fmt: skip
    copy.init(planning)
    close = getattr(copy, "close", None)
    if close is not None:
        close()
    return planning


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
    keys = [key] if isinstance(key, str) else list(key)
    if not keys:
        raise ValueError("key names no grouping column")
    fields = checked_fields(df, [], keys=keys)
    out_schema = parse_schema(output_schema)
    mode = normalise_time_mode(time_mode)
    planning = plan_processor(processor, mode, len(keys), parse_schema)
    marked = [
        (f.name, int(f.metadata[WATERMARK_DELAY_KEY]))
        for f in df.schema.fields
        if WATERMARK_DELAY_KEY in (f.metadata or {})
    ]
    if event_time_column is not None:
        _check_event_time_column(event_time_column, out_schema, marked)
    columns, delay = _task_input(df, mode, fields, marked)
    conf = operator_conf(df, backend, num_partitions, name)
    backend, n = conf.backend, conf.partitions
    initial = None
    if initial_state is not None:
        # present; any type: the rows are cast to the stream's key types when routed
        checked_fields(initial_state, keys, "the initial state")
        operator = open_filesystem(backend.checkpoint_uri, backend.storage_options).child(name)
        initial = initial_state_token(
            operator, n, lambda: route_initial_state(initial_state, df, keys, n)
        )
    task = ProcessorTask(
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
        coordinator=conf.coordinator,
        key_groups=conf.key_groups,
        pandas=pandas_conf(df.sparkSession) if api == "pandas" else None,
        event_time_column=event_time_column,
    )
    selected = df.select(*columns)
    if mode != "None":  # timers and TTL fire on a quiet stream too (due_timers.py)
        selected = with_due_batches(selected, backend, name, n, DueTimers, allowed=conf.due_batches)
    out = state_map(selected, keys, n, task, out_schema, name, conf)
    if event_time_column is None:
        return out
    return _carry_event_time(out, event_time_column, marked[0][1])


def _task_input(
    df: Any, mode: str, fields: dict[str, Any], marked: list[tuple[str, int]]
) -> tuple[list[Any], int | None]:
    """The columns the task reads (the input's, then the event time in ms and the
    batch's processing time as the time mode needs them) and the watermark delay."""
    from pyspark.sql import functions as F

    columns = [F.col(c) for c in df.columns]
    delay = None
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
    return columns, delay


def _carry_event_time(out: Any, column: str, delay_ms: int) -> Any:
    """``out`` with ``column`` marked as event time: Spark's
    UpdateEventTimeWatermarkColumn, the column carries the input's watermark delay
    in its metadata, and the query's watermark (the input's withWatermark) drives
    the stateful operators that follow."""
    from pyspark.sql import functions as F

    metadata = {WATERMARK_DELAY_KEY: delay_ms}
    return out.select(
        *[F.col(c).alias(c, metadata=metadata) if c == column else F.col(c) for c in out.columns]
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
