"""An operator's conf snapshot: every ``spark.sessionstore.*`` setting its planning
and tasks act on, read from the session once, when the operator is planned
(:func:`operator_conf`), and passed down as one frozen :class:`OperatorConf`
instead of each step reading the conf again.

What it holds, and the keys behind each (docs/configuration.md lists them all):
the backend (``spark.sessionstore.checkpointUri`` and the other
:class:`~spark_integration.conf.backend.StateBackend` keys, unless one is given),
the partition count (``spark.sessionstore.partitions``), the Spark task count
(``spark.sessionstore.tasks``), the state servers per executor
(``spark.sessionstore.stateServers``), whether tasks' metrics are observed
(``spark.sessionstore.metrics.enabled``), whether a new checkpoint may get a due
source (``spark.sessionstore.dueBatches.enabled``) and the coordinator's address
(``spark.sessionstore.coordinator.enabled`` and ``.port``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_integration.conf.backend import StateBackend
from spark_integration.conf.spark_session import default_parallelism
from spark_integration.coordinator.protocol import CoordinatorAddress
from spark_integration.execution.metrics import metrics_enabled
from spark_integration.execution.state_server.config import server_count
from spark_integration.planning.due_batches import due_batches_allowed
from spark_integration.planning.resolve import (
    PARTITIONS_PER_CORE,
    TASKS_CONF,
    explicit_tasks,
    operator_coordinator,
    resolve,
)

__all__ = ["OperatorConf", "operator_conf", "TASKS_CONF", "task_count"]

_READ = object()


def task_count(spark: Any, partitions: int, tasks: int | None | object = _READ) -> int:
    """Spark tasks per micro-batch for an operator of ``partitions`` state
    partitions (:data:`TASKS_CONF`, unless ``tasks`` gives its setting already read,
    None for ``auto``; the rule: :mod:`spark_integration.planning.placement`)."""
    if tasks is _READ:
        tasks = explicit_tasks(spark, partitions)
    if tasks is not None:  # checked when read; planning makes the databases a multiple
        return tasks
    cores = default_parallelism(spark)
    if partitions <= cores:
        return partitions
    # a task per core: every task costs Spark a fixed share of a slot, more than a
    # second task per core gains (BENCHMARKS.md, "Spark at scale", "Tasks per core":
    # 4 partitions on 2 cores run closer to the floor in 2 tasks than in 4)
    if partitions % cores == 0:
        return cores
    divisor = max(d for d in range(1, PARTITIONS_PER_CORE * cores + 1) if partitions % d == 0)
    return divisor if divisor >= cores else partitions


@dataclass(frozen=True)
class OperatorConf:
    """What operator :attr:`name` was planned with (see the module doc)."""

    name: str
    #: the given backend or the conf's, pointed at the operator's state
    backend: StateBackend
    #: the databases (slabs) the state partitions are kept in: what the tasks, the
    #: checkpoint's layout and the coordinator count as partitions
    partitions: int
    #: Spark tasks per micro-batch (:data:`TASKS_CONF`)
    tasks: int
    #: state servers per executor: 0 (off), a number, or None (each executor decides)
    servers: int | None
    #: whether the tasks' metrics are observed as ``sessionstore.<name>``
    observe_metrics: bool
    #: whether a new checkpoint may get a due source (the confs allow it)
    due_batches: bool
    #: the driver's coordinator for the operator's tasks, or None
    coordinator: CoordinatorAddress | None
    #: the operator's partition count, held in :attr:`partitions` slabs (the tasks
    #: check it against ``_metadata``, which records it where it differs); None:
    #: not checked
    key_groups: int | None = None


def operator_conf(
    df: Any, backend: StateBackend | None, num_partitions: int | None, name: str
) -> OperatorConf:
    """Operator ``name``'s conf snapshot, read from ``df``'s session: its backend and
    partition count resolved (:func:`~spark_integration.planning.resolve.resolve`:
    the first request to its store, a rescale when the count changes), every
    other setting read once, and its coordinator registered."""
    spark = df.sparkSession
    backend, n, k, tasks = resolve(df, backend, num_partitions, name)
    return OperatorConf(
        name=name,
        backend=backend,
        partitions=n,
        tasks=task_count(spark, n, tasks),
        servers=server_count(spark),
        observe_metrics=metrics_enabled(spark),
        due_batches=due_batches_allowed(spark),
        coordinator=operator_coordinator(df, backend, name, n),
        key_groups=k,
    )
