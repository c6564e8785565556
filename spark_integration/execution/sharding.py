"""The task side of placement (:mod:`spark_integration.planning.placement`): a
Spark task that holds the rows of several state partitions runs the operator's
task for each of them in turn, in groups (:class:`PartitionGroup`): one per state
server the partitions run in, or one in all without servers.

A group is one request to its state server (its input, its operator task pickled
once, its output and each partition's metrics row back), and one flush group
(:func:`~sessionstore.checkpoint.storage.flush_group.flush_group`): the local
changelogs its partitions commit reach the disk together at its end, before its
output goes back to Spark. So what a partition costs a task does not include a
round trip to its server or two waits for the disk of its own (BENCHMARKS.md,
"Spark at scale")."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from sessionstore.arrow_pandas import numpy_of
from sessionstore.checkpoint.storage.flush_group import flush_group
from spark_integration.conf.names import SHARD
from spark_integration.execution.context import ContextTask, TaskContext, check_partition
from spark_integration.execution.state_server.client import ServedTask
from spark_integration.execution.state_server.config import servers_here

__all__ = ["ShardedTask", "PartitionGroup"]


def _table(batches: Iterator[pa.RecordBatch]) -> pa.Table | None:
    inputs = [b for b in batches if b.num_rows]
    return pa.Table.from_batches(inputs) if inputs else None


def _grouped(table: pa.Table, keys: np.ndarray) -> dict[int, list[pa.RecordBatch]]:
    """The rows of ``table`` by their value of ``keys`` (one per row), in their
    order within each group: one stable sort, then slices."""
    order = np.argsort(keys, kind="stable")
    table, keys = table.take(order), keys[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(keys)]
    return {
        int(keys[s]): table.slice(s, e - s).combine_chunks().to_batches()
        for s, e in zip(starts, ends, strict=True)
    }


def _split(batches: Iterator[pa.RecordBatch]) -> dict[int, list[pa.RecordBatch]]:
    """The rows of each state partition, without the :data:`~spark_integration.conf.names.SHARD` column."""
    table = _table(batches)
    if table is None:
        return {}
    return _grouped(table.drop_columns([SHARD]), numpy_of(table.column(SHARD)))


def _by_slot(batches: Iterator[pa.RecordBatch], count: int) -> dict[int, list[pa.RecordBatch]]:
    """The rows whose state partition runs in each of ``count`` servers (server
    ``partition mod count``), the :data:`~spark_integration.conf.names.SHARD` column kept."""
    table = _table(batches)
    if table is None:
        return {}
    return _grouped(table, numpy_of(table.column(SHARD)) % count)


@dataclass
class PartitionGroup:
    """Runs ``each`` (the operator task of one state partition) for each of
    ``partitions`` in turn, each with its rows (split by the
    :data:`~spark_integration.conf.names.SHARD` column) and its own context, in one
    flush group (see the module doc). Picklable: it is what a state server is sent."""

    each: ContextTask
    partitions: list[int]

    def run(self, batches: Iterator[pa.RecordBatch], context: TaskContext) -> Iterator[Any]:
        """The partitions' outputs, one after another (see :class:`ContextTask`)."""
        rows = _split(batches)
        with flush_group():
            for partition in self.partitions:
                yield from self.each.run(
                    iter(rows.pop(partition, [])), context.for_partition(partition)
                )


@dataclass
class ShardedTask:
    """The task of Spark task ``t`` of ``tasks``: runs ``each`` (the operator task of
    one state partition) for state partitions ``t, t + tasks, ...`` below
    ``partitions``, each with its own rows and its own context (see
    :mod:`spark_integration.planning.placement`): in ``servers`` state servers per
    executor (None: :data:`~spark_integration.execution.state_server.config.SERVERS_PER_SLOT`
    per core of the executor), one :class:`PartitionGroup` per server, or with ``servers`` 0 in
    this process, as one group."""

    each: ContextTask
    partitions: int
    tasks: int
    servers: int | None = 0

    def run(self, batches: Iterator[pa.RecordBatch], context: TaskContext) -> Iterator[Any]:
        """Run ``each`` for this Spark task's state partitions (see :class:`ContextTask`)."""
        info = context.info
        check_partition(None, info.partition, self.tasks, "Spark tasks")
        mine = list(range(info.partition, self.partitions, self.tasks))
        if self.servers == 0:
            yield from PartitionGroup(self.each, mine).run(batches, context)
            return
        count = servers_here(self.servers)
        groups: dict[int, list[int]] = {}
        for partition in mine:
            groups.setdefault(partition % count, []).append(partition)
        rows = _by_slot(batches, count)
        for slot, partitions in groups.items():
            # the group's context names its first partition: ServedTask picks the
            # server of that partition, which is every one's of the group
            served = ServedTask(PartitionGroup(self.each, partitions), count, self.partitions)
            yield from served.run(iter(rows.pop(slot, [])), context.for_partition(partitions[0]))
