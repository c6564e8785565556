"""Driver-side planning of the sessionstore operators: what an operator checks and
derives from its input DataFrames before any task runs.

Input columns are checked with clear errors, the event time becomes epoch
milliseconds, the grace period defaults to the watermark delay, two inputs are
unioned into one tagged input (:func:`tagged_union`), the backend comes from the
session's conf when not given, and the partition count from the operator's
checkpoint or the cluster's cores (:func:`partition_count`). Tasks read the columns
named here (:data:`~spark_integration.conf.names.SIDE`,
:data:`~spark_integration.conf.names.TS`). An event-time operator is registered with
the driver's coordinator (:func:`operator_coordinator`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from sessionstore.checkpoint.partition.lineage import warn_unfenced
from sessionstore.checkpoint.partition.provider import check_partition_count, recorded_partitions
from sessionstore.checkpoint.storage.first_contact import reach
from spark_integration.conf.backend import CONF_PREFIX, StateBackend
from spark_integration.conf.local_spark import UNIX_SOCKET_CONF
from spark_integration.conf.names import SIDE, TS
from spark_integration.conf.spark_session import conf_value, default_parallelism

__all__ = [
    "resolve",
    "partition_count",
    "PARTITIONS_CONF",
    "PARTITIONS_PER_CORE",
    "operator_coordinator",
    "warn_tcp_workers",
    "checked_fields",
    "time_column",
    "grace_ms",
    "watermark_delay_ms",
    "tagged_union",
    "key_types",
]

#: The Spark conf key that sets the partition count of operators whose checkpoint
#: does not exist yet and that get no ``num_partitions``.
PARTITIONS_CONF = CONF_PREFIX + "partitions"
#: The default partition count per core of the cluster (Spark's
#: ``defaultParallelism``). Spark's guidance for stateful queries is 1-2 tasks per
#: core: each task costs a fixed share of a slot (and one database per partition),
#: while a second task per core evens out skewed keys and a straggler.
PARTITIONS_PER_CORE = 2

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


def checked_fields(df: Any, columns: Sequence[str], side: str = "the input") -> dict[str, Any]:
    """The fields of ``df`` by name; ``ValueError`` naming the first of ``columns``
    that ``df`` lacks (and ``side``, for operators with two inputs)."""
    fields = {f.name: f for f in df.schema.fields}
    for column in columns:
        if column not in fields:
            raise ValueError(f"{side} has no column {column!r} (it has {sorted(fields)})")
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


def resolve(
    df: Any, backend: StateBackend | None, num_partitions: int | None, name: str
) -> tuple[StateBackend, int]:
    """``(backend, partition count)`` of operator ``name``: the given backend or the
    session's conf, and :func:`partition_count`."""
    spark = df.sparkSession
    backend = backend or StateBackend.from_conf(spark)
    warn_tcp_workers(spark)
    # the first request of this process to the store answers within a bounded time,
    # or fails with one line saying what was tried and what to fix
    storage = reach(backend.checkpoint_uri, backend.storage_options)
    warn_unfenced(storage)  # once per checkpoint location: the risk where nothing fences
    return backend, partition_count(spark, backend, name, num_partitions)


def _positive(value: Any, what: str) -> int:
    """``value`` (an int, or its decimal digits as conf values are) as a positive
    int; ``ValueError`` naming ``what`` and the value otherwise."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if type(value) is not int or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


def partition_count(
    spark: Any, backend: StateBackend, name: str, num_partitions: int | None = None
) -> int:
    """How many partitions operator ``name`` hash-partitions its input into.

    The count is fixed for the life of a checkpoint, so an operator whose checkpoint
    exists keeps the count recorded in its ``_metadata`` (one small read on the
    driver); a ``num_partitions`` that differs from it raises
    :class:`~sessionstore.checkpoint.CheckpointMismatchError`. A new checkpoint gets
    ``num_partitions``, else the conf's :data:`PARTITIONS_CONF`, else
    :data:`PARTITIONS_PER_CORE` times the cluster's cores
    (``spark.sparkContext.defaultParallelism``). Spark's ``spark.sql.shuffle.partitions``
    (200 unless set) is not used: at 200 tasks per micro-batch their fixed costs
    dominate (BENCHMARKS.md, "Spark at scale").
    """
    wanted = None if num_partitions is None else _positive(num_partitions, "num_partitions")
    recorded = recorded_partitions(backend.checkpoint_uri, name, backend.storage_options)
    if recorded is not None:
        check_partition_count(f"{backend.checkpoint_uri}/{name}/_metadata", recorded, wanted)
        configured = spark.conf.get(PARTITIONS_CONF, None)
        if wanted is None and configured and _positive(configured, PARTITIONS_CONF) != recorded:
            warnings.warn(
                f"{PARTITIONS_CONF}={configured} is ignored by operator {name!r}: its "
                f"checkpoint {backend.checkpoint_uri} has {recorded} partitions, fixed for "
                f"its life (the conf sets the count of new checkpoints only)",
                stacklevel=4,  # the code that built the operator
            )
        return recorded
    if wanted is not None:
        return wanted
    configured = spark.conf.get(PARTITIONS_CONF, None)
    if configured:
        return _positive(configured, PARTITIONS_CONF)
    return PARTITIONS_PER_CORE * default_parallelism(spark)


def operator_coordinator(df: Any, backend: StateBackend, name: str, num_partitions: int) -> Any:
    """The address of this driver's coordinator (event time, state metrics) for ``name``
    (started on first use, see :mod:`spark_integration.coordinator.server`), for its
    tasks; None when it is turned off or cannot listen."""
    from spark_integration.coordinator.server import coordinator_for

    return coordinator_for(
        df.sparkSession, backend.checkpoint_uri, name, num_partitions, backend.storage_options
    )


_warned_tcp = False


def warn_tcp_workers(spark: Any) -> bool:
    """Warn once per process when Spark 4.1+ talks to Python workers over TCP.

    Each Python task then stalls before its input arrives (see the README's "Configuration"
    section; measured in BENCHMARKS.md), on every partition of every micro-batch.
    The setting is fixed when the SparkContext starts, so all we can do is say so.
    Returns whether it warned.
    """
    global _warned_tcp
    major, minor = (int(p) for p in spark.version.split(".")[:2])
    if _warned_tcp or (major, minor) < (4, 1):
        return False
    if str(conf_value(spark, UNIX_SOCKET_CONF, "false")).lower() == "true":
        return False
    _warned_tcp = True
    warnings.warn(
        f"{UNIX_SOCKET_CONF} is off: every Python task of this query waits ~25 ms for "
        f"its input over TCP. Set it to true when building the SparkSession (see the "
        f"sessionstore README, 'Python worker transport').",
        stacklevel=3,
    )
    return True


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
