"""What an operator checks and derives from its input DataFrames before any task
runs: input columns checked with clear errors, the event time as epoch
milliseconds, the grace period defaulting to the watermark delay, the key columns'
Spark types, and two inputs unioned into one tagged input (:func:`tagged_union`)
whose hidden columns tasks read (:data:`~spark_integration.conf.names.SIDE`,
:data:`~spark_integration.conf.names.TS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sessionstore.encoding.spark_hash import KEY_TYPES
from spark_integration.conf.names import SIDE, TS

__all__ = [
    "checked_fields",
    "BINARY_COLLATION",
    "time_column",
    "grace_ms",
    "watermark_delay_ms",
    "key_types",
    "tagged_union",
    "WATERMARK_DELAY_KEY",
]


#: Where Spark records ``withWatermark``'s delay: metadata of the event-time column.
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


def watermark_delay_ms(df: Any, timestamp: str) -> int | None:
    """The delay of the watermark the input declares on ``timestamp``
    (``withWatermark``), or None."""
    for field in df.schema.fields:
        if field.name == timestamp and WATERMARK_DELAY_KEY in (field.metadata or {}):
            return int(field.metadata[WATERMARK_DELAY_KEY])
    return None


def grace_ms(df: Any, timestamp: str, grace: str | int | None) -> int:
    """The grace period in ms: ``grace`` when given, else the delay of the watermark
    the input declares on ``timestamp`` (``withWatermark``), else 0.

    With grace equal to the delay, a session or window closes when the query's
    watermark passes its end, as in Spark: the watermark of micro-batch N is the
    largest event time of the batches before it, across partitions, minus the delay.
    """
    from spark_integration.conf.intervals import interval_ms

    if grace is not None:
        return interval_ms(grace, "grace")
    delay = watermark_delay_ms(df, timestamp)
    return 0 if delay is None else delay


#: The collation a string key must have, Spark's default: under another one Spark
#: groups and routes keys by their collation key, which the store tells apart.
BINARY_COLLATION = "UTF8_BINARY"


def checked_fields(
    df: Any, columns: Sequence[str], side: str = "the input", keys: Sequence[str] = ()
) -> dict[str, Any]:
    """The fields of ``df`` by name; ``ValueError`` naming the first of ``columns``
    (and ``keys``) that ``df`` lacks (and ``side``, for operators with two inputs),
    or the first of ``keys`` whose type a key cannot have: refused when the query is
    planned, not by its first task. A key's type is one the stores' key codec holds
    and a rescale routes, :data:`~sessionstore.encoding.spark_hash.KEY_TYPES`
    (text, bytes, integers, booleans), and a string of :data:`BINARY_COLLATION`."""
    fields = {f.name: f for f in df.schema.fields}
    for column in [*keys, *columns]:
        if column not in fields:
            raise ValueError(f"{side} has no column {column!r} (it has {sorted(fields)})")
    for key in keys:
        data_type = fields[key].dataType
        collation = getattr(data_type, "collation", BINARY_COLLATION)
        if data_type.typeName() not in KEY_TYPES or collation != BINARY_COLLATION:
            raise ValueError(
                f"key column {key!r} of {side} is {data_type.simpleString()}: a key column "
                "must be a string (of the default collation), binary, integral (tinyint "
                "to bigint) or boolean column; cast it first, for example "
                f"F.col({key!r}).cast('string')"
            )
    return fields


def time_column(fields: dict[str, Any], timestamp: str) -> tuple[Any, Any]:
    """``(epoch-millisecond column, output time type)`` for a timestamp or long column."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    ts_type = fields[timestamp].dataType
    if isinstance(ts_type, (T.TimestampType, T.TimestampNTZType)):
        return F.unix_millis(F.col(timestamp).cast("timestamp")), T.TimestampType()
    if isinstance(ts_type, (T.LongType, T.IntegerType)):
        return F.col(timestamp).cast("long"), T.LongType()
    raise ValueError(
        f"timestamp column {timestamp!r} must be a timestamp or epoch milliseconds (long), "
        f"not {ts_type.simpleString()}"
    )


def key_types(df: Any, keys: Sequence[str]) -> list[str]:
    """The Spark type names (``DataType.typeName()``: ``string``, ``long``,
    ``integer``...) of the key columns of ``df``, the DataFrame an operator
    repartitions by them. Recorded in the checkpoint: the store keeps a str or an
    int, not whether the column was an int or a long, and Spark hashes the two
    differently, so a repartition of the state needs them (sessionstore repartition)."""
    fields = {f.name: f for f in df.schema.fields}
    return [fields[k].dataType.typeName() for k in keys]


def tagged_union(keys: list[str], sides: list[tuple[Any, Any, list[str], str]]) -> Any:
    """Union several inputs as (keys, side number, event-time ms, struct of columns).

    ``sides`` holds ``(DataFrame, millisecond time column, struct columns, struct
    name)``; each input's own columns travel in its struct, nulls elsewhere."""
    from pyspark.sql import functions as F

    combined = None
    for number, (df, millis, columns, struct) in enumerate(sides):
        tagged = df.select(
            *[F.col(k) for k in keys],
            F.lit(number).alias(SIDE),
            millis.alias(TS),
            F.struct(*[F.col(c) for c in columns]).alias(struct),
        )
        combined = (
            tagged if combined is None else combined.unionByName(tagged, allowMissingColumns=True)
        )
    return combined
