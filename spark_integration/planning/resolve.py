"""What an operator's state needs on the driver before any task runs: the backend
(given, else the session's conf), the first request to its checkpoint's store, the
partition count (the checkpoint's, else the conf's or the cluster's cores:
:func:`partition_count`), and the driver's coordinator for an event-time operator
(:func:`operator_coordinator`).
"""

from __future__ import annotations

import warnings
from typing import Any

from sessionstore.checkpoint.partition.lineage import warn_unfenced
from sessionstore.checkpoint.partition.provider import recorded_partitions
from sessionstore.checkpoint.storage.first_contact import reach
from sessionstore.process import this_process
from spark_integration.conf.backend import CONF_PREFIX, StateBackend
from spark_integration.conf.local_spark import UNIX_SOCKET_CONF
from spark_integration.conf.spark_session import conf_value, default_parallelism
from spark_integration.coordinator.protocol import CoordinatorAddress
from spark_integration.planning.rescale import located_backend

__all__ = [
    "resolve",
    "partition_count",
    "PARTITIONS_CONF",
    "PARTITIONS_PER_CORE",
    "operator_coordinator",
    "warn_tcp_workers",
]


#: The Spark conf key that sets the partition count of operators that get no
#: ``num_partitions`` (an existing checkpoint of another count is rescaled to it).
PARTITIONS_CONF = CONF_PREFIX + "partitions"
#: The default partition count per core of the cluster (Spark's
#: ``defaultParallelism``). Spark's guidance for stateful queries is 1-2 tasks per
#: core: each task costs a fixed share of a slot (and one database per partition),
#: while a second task per core evens out skewed keys and a straggler.
PARTITIONS_PER_CORE = 2


def resolve(
    df: Any, backend: StateBackend | None, num_partitions: int | None, name: str
) -> tuple[StateBackend, int]:
    """``(backend, partition count)`` of operator ``name``: the given backend or the
    session's conf, pointed at the operator's state (rescaled to the count when its
    checkpoint records another: :mod:`spark_integration.planning.rescale`), and
    :func:`partition_count`."""
    spark = df.sparkSession
    backend = backend or StateBackend.from_conf(spark)
    warn_tcp_workers(spark)
    # the first request of this process to the store answers within a bounded time,
    # or fails with one line saying what was tried and what to fix
    storage = reach(backend.checkpoint_uri, backend.storage_options)
    warn_unfenced(storage)  # once per checkpoint location: the risk where nothing fences
    n = partition_count(spark, backend, name, num_partitions)
    # a checkpoint of another count is rescaled here, before the first batch
    return located_backend(spark, backend, name, n), n


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
    """How many partitions operator ``name`` hash-partitions its input into:
    ``num_partitions``, else the conf's :data:`PARTITIONS_CONF`, else the count
    recorded in the operator's checkpoint (one small read on the driver), else
    :data:`PARTITIONS_PER_CORE` times the cluster's cores
    (``spark.sparkContext.defaultParallelism``).

    A count that differs from an existing checkpoint's rescales the checkpoint
    before the first batch (:func:`resolve`, docs/rescale.md). Spark's
    ``spark.sql.shuffle.partitions`` (200 unless set) is not used: at 200 tasks per
    micro-batch their fixed costs dominate (BENCHMARKS.md, "Spark at scale").
    """
    if num_partitions is not None:
        return _positive(num_partitions, "num_partitions")
    configured = spark.conf.get(PARTITIONS_CONF, None)
    if configured:
        return _positive(configured, PARTITIONS_CONF)
    recorded = recorded_partitions(backend.checkpoint_uri, name, backend.storage_options)
    if recorded is not None:
        return recorded
    return PARTITIONS_PER_CORE * default_parallelism(spark)


def operator_coordinator(
    df: Any, backend: StateBackend, name: str, num_partitions: int
) -> CoordinatorAddress | None:
    """The address of this driver's coordinator (event time, state metrics) for ``name``
    (started on first use, see :mod:`spark_integration.coordinator.server`), for its
    tasks; None when it is turned off or cannot listen."""
    from spark_integration.coordinator.server import coordinator_for

    return coordinator_for(
        df.sparkSession, backend.checkpoint_uri, name, num_partitions, backend.storage_options
    )


#: The once-per-process event of :func:`warn_tcp_workers` (:mod:`sessionstore.process`).
TCP_WARNING = "tcp_workers"


def warn_tcp_workers(spark: Any) -> bool:
    """Warn once per process when Spark 4.1+ talks to Python workers over TCP.

    Each Python task then stalls before its input arrives (see the README's "Configuration"
    section; measured in BENCHMARKS.md), on every partition of every micro-batch.
    The setting is fixed when the SparkContext starts, so all we can do is say so.
    Returns whether it warned.
    """
    major, minor = (int(p) for p in spark.version.split(".")[:2])
    if (major, minor) < (4, 1):
        return False
    if str(conf_value(spark, UNIX_SOCKET_CONF, "false")).lower() == "true":
        return False
    if not this_process().first_time(TCP_WARNING):
        return False
    warnings.warn(
        f"{UNIX_SOCKET_CONF} is off: every Python task of this query waits ~25 ms for "
        f"its input over TCP. Set it to true when building the SparkSession (see the "
        f"sessionstore README, 'Python worker transport').",
        stacklevel=3,
    )
    return True
