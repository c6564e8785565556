"""Test a ``StatefulProcessor`` without a Spark job: :class:`ProcessorTester`.

A unit test feeds a processor rows micro-batch by micro-batch, sets the clock and
the watermark itself, and looks at the state variables and timers each key holds,
as Spark 4.3's ``TwsTester`` does for Spark's own operator. It runs the operator's
own code, not a copy: the processor is planned as the driver plans it
(:func:`~spark_integration.operators.transform_with_state.plan_processor`), and
each batch runs through the task that ``transform_with_state`` runs in each
partition (:meth:`ProcessorTask.process
<spark_integration.operators.transform_with_state.ProcessorTask.process>`: the
grouping, the handle from the task's one factory, the runner, the output
conversion), with the initial state converted as the task converts it; the state
lives in a processor store of a real (temporary, local) checkpoint, committed
once per batch. Only the times differ: the test gives them, where a query takes
the batch's timestamp and the watermark of the event times it has seen.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from sessionstore.checkpoint import StateStoreProvider
from sessionstore.operators.processors import BatchTimes, normalise_time_mode
from spark_integration.conf.backend import StateBackend
from spark_integration.datasource import ddl_parts
from spark_integration.execution.output import arrow_schema
from spark_integration.operators.transform_with_state import (
    STORE,
    ProcessorTask,
    parse_schema,
    plan_processor,
)
from spark_integration.operators.transform_with_state.initial_state import initial_items

__all__ = ["ProcessorTester"]


def _ddl_type(text: str) -> Any:
    from pyspark.sql import types as T

    simple = {
        "string": T.StringType, "long": T.LongType, "bigint": T.LongType, "int": T.IntegerType,
        "integer": T.IntegerType, "short": T.ShortType, "smallint": T.ShortType,
        "byte": T.ByteType, "tinyint": T.ByteType, "double": T.DoubleType, "float": T.FloatType,
        "boolean": T.BooleanType, "timestamp": T.TimestampType,
        "timestamp_ntz": T.TimestampNTZType, "date": T.DateType, "binary": T.BinaryType,
    }  # fmt: skip
    low = text.strip().lower()
    if low in simple:
        return simple[low]()
    match = re.fullmatch(r"decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)", low)
    if match:
        return T.DecimalType(int(match.group(1)), int(match.group(2)))
    inner = text.strip()[text.find("<") + 1 : -1] if low.endswith(">") else None
    if inner is not None and low.startswith("array<"):
        return T.ArrayType(_ddl_type(inner))
    if inner is not None and low.startswith("map<"):
        key, value = ddl_parts(inner)
        return T.MapType(_ddl_type(key), _ddl_type(value))
    if inner is not None and low.startswith("struct<"):
        return _ddl(inner, ":")
    raise ValueError(f"unknown type {text.strip()!r}")


def _ddl(text: str, separator: str = " ") -> Any:
    """A ``StructType`` from a DDL string such as ``"id string, n long"``, parsed
    here: no SparkContext needed (the tester runs without one)."""
    from pyspark.sql import types as T

    fields = []
    for part in filter(None, ddl_parts(text)):
        name, _, kind = part.replace(":", " ", 1).partition(" ") if separator == ":" else (
            part.partition(" ")
        )
        if not name or not kind.strip():
            raise ValueError(f"{part!r} is not 'name type'")
        fields.append(T.StructField(name.strip("`"), _ddl_type(kind)))
    if not fields:
        raise ValueError("no field")
    return T.StructType(fields)


def _schema(schema: Any) -> Any:
    """A ``StructType`` for a ``StructType`` or DDL string: parsed here where it can
    be, else by Spark (:func:`parse_schema`, which needs a SparkSession for DDL)."""
    if isinstance(schema, str):
        try:
            return _ddl(schema)
        except ValueError:
            pass
    return parse_schema(schema)


class ProcessorTester:
    """Run ``processor`` (a PySpark ``StatefulProcessor``) on rows without Spark.

    ``output_schema``: a ``StructType`` or DDL string, as for
    :func:`~spark_integration.operators.transform_with_state`; ``time_mode``: ``"None"``,
    ``"ProcessingTime"`` or ``"EventTime"``; ``key``: the grouping column(s);
    ``api``: ``"rows"`` (``transform_with_state``: ``Row``s in and out) or
    ``"pandas"`` (``transform_with_state_in_pandas``); ``input_schema`` (a DDL
    string or ``StructType``) fixes the input's types, else they are inferred
    from the first batch's rows.

    Each :meth:`run` is one micro-batch: every key with rows gets
    ``handleInputRows``, then the timers due before the batch's time fire and
    expired TTL entries go, exactly as in a partition of the streaming query. The
    processor travels pickled, as to Spark's executors, so a processor that keeps
    state in its own attributes instead of its handle fails here as it would
    there. Close the tester (or use it as a context manager) to delete its state.
    """

    def __init__(
        self,
        processor: Any,
        output_schema: Any,
        time_mode: str = "None",
        key: str | Sequence[str] = "key",
        api: str = "rows",
        input_schema: Any = None,
    ) -> None:
        from pyspark import cloudpickle

        if api not in ("rows", "pandas"):
            raise ValueError(f"api must be 'rows' or 'pandas', got {api!r}")
        self.keys = [key] if isinstance(key, str) else list(key)
        if not self.keys:
            raise ValueError("key names no grouping column")
        self.time_mode = normalise_time_mode(time_mode)
        self.api = api
        out_schema = _schema(output_schema)
        self._input_schema = (
            None if input_schema is None else arrow_schema(_schema(input_schema).json())
        )
        self._shipped = cloudpickle.dumps(processor)
        # planned as the operator plans it (init on a copy): the schemas and names
        # checked, the variables' schemas and extra stores the task declares
        planning = plan_processor(processor, self.time_mode, len(self.keys), _schema)
        self._dir = tempfile.mkdtemp(prefix="sessionstore-processor-tester-")
        backend = StateBackend(f"file://{self._dir}/checkpoint", local_dir=f"{self._dir}/db")
        self._task = ProcessorTask(
            backend=backend, name="processor_tester", num_partitions=1, keys=self.keys,
            input_columns=[], processor=None, api=api, time_mode=self.time_mode,
            delay_ms=None, out_schema_json=out_schema.json(),
            extra_stores=dict(planning.extra_stores), schemas=dict(planning.schemas),
        )  # fmt: skip
        self._provider = StateStoreProvider(
            backend.checkpoint_uri, "processor_tester", 0, self._task.store_specs(),
            backend.local_dir,
        )  # fmt: skip
        self.version = 0
        self.processing_time_ms = 0 if self.time_mode != "None" else -1
        self.watermark_ms = 0 if self.time_mode == "EventTime" else -1

    # ----------------------------------------------------------------- times
    def set_processing_time(self, ms: int) -> None:
        """The processing time (epoch ms) of the next batches (ProcessingTime and
        EventTime modes; ``TimerValues.getCurrentProcessingTimeInMs()``)."""
        self._need_mode("set_processing_time", "ProcessingTime", "EventTime")
        self.processing_time_ms = int(ms)

    def advance_processing_time(self, ms: int) -> None:
        """Move the processing time ``ms`` milliseconds on."""
        self.set_processing_time(self.processing_time_ms + int(ms))

    def set_watermark(self, ms: int) -> None:
        """The event-time watermark (epoch ms) of the next batches (EventTime mode):
        event-time timers due before it fire. It never moves back, as in Spark."""
        self._need_mode("set_watermark", "EventTime")
        if ms < self.watermark_ms:
            raise ValueError(f"the watermark moves forward only: {ms} < {self.watermark_ms}")
        self.watermark_ms = int(ms)

    def _need_mode(self, what: str, *modes: str) -> None:
        if self.time_mode not in modes:
            raise ValueError(f"{what} needs time_mode {' or '.join(modes)}, not {self.time_mode}")

    # ------------------------------------------------------------------ runs
    def run(self, rows: Any = (), initial_state: Any = None) -> Any:
        """One micro-batch over ``rows`` (dicts, ``Row``s, a pandas DataFrame or an
        Arrow table; none: only timers and TTL) at the tester's current times;
        ``initial_state`` (same forms, first batch only) goes to
        ``handleInitialState``. Returns the output: ``Row``s of the output schema
        (api ``rows``) or a pandas DataFrame (api ``pandas``)."""
        from pyspark import cloudpickle

        table = self._table(rows)
        initial = None
        if initial_state is not None:
            if self.version != 0:
                raise ValueError("initial_state is taken by the first batch only")
            initial_table = self._table(initial_state)
            if initial_table is not None:
                initial = initial_items(initial_table, self.keys, self.api, None)
        task = dataclasses.replace(
            self._task,
            processor=cloudpickle.loads(self._shipped),  # a fresh copy, as each Spark task's
            input_columns=list(table.column_names) if table is not None else [],
        )
        handle = self._provider.get_store(self.version)
        try:
            times = BatchTimes(self.processing_time_ms, self.watermark_ms)
            out, _, _ = task.process(handle, table, times, initial)
        except BaseException:
            handle.abort()  # the batch leaves nothing, as a failed task
            raise
        self.version = handle.commit()
        if self.api == "pandas":
            return out.to_pandas()
        from pyspark.sql import Row

        return [Row(**row) for row in out.to_pylist()]

    def _table(self, rows: Any) -> pa.Table | None:
        if rows is None:
            return None
        if isinstance(rows, pa.Table):
            table = rows
        elif hasattr(rows, "to_dict") and hasattr(rows, "columns"):  # pandas
            table = pa.Table.from_pandas(rows, preserve_index=False)
        else:
            dicts = [r.asDict() if hasattr(r, "asDict") else dict(r) for r in rows]
            if not dicts:
                return None
            table = pa.Table.from_pylist(dicts, schema=self._input_schema)
        missing = [k for k in self.keys if k not in table.column_names]
        if missing:
            raise ValueError(f"the rows have no key column {missing[0]!r} ({table.column_names})")
        return table

    # ------------------------------------------------------------- inspection
    def _stored(self, key: Any) -> Any:
        key = key if isinstance(key, tuple) else (key,)
        return key[0] if len(self.keys) == 1 else key

    def _rows_of(self, key: Any) -> list[dict[str, Any]]:
        handle = self._provider.get_store(self.version)
        try:
            return list(handle[STORE].read_rows(key=self._stored(key)))
        finally:
            handle.abort()

    def state(self, key: Any) -> dict[str, Any]:
        """The committed state variables of ``key`` (a value, or a tuple for several
        key columns) by name, as ``sessionstore dump`` shows them: a value state as
        ``{"value": [...], "expires_ms": t}``, a list state as a list of those, a
        map state as a list of ``{"key": [...], "value": [...], "expires_ms": t}``."""
        return {r["state"]: r["value"] for r in self._rows_of(key) if r["state"] is not None}

    def timers(self, key: Any) -> list[int]:
        """The registered timers of ``key`` (epoch ms), in time order."""
        for row in self._rows_of(key):
            if row["state"] is None:
                return list(row["value"])
        return []

    def close(self) -> None:
        """Delete the tester's state."""
        self._provider.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> ProcessorTester:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
