"""What an operator's state needs on the driver before any task runs: the backend
(given, else the session's conf), the first request to its checkpoint's store, the
partition count (the checkpoint's, else the conf's or the cluster's cores:
:func:`partition_count`), and the driver's coordinator for an event-time operator
(:func:`operator_coordinator`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

from sessionstore.checkpoint.partition.identity import recorded_layout
from sessionstore.checkpoint.partition.lineage import warn_unfenced
from sessionstore.checkpoint.storage.first_contact import reach
from sessionstore.process import this_process
from spark_integration.conf.backend import CONF_PREFIX, StateBackend
from spark_integration.conf.local_spark import UNIX_SOCKET_CONF
from spark_integration.conf.spark_session import conf_value, default_parallelism
from spark_integration.coordinator.protocol import CoordinatorAddress
from spark_integration.planning.rescale import finish_interrupted, locate

__all__ = [
    "resolve",
    "Resolved",
    "partition_count",
    "slab_count",
    "explicit_tasks",
    "TASKS_CONF",
    "default_slabs",
    "PARTITIONS_CONF",
    "PARTITIONS_PER_CORE",
    "DEFAULT_PARTITIONS",
    "operator_coordinator",
    "warn_tcp_workers",
]


#: The Spark conf key that sets the partition count of operators that get no
#: ``num_partitions`` (an existing checkpoint of another count is rescaled to it).
PARTITIONS_CONF = CONF_PREFIX + "partitions"
#: Spark conf key: Spark tasks per micro-batch of an operator
#: (:mod:`spark_integration.planning.placement`).
TASKS_CONF = CONF_PREFIX + "tasks"

#: The databases (slabs) per core of the cluster (Spark's ``defaultParallelism``)
#: an operator's partitions are kept in (:func:`default_slabs`). Spark's guidance
#: for stateful queries is 1-2 tasks per core: each task costs a fixed share of a
#: slot and each database a write and a changelog per micro-batch, while a second
#: per core evens out skewed keys and a straggler.
PARTITIONS_PER_CORE = 2

#: The partition count of a new checkpoint that is told none. Partitions beyond
#: the cluster's slots share databases (:func:`default_slabs`) and cost nothing
#: more (BENCHMARKS.md, "Partitions per task"), so the default is high enough for
#: a query started on a laptop to spread over a cluster of hundreds of cores
#: without a rescale of its partitions, and highly divisible, so that every
#: cluster size finds a database count that divides it (1-6, 8-10, 12, 15, 16, 18,
#: 20, 24, 30, 36, 40, 45, 48, 60, 72, 80, 90, 120, 144, 180, 240, 360, 720).
DEFAULT_PARTITIONS = 720


class Resolved(NamedTuple):
    """What :func:`resolve` found for an operator."""

    #: the given backend or the session's conf, pointed at the operator's state
    backend: StateBackend
    #: the databases its partitions are kept in (:func:`slab_count`)
    slabs: int
    #: its partition count (:func:`partition_count`)
    partitions: int
    #: the task count :data:`TASKS_CONF` sets (None: ``auto``)
    tasks: int | None


def resolve(
    df: Any, backend: StateBackend | None, num_partitions: int | None, name: str
) -> Resolved:
    """The backend, slabs, partition count and task setting of operator ``name``
    (:class:`Resolved`), the operator's state rescaled when its checkpoint records
    another layout (:mod:`spark_integration.planning.rescale`)."""
    spark = df.sparkSession
    backend = backend or StateBackend.from_conf(spark)
    warn_tcp_workers(spark)
    # the first request of this process to the store answers within a bounded time,
    # or fails with one line saying what was tried and what to fix
    storage = reach(backend.checkpoint_uri, backend.storage_options)
    warn_unfenced(storage)  # once per checkpoint location: the risk where nothing fences
    finish_interrupted(backend, name)  # so that the layout read next is the one that holds
    recorded = recorded_layout(backend.checkpoint_uri, name, backend.storage_options)
    k = partition_count(spark, backend, name, num_partitions, recorded)
    tasks = explicit_tasks(spark, k)
    # a checkpoint of another layout is rescaled here, before the first batch; a
    # spread the cluster alone asks for waits while the checkpoint cannot take it
    located, s = locate(
        spark, backend, name, slab_count(spark, k, recorded, tasks), k,
        may_defer=tasks is None, recorded=recorded,
    )  # fmt: skip
    return Resolved(located, s, k, tasks)


def _positive(value: Any, what: str) -> int:
    """``value`` (an int, or its decimal digits as conf values are) as a positive
    int; ``ValueError`` naming ``what`` and the value otherwise."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if type(value) is not int or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


def partition_count(
    spark: Any,
    backend: StateBackend,
    name: str,
    num_partitions: int | None = None,
    recorded: tuple[int, int] | None | bool = False,
) -> int:
    """How many partitions operator ``name`` hash-partitions its input into:
    ``num_partitions``, else the conf's :data:`PARTITIONS_CONF`, else the count
    recorded in the operator's checkpoint (one small read on the driver), else
    :data:`DEFAULT_PARTITIONS`.

    A count that differs from an existing checkpoint's rescales the checkpoint
    before the first batch (:func:`resolve`, docs/rescale.md). Spark's
    ``spark.sql.shuffle.partitions`` (200 unless set) is not used: at 200 tasks per
    micro-batch their fixed costs dominate (BENCHMARKS.md, "Spark at scale").
    ``recorded``: the checkpoint's ``(slabs, partitions)`` when the caller read
    them already (None: no checkpoint).
    """
    if num_partitions is not None:
        return _positive(num_partitions, "num_partitions")
    configured = spark.conf.get(PARTITIONS_CONF, None)
    if configured:
        return _positive(configured, PARTITIONS_CONF)
    if recorded is False:
        recorded = recorded_layout(backend.checkpoint_uri, name, backend.storage_options)
    if recorded:
        return recorded[1]
    return DEFAULT_PARTITIONS


#: How many times its databases a cluster must want before a checkpoint of the
#: same partition count is spread over more on restart (:func:`slab_count`).
GROW_FACTOR = 2


def explicit_tasks(spark: Any, partitions: int) -> int | None:
    """The task count :data:`TASKS_CONF` sets (None: ``auto``, the default);
    ``ValueError`` naming the value unless it is a positive divisor of
    ``partitions``."""
    value = spark.conf.get(TASKS_CONF, "auto")
    text = str(value).strip().lower()
    if text in ("auto", ""):
        return None
    tasks = int(text) if text.isdigit() else 0
    if tasks < 1 or partitions % tasks:
        raise ValueError(
            f"{TASKS_CONF} must be 'auto' or a positive divisor of the operator's "
            f"{partitions} partitions, got {value!r}"
        )
    return tasks


def default_slabs(partitions: int, cores: int) -> int:
    """The databases ``partitions`` partitions are kept in on a cluster of
    ``cores``: each its own up to :data:`PARTITIONS_PER_CORE` per core; above, the
    most slabs that divide the count between one and two per core (each slab is
    one database, one changelog per micro-batch and one Spark task's share: what a
    partition of its own would cost); the count itself when none divides it."""
    most = PARTITIONS_PER_CORE * cores
    if partitions <= most:
        return partitions
    fits = [d for d in range(max(cores, 1), most + 1) if partitions % d == 0]
    return max(fits) if fits else partitions


def slab_count(
    spark: Any,
    partitions: int,
    recorded: tuple[int, int] | None = None,
    tasks: int | None = None,
) -> int:
    """How many databases (slabs: sessionstore.checkpoint.partition.identity) hold
    the operator's ``partitions`` partitions, given the checkpoint's ``recorded``
    ``(slabs, partitions)`` (None: a new checkpoint) and the task count ``tasks``
    :data:`TASKS_CONF` sets (None: ``auto``).

    A new checkpoint, or one of another partition count: :func:`default_slabs`
    for the cluster's cores (made a multiple of ``tasks``: each task runs as many
    slabs). A checkpoint of the same count keeps its slabs: with ``tasks``, the
    fewest more that are a multiple of it where they are not; else spread over the
    cluster's count where
    that is at least :data:`GROW_FACTOR` times as many (a restart on a larger
    cluster; on a smaller one each task runs several slabs). A layout other than
    the recorded one rescales the checkpoint before the first batch
    (docs/rescale.md); a spread the checkpoint cannot take then (it is not at one
    whole batch) is left for a later start
    (:func:`~spark_integration.planning.rescale.locate`).
    """
    want = default_slabs(partitions, default_parallelism(spark))
    if recorded is None or recorded[1] != partitions:
        # a new checkpoint, or another count (rescaled): both divide the count, and
        # so does their least common multiple
        return want if tasks is None else math.lcm(want, tasks)
    kept = recorded[0]
    if tasks is not None:  # as many databases per task: the fewest more where they must be
        return min(d for d in range(kept, partitions + 1) if partitions % d == 0 == d % tasks)
    # more databases only where the cluster wants at least twice as many: a
    # rescale copies the whole state, and the cores a query starts with vary
    return want if want >= GROW_FACTOR * kept else kept


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
