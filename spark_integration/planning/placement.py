"""Where an operator's state partitions run: Spark tasks, shards and state servers.

An operator's state is kept in ``P`` databases (one changelog per micro-batch
each): its partitions, or where they outnumber 2 per core the slabs that hold
them (planning passes the databases as ``P``:
:mod:`sessionstore.checkpoint.partition.identity`, "Partitions and slabs"). Spark charges a
fixed cost for every task of every micro-batch, whatever it does (about 27 ms of a
slot; BENCHMARKS.md, "Spark at scale"): with a Spark task per state partition, a
query with no state work at all runs 16 times slower at 200 partitions than at 4.
So the number of Spark tasks ``T`` is chosen apart from ``P``, as Flink's key
groups separate state shards from parallelism:

* the input is hash-partitioned into ``T`` Spark partitions by the operator's
  keys, with ``T`` dividing ``P``, and each row carries its state partition,
  ``pmod(hash(keys), P)`` (Spark's own partitioning hash, so the state partition
  of a key is the one ``repartition(P, keys)`` gives it, as the checkpoint and
  ``sessionstore repartition`` assume). Because ``T`` divides ``P``, Spark task
  ``t`` receives exactly the keys of state partitions ``t, t + T, t + 2T, ...``;
* the task splits its rows by state partition and runs the operator for each of
  them in turn, every one of its state partitions, with rows or without (event
  time advances and sessions close in partitions that get no rows), each as its
  own state partition: its own database, version, commit, changelog, metrics and
  report to the coordinator. A retried Spark task runs all of them again; those
  that committed load the same version and give the same output;
* each state partition runs in its state server
  (:mod:`spark_integration.execution.state_server`), server ``p mod N``; with the defaults (``N = 2 × slots``, ``T`` = one per core)
  the tasks that run at the same time never share a server. A task sends each
  server its partitions in one request, run there in one flush group
  (:class:`~spark_integration.execution.sharding.PartitionGroup`).

``T`` (:data:`~spark_integration.planning.operator_conf.TASKS_CONF`, read with the
operator's other conf keys): ``auto`` (the default) is ``P`` when ``P`` is at most
the cluster's cores; else one task per core if that divides ``P``, else the
largest divisor of ``P`` up to two per core if it gives every core a task, else
``P``; or a number dividing ``P``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spark_integration.conf.names import SHARD
from spark_integration.execution.context import ContextTask, SparkTask
from spark_integration.execution.metrics import metrics_enabled, with_state_metrics
from spark_integration.execution.sharding import ShardedTask
from spark_integration.execution.state_server import served
from spark_integration.execution.state_server.config import server_count
from spark_integration.planning.operator_conf import TASKS_CONF, OperatorConf, task_count

__all__ = ["TASKS_CONF", "state_map", "task_count"]


def state_map(
    df: Any,
    keys: Sequence[str],
    partitions: int,
    task: ContextTask,
    out_schema: Any,
    name: str,
    conf: OperatorConf | None = None,
) -> Any:
    """Run operator ``task`` over ``df`` hash-partitioned by ``keys`` into
    ``partitions`` state partitions: in ``conf.tasks`` Spark tasks, each state
    partition in its state server (see the module doc); with the state metrics of
    :func:`~spark_integration.execution.metrics.with_state_metrics`. ``conf`` is
    the operator's conf snapshot (:func:`~spark_integration.planning.operator_conf.operator_conf`);
    without one, the session's conf is read here."""
    from pyspark.sql import functions as F

    spark = df.sparkSession
    if conf is None:
        tasks, servers, observe = (
            task_count(spark, partitions), server_count(spark), metrics_enabled(spark)
        )  # fmt: skip
    else:
        tasks, servers, observe = conf.tasks, conf.servers, conf.observe_metrics
    if tasks == partitions:
        return with_state_metrics(
            df.repartition(partitions, *keys), served(task, servers, partitions), out_schema, name,
            observe=observe,
        )  # fmt: skip
    routed = df.withColumn(SHARD, F.pmod(F.hash(*keys), F.lit(partitions)))
    return with_state_metrics(
        routed.repartition(tasks, *keys),
        task,
        out_schema,
        name,
        outer=lambda each: SparkTask(ShardedTask(each, partitions, tasks, servers)),
        observe=observe,
    )
