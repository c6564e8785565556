"""pandas conversion of ``transform_with_state_in_pandas``: a batch's rows as the
DataFrames Spark's Python worker hands a processor, and the DataFrames a processor
returns as Arrow.

As in Spark's worker: timestamps are timezone-naive ``datetime64[ns]``, the wall
clock of the session time zone; a key's rows come in DataFrames of at most
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows and about
``spark.sql.execution.arrow.maxBytesPerBatch`` bytes; with
``spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled`` an integer
column returned for a decimal field is coerced (:class:`PandasConf`, read on the
driver).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "PandasConf",
    "pandas_conf",
    "byte_size",
    "spark_pandas",
    "pandas_slices",
    "reindexed",
    "frames_output",
    "concat_columns",
    "localized",
    "ints_as_decimals",
]

#: Spark's default of ``spark.sql.execution.arrow.maxRecordsPerBatch``.
MAX_RECORDS = 10_000
#: The Python worker's "no limit" on bytes per Arrow batch.
NO_BYTE_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class PandasConf:
    """What a pandas processor's input and output depend on in Spark's conf, read
    on the driver: the session time zone (timestamps), the rows and bytes of a
    key's DataFrames, and the int-to-decimal coercion of outputs."""

    timezone: str | None = None
    max_records: int = MAX_RECORDS
    max_bytes: int = NO_BYTE_LIMIT
    int_to_decimal: bool = False

    def chunk_rows(self, table: pa.Table) -> int:
        """Rows per DataFrame of a key, as Spark's worker chunks them: at most
        ``max_records``, and a chunk ends once its rows times the batch's average
        Arrow row size reach ``max_bytes``."""
        rows = self.max_records if self.max_records > 0 else NO_BYTE_LIMIT
        if self.max_bytes != NO_BYTE_LIMIT and table.num_rows:
            average = table.nbytes / table.num_rows
            if average > 0:
                rows = min(rows, max(1, math.ceil(self.max_bytes / average)))
        return rows


def pandas_conf(spark: Any) -> PandasConf:
    """The :class:`PandasConf` of ``spark``'s session (read on the driver)."""

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
        max_records=MAX_RECORDS if records is None else int(records),
        max_bytes=NO_BYTE_LIMIT if max_bytes is None else byte_size(max_bytes),
        int_to_decimal=(coercion or "").lower() == "true",
    )


_BYTE_UNITS = {"b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}


def byte_size(value: str) -> int:
    """A Spark byte-size conf value (``67108864b``, ``64m``, ``1024``) in bytes."""
    text = value.strip().lower()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits) :] or "b"
    if not digits.isdigit() or unit not in _BYTE_UNITS:
        raise ValueError(f"not a byte size: {value!r} (e.g. 67108864b, 64m, 1g)")
    return min(int(digits) * _BYTE_UNITS[unit], NO_BYTE_LIMIT)


def frames_output(frames: list[Any], schema: pa.Schema, conf: PandasConf | None) -> pa.Table:
    """The DataFrames a processor returned as one Arrow table of ``schema``; a
    returned object that is not a DataFrame raises PySpark's error."""
    import pandas as pd

    frames = [f for f in frames if len(f)]
    if not frames:
        return schema.empty_table()
    for f in frames:
        if not isinstance(f, pd.DataFrame):
            from pyspark.errors import PySparkValueError

            raise PySparkValueError(
                "Invalid return type. Please make sure that the UDF returns a "
                "pandas.DataFrame when the specified return type is StructType."
            )
    if conf is not None and conf.int_to_decimal:
        frames = [ints_as_decimals(f, schema) for f in frames]
    for f in frames:
        missing = [n for n in schema.names if n not in f.columns]
        if missing:
            raise ValueError(
                f"a DataFrame the processor returned has no column {missing[0]!r} of "
                f"the output schema (it has {list(f.columns)})"
            )
    timezone = None if conf is None else conf.timezone
    # datetime columns are not numpy arrays: they take the pandas path
    table = concat_columns(frames, schema)
    if table is not None:
        return table
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    frame = localized(frame[schema.names], schema, timezone)
    return pa.Table.from_pandas(frame, schema=schema, preserve_index=False)


def concat_columns(frames: list[Any], schema: pa.Schema) -> pa.Table | None:
    """The frames' rows as one table of ``schema``, column by column: each frame's
    column arrays joined with numpy, several times faster than ``pd.concat`` over
    thousands of one-row frames (one per key). None when a column is not a plain
    numpy array (extension dtypes, datetimes), and the caller concatenates with
    pandas."""

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


def localized(frame: Any, schema: pa.Schema, timezone: str | None) -> Any:
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


def reindexed(frame: Any) -> Any:
    """A slice of the batch's frame indexed 0..n-1, as Spark builds each key's frame
    (a new index on a view: no copy)."""
    import pandas as pd

    frame.index = pd.RangeIndex(len(frame))
    return frame


def pandas_slices(frame: Any, chunk: int) -> Any:
    """``make(start, end)``: the rows factory of a key whose rows are
    ``frame[start:end]``, DataFrames of at most ``chunk`` rows each."""

    def make(start: int, end: int) -> Any:
        # a slice keeps the batch frame's row labels: re-indexing each key's slice
        # cost more than the slice itself (measured in BENCHMARKS.md)
        if end - start <= chunk:
            return lambda: iter([frame.iloc[start:end]])
        # a hot key's rows in Spark's chunks, each sliced as the processor asks
        return lambda: (frame.iloc[s : min(s + chunk, end)] for s in range(start, end, chunk))

    return make


def spark_pandas(table: pa.Table, timezone: str | None) -> Any:
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


def ints_as_decimals(frame: Any, schema: pa.Schema) -> Any:
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
