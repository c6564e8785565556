"""``window_join``: inner join of two streams whose event times lie within a window.

Both inputs are tagged, unioned and hash-partitioned by key; each partition buffers
each side's rows in a message store and runs
:class:`~sessionstore.operators.WindowedJoin` (SAMZA-552) in ``mapInArrow``: a row
is joined with the other side's rows within ``within`` of its event time, each
pair emitted once. Rows of a batch are processed in a deterministic order (by
time, then content), and a row's offset is its position in that order within the
batch, so a retried batch buffers and joins exactly the same rows.

Before each batch every partition advances to the operator's event time after the
previous one (the largest row time any partition had, shared as sessionize shares
its own, :mod:`sessionstore.checkpoint.records.event_time`): rows are late against the
query's event time, not their partition's, and a partition whose keys went quiet
still expires its buffers. The due source
(:mod:`spark_integration.planning.due_batches`) makes Spark run that batch, without
rows, when nothing else arrives, as Spark runs one for its own join's eviction.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sessionstore.operators.batch_paths.arrow_io import epoch_millis
from sessionstore.operators.window_join import LEFT, RIGHT, WindowedJoin
from sessionstore.stores.spec import StoreSpec
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.intervals import interval_ms
from spark_integration.conf.names import SIDE, TS
from spark_integration.coordinator.protocol import CoordinatorAddress
from spark_integration.execution.context import TaskContext
from spark_integration.execution.inputs import deterministic_order, key_values, struct_values
from spark_integration.execution.output import arrow_schema, record_batch
from spark_integration.execution.partition_state import state_and_inputs
from spark_integration.planning.due_batches import with_due_batches
from spark_integration.planning.input_columns import (
    checked_fields,
    key_types,
    tagged_union,
    time_column,
)
from spark_integration.planning.placement import state_map
from spark_integration.planning.resolve import operator_coordinator, resolve

__all__ = ["window_join"]

_LEFT, _RIGHT = "__ss_left", "__ss_right"
_OFFSET_STRIDE = 1 << 32  # offsets: batch id in the high bits, row position below


def window_join(
    left_df: Any,
    right_df: Any,
    key: str | Sequence[str],
    left_timestamp: str,
    right_timestamp: str,
    within: str | int,
    grace: str | int = "0 seconds",
    backend: StateBackend | None = None,
    name: str = "window_join",
    num_partitions: int | None = None,
) -> Any:
    """Pairs of left and right rows with the same key and event times at most
    ``within`` apart. Output: the left columns, then the right columns (prefixed
    with ``right_`` where a name clashes). Rows later than ``within + grace``
    behind the query's event time are dropped."""
    from pyspark.sql import types as T

    keys = [key] if isinstance(key, str) else list(key)
    l_fields = checked_fields(left_df, [*keys, left_timestamp], "the left input")
    r_fields = checked_fields(right_df, [*keys, right_timestamp], "the right input")
    within_ms, grace_ms = interval_ms(within, "within"), interval_ms(grace, "grace")
    right_out = {c: (f"right_{c}" if c in l_fields else c) for c in r_fields}
    out_schema = T.StructType(
        list(left_df.schema.fields)
        + [T.StructField(right_out[c], r_fields[c].dataType, True) for c in r_fields]
    )
    left_ts, _ = time_column(l_fields, left_timestamp)
    right_ts, _ = time_column(r_fields, right_timestamp)
    combined = tagged_union(
        keys,
        [
            (left_df, left_ts, list(l_fields), _LEFT),
            (right_df, right_ts, list(r_fields), _RIGHT),
        ],
    )
    backend, n = resolve(left_df, backend, num_partitions, name)
    coordinator = operator_coordinator(left_df, backend, name, n)  # metrics to the driver
    combined = with_due_batches(combined, backend, name, n)
    task = _WindowJoinTask(
        backend=backend,
        name=name,
        num_partitions=n,
        keys=keys,
        within_ms=within_ms,
        grace_ms=grace_ms,
        left_cols=list(l_fields),
        right_out=right_out,
        out_schema_json=out_schema.json(),
        key_types=key_types(combined, keys),
        coordinator=coordinator,
    )
    return state_map(combined, keys, n, task, out_schema, name)


@dataclass
class _WindowJoinTask:
    backend: StateBackend
    name: str
    num_partitions: int
    keys: list[str]
    within_ms: int
    grace_ms: int
    left_cols: list[str]
    right_out: dict[str, str]
    out_schema_json: str
    key_types: list[str]
    coordinator: CoordinatorAddress | None = None

    def run(self, batches: Iterator[pa.RecordBatch], context: TaskContext) -> Iterator[Any]:
        info = context.info
        retention = WindowedJoin.retention_ms(self.within_ms, self.grace_ms)
        specs = [
            StoreSpec("left", "messages", retention),
            StoreSpec("right", "messages", retention),
        ]
        pairs = []
        with state_and_inputs(
            self.backend,
            self.name,
            context,
            specs,
            self.num_partitions,
            batches,
            shared_event_time=True,
            key_types=self.key_types,
            coordinator=self.coordinator,
        ) as (handle, _, inputs, shared):
            join = WindowedJoin(handle["left"], handle["right"], self.within_ms, self.grace_ms)
            if shared is not None:
                join.advance(shared)
            if inputs:
                table = deterministic_order(pa.Table.from_batches(inputs), [TS, SIDE])
                pairs = self._join(join, table, info.batch_id)
            handle.note_event_time(join.stream_time)
            handle.note(late_dropped=join.dropped_records, emitted=len(pairs))
        if pairs:
            columns = {c: [p.value[0][c] for p in pairs] for c in self.left_cols}
            for c, out in self.right_out.items():
                columns[out] = [p.value[1][c] for p in pairs]
            yield record_batch(arrow_schema(self.out_schema_json), columns)

    def _join(self, join: WindowedJoin, table: pa.Table, batch_id: int) -> list:
        n = table.num_rows
        sides = [LEFT if s == 0 else RIGHT for s in table.column(SIDE).to_pylist()]
        times = epoch_millis(table.column(TS))
        keys = key_values(table, self.keys)
        lefts, rights = struct_values(table, _LEFT), struct_values(table, _RIGHT)
        values = [lefts[i] if sides[i] == LEFT else rights[i] for i in range(n)]
        offsets = [batch_id * _OFFSET_STRIDE + i for i in range(n)]
        return join.process_rows(sides, keys, times, values, offsets)
