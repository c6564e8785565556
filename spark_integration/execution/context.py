"""Where an operator task runs and what it is given: :class:`TaskInfo` (its state
partition, micro-batch, attempt and query run, from Spark's task context),
:class:`TaskContext` (what the code that runs a task gives it, and what the task
gives back), :class:`ContextTask` (the protocol every operator task implements) and
:class:`SparkTask`, the ``mapInArrow`` function that runs one in a Spark task.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import pyarrow as pa

from spark_integration.execution.long_lived import freeze_long_lived

__all__ = [
    "TaskInfo",
    "TaskContext",
    "ContextTask",
    "SparkTask",
    "task_info",
    "spark_task_context",
    "check_partition",
    "RUN_PROPERTY",
]


@dataclass(frozen=True)
class TaskInfo:
    """Which task this is: its state partition, micro-batch and attempt (what a
    state server is sent, as msgpack, in this field order)."""

    partition: int
    batch_id: int
    attempt: int
    #: the streaming query's run (a restart is a new run), if the task has one
    run: str | None = None


#: The local property of a streaming query's tasks that names the query's run:
#: Spark runs each micro-batch's jobs in a job group named after the run id.
RUN_PROPERTY = "spark.jobGroup.id"


@dataclass
class TaskContext:
    """What the code that runs an operator task gives it, and what the task gives
    back: passed to :meth:`ContextTask.run` by the worker wrapper.

    Spark's ``mapInArrow`` function (:class:`SparkTask`) makes one from Spark's
    ``TaskContext``; a state server (:mod:`spark_integration.execution.state_server`)
    from what the worker sent, having no ``TaskContext`` of its own; a Spark task
    that runs several state partitions (:mod:`spark_integration.planning.placement`)
    one per partition. The task's commit leaves its metrics record here rather
    than in a generator's return value, which a wrapper that maps the task's
    output would lose."""

    info: TaskInfo
    #: the process lives on after the task (a reused Python worker, a state
    #: server), so a snapshot upload can run after the commit, in the background
    outlives_task: bool = False
    #: the task's metrics record (:mod:`spark_integration.execution.metrics`), set
    #: when it commits
    metrics: dict[str, Any] | None = None

    def for_partition(self, partition: int) -> TaskContext:
        """A fresh context for state partition ``partition`` of this Spark task."""
        return TaskContext(replace(self.info, partition=partition), self.outlives_task)


class ContextTask(Protocol):
    """An operator task, or a wrapper of one: runs over a Spark task's input as
    ``context`` says and yields Arrow batches or tables."""

    def run(self, batches: Iterator[pa.RecordBatch], context: TaskContext) -> Iterator[Any]:
        """The task's output; its metrics record is left in ``context``."""
        ...


def task_info() -> TaskInfo:
    """Partition, micro-batch id, attempt and query run of the running Spark task."""
    from pyspark import TaskContext as SparkTaskContext

    ctx = SparkTaskContext.get()
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    run = ctx.getLocalProperty(RUN_PROPERTY)
    return TaskInfo(ctx.partitionId(), int(batch or 0), ctx.attemptNumber(), run)


def spark_task_context() -> TaskContext:
    """The context of the running Spark task, in its Python worker: a worker that
    Spark reuses (``spark.python.worker.reuse``) outlives the task, others exit
    with it."""
    return TaskContext(task_info(), outlives_task=bool(os.environ.get("SPARK_REUSE_WORKER")))


@dataclass
class SparkTask:
    """The ``mapInArrow`` function of an operator: runs ``task`` as the Spark task
    it is called in (picklable, as the task it wraps)."""

    task: ContextTask

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[Any]:
        context = spark_task_context()
        yield from self.task.run(batches, context)
        if context.outlives_task:
            # the reused worker collects every object it holds next: see long_lived
            freeze_long_lived()


def check_partition(name: str | None, partition: int, count: int, unit: str = "partitions") -> None:
    """Refuse a Spark task numbered ``partition`` when the operator ``name`` has
    only ``count`` of them (``unit``: its state partitions, or its Spark tasks),
    before any state is touched.

    Spark numbers the tasks of a stage, not of the operator's shuffle: in a union,
    a later child's tasks are numbered after the earlier children's, so the task
    number is no longer the state partition, and a wrong one would mix two
    partitions' state."""
    if partition >= count:
        operator = "sessionstore operator" + ("" if name is None else f" {name!r}")
        raise RuntimeError(
            f"{operator}: this task is partition {partition} of its stage but the "
            f"operator has {count} {unit}; its output was combined with other data in "
            "one stage (for example by union), which Spark numbers as one. Run each "
            "sessionstore operator as its own query, or write the union's inputs out "
            "separately"
        )
