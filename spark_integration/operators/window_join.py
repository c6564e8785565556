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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessionstore.checkpoint import StoreHandle
from sessionstore.operators.window_join import LEFT, RIGHT, WindowedJoin
from sessionstore.stores.spec import StoreSpec
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.intervals import interval_ms
from spark_integration.execution.join_task import JoinRows, JoinStep, JoinTask
from spark_integration.operators.join_skeleton import join_state_map
from spark_integration.planning.input_columns import checked_fields, time_column

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
    l_fields = checked_fields(left_df, [left_timestamp], "the left input", keys)
    r_fields = checked_fields(right_df, [right_timestamp], "the right input", keys)
    within_ms, grace_ms = interval_ms(within, "within"), interval_ms(grace, "grace")
    right_out = {c: (f"right_{c}" if c in l_fields else c) for c in r_fields}
    out_schema = T.StructType(
        list(left_df.schema.fields)
        + [T.StructField(right_out[c], r_fields[c].dataType, True) for c in r_fields]
    )
    sides = [
        (left_df, time_column(l_fields, left_timestamp)[0], list(l_fields), _LEFT),
        (right_df, time_column(r_fields, right_timestamp)[0], list(r_fields), _RIGHT),
    ]
    return join_state_map(
        sides, keys, _WindowJoinTask, out_schema, backend, num_partitions, name,
        within_ms=within_ms, grace_ms=grace_ms, left_cols=list(l_fields), right_out=right_out,
    )  # fmt: skip


@dataclass(kw_only=True)
class _WindowJoinTask(JoinTask):
    within_ms: int
    grace_ms: int
    left_cols: list[str]
    right_out: dict[str, str]

    def specs(self) -> list[StoreSpec]:
        retention = WindowedJoin.retention_ms(self.within_ms, self.grace_ms)
        return [StoreSpec("left", "messages", retention), StoreSpec("right", "messages", retention)]

    def step(
        self, handle: StoreHandle, rows: JoinRows | None, shared: int | None, batch_id: int
    ) -> JoinStep:
        join = WindowedJoin(handle["left"], handle["right"], self.within_ms, self.grace_ms)
        if shared is not None:
            join.advance(shared)
        pairs = [] if rows is None else self._join(join, rows, batch_id)
        return JoinStep(pairs, join.stream_time, join.dropped_records)

    def columns(self, joined: list[Any]) -> dict[str, list[Any]]:
        columns = {c: [p.value[0][c] for p in joined] for c in self.left_cols}
        for c, out in self.right_out.items():
            columns[out] = [p.value[1][c] for p in joined]
        return columns

    def _join(self, join: WindowedJoin, rows: JoinRows, batch_id: int) -> list:
        sides = [LEFT if s == 0 else RIGHT for s in rows.sides]
        offsets = [batch_id * _OFFSET_STRIDE + i for i in range(len(sides))]
        return join.process_rows(sides, rows.keys, rows.times, rows.values, offsets)
