"""The task of a two-input join (``window_join``, ``temporal_join``):
:class:`JoinTask`, which the joins subclass, takes the partition's state with the
operator's event time after the previous batch, reads the batch's tagged rows
(:func:`~spark_integration.planning.input_columns.tagged_union`) in a
deterministic order, lets the join advance and process them, records its event
time and counts with the commit, and yields the joined rows.

Each input row carries its side's number (:data:`~spark_integration.conf.names.SIDE`,
the input's position in the union), its event time in ms
(:data:`~spark_integration.conf.names.TS`), the keys, and its columns in a struct
named by its side's tag (:attr:`JoinTask.tags`); :func:`join_rows` decodes them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import pyarrow as pa

from sessionstore.checkpoint import StoreHandle
from sessionstore.operators.batch_paths.arrow_io import epoch_millis
from sessionstore.stores.spec import StoreSpec
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.names import SIDE, TS
from spark_integration.coordinator.protocol import CoordinatorAddress
from spark_integration.execution.context import TaskContext
from spark_integration.execution.inputs import deterministic_order, key_values, struct_values
from spark_integration.execution.output import arrow_schema, record_batch
from spark_integration.execution.partition_state import state_and_inputs

__all__ = ["JoinTask", "JoinRows", "JoinStep", "join_rows"]


class JoinRows(NamedTuple):
    """A batch's rows, decoded: per row its side's number, key, event time (ms)
    and its own side's columns (a dict, or None)."""

    sides: list[int]
    keys: list[Any]
    times: list[int | None]
    values: list[Any]


class JoinStep(NamedTuple):
    """What one batch of a join gave: the joined rows, the join's event time after
    the batch, and how many rows it dropped as late."""

    joined: list[Any]
    event_time: int | None
    late_dropped: int


def join_rows(table: pa.Table, keys: list[str], tags: Sequence[str]) -> JoinRows:
    """The rows of a tagged ``table`` (see the module doc): ``values[i]`` is row
    ``i``'s struct of its own side (tag ``tags[sides[i]]``)."""
    sides = table.column(SIDE).to_pylist()
    structs = [struct_values(table, tag) for tag in tags]
    values = [structs[side][i] for i, side in enumerate(sides)]
    return JoinRows(sides, key_values(table, keys), epoch_millis(table.column(TS)), values)


@dataclass(kw_only=True)
class JoinTask:
    """One partition's batch of a two-input join; a subclass says which stores it
    keeps (:meth:`specs`), how one batch advances and joins (:meth:`step`) and how
    joined rows become output columns (:meth:`columns`)."""

    backend: StateBackend
    name: str
    num_partitions: int
    keys: list[str]
    #: the struct name of each input, in the union's order (its side number)
    tags: list[str]
    out_schema_json: str
    key_types: list[str]
    coordinator: CoordinatorAddress | None = None
    #: the operator's partition count, held in ``num_partitions`` slabs (None: not
    #: checked)
    key_groups: int | None = None

    #: the hidden columns a batch's rows are first sorted by
    order: ClassVar[tuple[str, ...]] = (TS, SIDE)

    def specs(self) -> list[StoreSpec]:
        """The partition's stores."""
        raise NotImplementedError

    def step(
        self, handle: StoreHandle, rows: JoinRows | None, shared: int | None, batch_id: int
    ) -> JoinStep:
        """Advance to ``shared`` (the operator's event time after the previous batch,
        or None) and join ``rows`` (None: the batch has none) in the stores of
        ``handle``."""
        raise NotImplementedError

    def columns(self, joined: list[Any]) -> dict[str, list[Any]]:
        """The output columns of the joined rows, by output name."""
        raise NotImplementedError

    def run(self, batches: Iterator[pa.RecordBatch], context: TaskContext) -> Iterator[Any]:
        """The partition's batch: state and inputs taken, joined, committed; then the
        joined rows as one record batch (none when nothing joined)."""
        joined: list[Any] = []
        with state_and_inputs(
            self.backend,
            self.name,
            context,
            self.specs(),
            self.num_partitions,
            batches,
            shared_event_time=True,
            key_types=self.key_types,
            coordinator=self.coordinator,
            key_groups=self.key_groups,
        ) as (handle, _, inputs, shared):
            rows = None
            if inputs:
                table = deterministic_order(pa.Table.from_batches(inputs), self.order)
                rows = join_rows(table, self.keys, self.tags)
            joined, event_time, dropped = self.step(handle, rows, shared, context.info.batch_id)
            handle.note_event_time(event_time)
            handle.note(late_dropped=dropped, emitted=len(joined))
        if joined:
            yield record_batch(arrow_schema(self.out_schema_json), self.columns(joined))
