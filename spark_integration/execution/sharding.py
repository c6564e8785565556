"""The task side of placement (:mod:`spark_integration.planning.placement`): a
Spark task that holds the rows of several state partitions splits them by the
hidden :data:`~spark_integration.conf.names.SHARD` column and runs the operator's
task for each of its state partitions in turn."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_integration.conf.names import SHARD
from spark_integration.execution.context import ContextTask, TaskContext, check_partition

__all__ = ["ShardedTask"]


def _split(batches: Iterator[pa.RecordBatch]) -> dict[int, list[pa.RecordBatch]]:
    """The rows of each state partition, without the :data:`~spark_integration.conf.names.SHARD` column."""
    inputs = [b for b in batches if b.num_rows]
    if not inputs:
        return {}
    table = pa.Table.from_batches(inputs)
    order = pc.sort_indices(table.column(SHARD))
    table = table.take(order)
    shards = table.column(SHARD).to_numpy()
    table = table.drop_columns([SHARD])
    starts = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1]])
    ends = np.r_[starts[1:], len(shards)]
    return {
        int(shards[s]): table.slice(s, e - s).combine_chunks().to_batches()
        for s, e in zip(starts, ends, strict=True)
    }


@dataclass
class ShardedTask:
    """The task of Spark task ``t`` of ``tasks``: runs ``each`` (the operator task of
    one state partition) for state partitions ``t, t + tasks, ...`` below
    ``partitions``, each with its own rows and its own context (see
    :mod:`spark_integration.planning.placement`)."""

    each: ContextTask
    partitions: int
    tasks: int

    def run(self, batches: Iterator[pa.RecordBatch], context: TaskContext) -> Iterator[Any]:
        """Run ``each`` for this Spark task's state partitions (see :class:`ContextTask`)."""
        info = context.info
        check_partition(None, info.partition, self.tasks, "Spark tasks")
        rows = _split(batches)
        for partition in range(info.partition, self.partitions, self.tasks):
            yield from self.each.run(
                iter(rows.pop(partition, [])), context.for_partition(partition)
            )
