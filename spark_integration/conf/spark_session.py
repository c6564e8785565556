"""What the operators can reach through a SparkSession: a classic session or a Spark
Connect client.

A classic session lives in the driver's Python process: ``spark.sparkContext``
gives the driver's conf, its master and its cores, and the driver can run the
event-time coordinator (:mod:`spark_integration.coordinator.server`) that its
executors call. A Spark Connect session (``SparkSession.builder.remote(...)``) is a
client of a driver elsewhere, often one without Python: it has no
``sparkContext``, and nothing it starts is reachable by the executors. What it does
have is the session conf, which the server fills from its own ``SparkConf`` (so
``spark-submit --conf`` keys read the same), DataFrames, and listeners delivered to
the client (Spark 4.0+).

Every place that would touch ``sparkContext`` asks this module instead, so the
difference lives here:

* the driver's conf and master: :func:`driver_conf`, :func:`conf_value`,
  :func:`master`;
* the cluster's cores: :func:`default_parallelism` (under Connect,
  ``spark.default.parallelism`` if set, else one small job that counts the
  partitions Spark gives a range, which is what ``defaultParallelism`` sets);
* the coordinator: :func:`can_coordinate` is False under Connect, logged once; the
  tasks then take the paths they take when a coordinator is unreachable (event time
  from object storage, the commit fence by a read before each write), which give
  the same output;
* RDD jobs (``repartition_state``): :func:`require_classic` raises
  :class:`ClassicSessionRequired` naming what to use instead.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from sessionstore.process import this_process

__all__ = [
    "ClassicSessionRequired",
    "is_connect",
    "driver_conf",
    "conf_value",
    "master",
    "default_parallelism",
    "can_coordinate",
    "require_classic",
]

log = logging.getLogger(__name__)

#: Spark's setting of the cores a job is spread over by default.
PARALLELISM_CONF = "spark.default.parallelism"
#: Rows of the range whose partitions :func:`default_parallelism` counts: at least
#: one row per partition for any cluster's default parallelism.
_PROBE_ROWS = 1 << 20

#: The once-per-process event of :func:`can_coordinate` (:mod:`sessionstore.process`).
NO_COORDINATOR_LOG = "no_coordinator"


class ClassicSessionRequired(RuntimeError):
    """An API that needs the driver's process (RDDs, the SparkContext) was called
    with a Spark Connect session."""


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect client session (not the driver)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def driver_conf(spark: Any) -> dict[str, str]:
    """The driver's settings: the SparkContext's conf (``spark-submit --conf``, the
    builder) in a classic session; under Connect the session conf, which starts as
    the server's ``SparkConf``. A copy: the caller may change it."""
    if is_connect(spark):
        return dict(spark.conf.getAll)
    return dict(_context_conf(spark))


def conf_value(spark: Any, key: str, default: str | None = None) -> str | None:
    """One key of :func:`driver_conf`, or ``default``."""
    if is_connect(spark):
        return spark.conf.get(key, default)
    return _context_conf(spark).get(key, default)


def _context_conf(spark: Any) -> dict[str, str]:
    """The SparkContext's conf, read once per SparkContext (it does not change
    while the context runs: ``getConf`` hands out copies). Each read through Py4J
    costs about three JVM calls per key, a few hundred per operator planned when
    every reader made its own copy."""
    context = spark.sparkContext
    known = this_process().get_or_make("context_conf", weakref.WeakKeyDictionary)
    conf = known.get(context)
    if conf is None:
        conf = known[context] = dict(context.getConf().getAll())
    return conf


def master(spark: Any) -> str:
    """The driver's master URL (``local[2]``, ``spark://host:7077``, ...); empty if
    a Connect server does not say."""
    if is_connect(spark):
        return str(spark.conf.get("spark.master", "") or "")
    return str(spark.sparkContext.master)


def default_parallelism(spark: Any) -> int:
    """The cluster's cores as Spark counts them (``defaultParallelism``)."""
    if not is_connect(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    configured = spark.conf.get(PARALLELISM_CONF, None)
    if configured:
        return max(1, int(configured))
    # Connect session id -> its cluster's cores, asked once per session and process
    cache: dict[str, int] = this_process().get_or_make("parallelism", dict)
    known = cache.get(spark.session_id)
    if known is None:
        from pyspark.sql import functions as F

        # a range without a partition count gets defaultParallelism partitions
        # (spark.sql.leafNodeDefaultParallelism, if set, is the user's override)
        ids = spark.range(_PROBE_ROWS).select(F.spark_partition_id().alias("p"))
        last = ids.agg(F.max("p")).first()[0]
        known = cache[spark.session_id] = max(1, int(last) + 1)
    return known


def can_coordinate(spark: Any) -> bool:
    """Whether this process can run the driver's coordinator for ``spark``'s
    operators: a classic session's driver can; a Connect client cannot (logged once
    per process, the one line that says what the tasks do instead)."""
    if not is_connect(spark):
        return True
    if this_process().first_time(NO_COORDINATOR_LOG):
        log.info(
            "sessionstore: Spark Connect session: no event-time coordinator (it runs in "
            "the driver's Python, which a Connect client is not); tasks read event time "
            "from object storage and fence commits by a read before each write, and "
            "log_state_metrics prints observed metrics"
        )
    return False


def require_classic(spark: Any, what: str, instead: str) -> None:
    """Raise :class:`ClassicSessionRequired` if ``spark`` is a Connect session:
    ``what`` needs the driver's process; ``instead`` says what to use."""
    if is_connect(spark):
        raise ClassicSessionRequired(
            f"{what} needs a classic SparkSession (it runs RDD jobs from the driver's "
            f"process), and this one is a Spark Connect client; {instead}"
        )
