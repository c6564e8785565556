"""``temporal_join``: join a stream with a table as of each stream row's event time.

Both inputs are tagged, unioned and hash-partitioned by key; each partition keeps
the table's versions in a :class:`~sessionstore.VersionedStore` (KIP-889) and runs
:class:`~sessionstore.operators.TemporalJoin` in ``mapInArrow``. Within a
micro-batch the table rows are applied before the stream rows are looked up: the
answer depends only on event times (the version valid at the stream row's time),
not on how the two inputs interleave in the batch. A stream row older than the
table's history retention is dropped rather than joined with a wrong version.

"Older" is measured against the operator's event time after the previous batch
(the largest table time of any partition, shared as sessionize shares its own,
:mod:`sessionstore.checkpoint.records.event_time`), held through the batch
(``VersionedStore.stream_time_held``): a row is dropped when its time is more than
the history retention before that, in every partition alike. So the output does
not depend on the partition count or on which keys share a partition, and a
rescaled checkpoint continues as the uninterrupted query would (docs/rescale.md).
The advance is also what expires history older than the retention in a partition
whose keys went quiet; the due source (:mod:`spark_integration.planning.due_batches`)
makes Spark run that batch, without rows, when nothing else arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionstore.checkpoint import StoreHandle
from sessionstore.operators.temporal_join import TemporalJoin
from sessionstore.stores.spec import StoreSpec
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.intervals import interval_ms
from spark_integration.conf.names import SIDE, TS
from spark_integration.execution.join_task import JoinRows, JoinStep, JoinTask
from spark_integration.operators.join_skeleton import join_state_map
from spark_integration.planning.input_columns import checked_fields, time_column

__all__ = ["temporal_join", "plan_temporal_join", "TemporalJoinTask"]

_STREAM, _TABLE = "__ss_stream", "__ss_table"
_TABLE_SIDE, _STREAM_SIDE = 0, 1  # their order in the union


def temporal_join(
    stream_df: Any,
    table_df: Any,
    key: str | Sequence[str],
    stream_timestamp: str,
    table_timestamp: str,
    history_retention: str | int,
    how: str = "inner",
    backend: StateBackend | None = None,
    name: str = "temporal_join",
    num_partitions: int | None = None,
) -> Any:
    """Each stream row with the table's values valid at its event time.

    Output: the stream's columns, then the table's other columns (prefixed with
    ``table_`` where a name clashes). ``how="left"`` keeps stream rows without a
    table value (table columns null). A table row whose value columns are all null
    is a delete.
    """
    sides, keys, out_schema, settings = plan_temporal_join(
        stream_df, table_df, key, stream_timestamp, table_timestamp, history_retention, how
    )
    return join_state_map(
        sides, keys, TemporalJoinTask, out_schema, backend, num_partitions, name, **settings
    )


def plan_temporal_join(
    stream_df: Any,
    table_df: Any,
    key: str | Sequence[str],
    stream_timestamp: str,
    table_timestamp: str,
    history_retention: str | int,
    how: str,
) -> tuple[list[tuple[Any, Any, list[str], str]], list[str], Any, dict[str, Any]]:
    """``temporal_join``'s arguments checked, before any state: ``(its sides in
    side-number order, the key columns, the output schema, the task's own
    settings)`` (shared by :func:`temporal_join` and ``bootstrap_temporal_join``)."""
    from pyspark.sql import types as T

    if how not in ("inner", "left"):
        raise ValueError(f"how must be 'inner' or 'left', got {how!r}")
    keys = [key] if isinstance(key, str) else list(key)
    retention_ms = interval_ms(history_retention, "history_retention")
    s_fields = checked_fields(stream_df, [stream_timestamp], "the stream input", keys)
    t_fields = checked_fields(table_df, [table_timestamp], "the table input", keys)

    table_values = [c for c in t_fields if c not in keys and c != table_timestamp]
    out_fields = list(stream_df.schema.fields)
    renamed = {}
    for column in table_values:
        out_name = f"table_{column}" if column in s_fields else column
        renamed[column] = out_name
        out_fields.append(T.StructField(out_name, t_fields[column].dataType, True))
    out_schema = T.StructType(out_fields)

    stream_cols = list(s_fields)
    table_time, table_time_type = time_column(t_fields, table_timestamp)
    sides = [  # in side-number order: _TABLE_SIDE, _STREAM_SIDE
        (table_df, table_time, table_values, _TABLE),
        (stream_df, time_column(s_fields, stream_timestamp)[0], stream_cols, _STREAM),
    ]
    settings = dict(
        retention_ms=retention_ms,
        how=how,
        stream_cols=stream_cols,
        table_values=table_values,
        renamed=renamed,
        # the table's versions are its rows' times: timestamps where its column is
        time_type="timestamp" if isinstance(table_time_type, T.TimestampType) else None,
    )
    return sides, keys, out_schema, settings


@dataclass(kw_only=True)
class TemporalJoinTask(JoinTask):
    retention_ms: int
    how: str
    stream_cols: list[str]
    table_values: list[str]
    renamed: dict[str, str]
    time_type: str | None = None

    #: table rows before stream rows: the answer then depends on event times only
    order: ClassVar[tuple[str, ...]] = (SIDE, TS)

    def specs(self) -> list[StoreSpec]:
        return [StoreSpec("table", "versioned", self.retention_ms)]

    def step(
        self, handle: StoreHandle, rows: JoinRows | None, shared: int | None, batch_id: int
    ) -> JoinStep:
        table = handle["table"]
        # Every partition judges the batch by the operator's event time after
        # the previous one (the largest table time any partition had), held
        # through the batch: a row's fate then depends on its key's rows and
        # that time only, never on which keys share its partition, so the
        # output is the same at any partition count (and after a rescale).
        if shared is not None:
            table.advance_stream_time(shared)
        join = TemporalJoin(
            table, joiner=lambda s, t: (s, t), how=self.how, time_type=self.time_type
        )
        joined = []
        if rows is not None:
            with table.stream_time_held():
                joined = self._join(join, rows)
        return JoinStep(joined, table.observed_stream_time, join.dropped_records)

    def columns(self, joined: list[Any]) -> dict[str, list[Any]]:
        columns = {c: [s[c] for s, _ in joined] for c in self.stream_cols}
        for column in self.table_values:
            columns[self.renamed[column]] = [None if t is None else t[column] for _, t in joined]
        return columns

    def _join(self, join: TemporalJoin, rows: JoinRows) -> list:
        sides, keys, times, values = rows
        # table rows first: the answer then depends on event times only
        for i, side in enumerate(sides):
            if side == _TABLE_SIDE and keys[i] is not None and times[i] is not None:
                row = values[i]
                deleted = row is None or all(v is None for v in row.values())
                join.process_table(keys[i], None if deleted else row, times[i])
        stream = [i for i, side in enumerate(sides) if side == _STREAM_SIDE]
        results = join.process_streams(
            [keys[i] for i in stream], [values[i] for i in stream], [times[i] for i in stream]
        )  # one store read per key, not per stream row
        return [r.value for r in results if r is not None]
