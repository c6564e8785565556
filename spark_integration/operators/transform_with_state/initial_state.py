"""The initial state of ``transform_with_state``: planned on the driver, written
to the checkpoint once, read by each task of the query's first batch.

The rows are routed to the partitions their stream rows go to (one Spark job,
:func:`route_initial_state`) and written per partition under the operator
(``initial_state/<token>/<partition>``, Arrow IPC, then
``initial_state/<token>/complete``); the tasks' closure carries only the token.
:func:`initial_state_token` decides, from what the partitions committed, whether
a planning writes a copy, reuses one or deletes it; :func:`read_initial_state`
gives a task its partition's items by key, in the form the processor's
``handleInitialState`` takes.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.checkpoint.records.layout import (
    INITIAL_STATE_DIR,
    initial_state_complete_name,
    initial_state_name,
    initial_state_tokens,
    newest_committed,
)
from sessionstore.checkpoint.storage.filesystem import Storage
from spark_integration.execution.inputs import deterministic_order
from spark_integration.operators.transform_with_state.frames import (
    PandasConf,
    reindexed,
    spark_pandas,
)
from spark_integration.operators.transform_with_state.grouping import group_bounds
from spark_integration.operators.transform_with_state.rows import row_maker

__all__ = [
    "PID",
    "initial_state_token",
    "route_initial_state",
    "write_initial_state",
    "read_initial_state",
    "initial_items",
]

#: The partition of each routed initial-state row (:func:`route_initial_state`).
PID = "__ss_pid"
#: A partition that committed this version ran batch 1: batch 0 never runs again
#: (:func:`initial_state_token`).
_PAST_BATCH_0 = 2


def initial_state_token(
    operator: Storage, num_partitions: int, route: Callable[[], pa.Table]
) -> str | None:
    """The token of the initial state's copy in the checkpoint
    (``initial_state/<token>/<partition>``) that the tasks of batch 0 read, or None
    when batch 0 can no longer run. ``route()`` is the Spark job that routes the
    rows to partitions (:func:`route_initial_state`), run only when a copy is
    written.

    A task reads the copy when it loads version 0, i.e. in batch 0: its first
    attempt, a retry, or a replay by a restarted query. Spark replays a batch its
    commit log lacks (the driver died after the tasks, a ``foreachBatch`` sink
    failed), even when every partition committed version 1. So, by the newest
    version any partition committed (:func:`newest_committed`):

    * 2 or more: a partition ran batch 1, which Spark starts only once batch 0 is
      in its commit log, so batch 0 never runs again: a copy left is deleted, no
      job runs (Spark ignores the initial state of a query restarted with state).
      Deleting it sooner, in a task of batch 1, would race with an attempt of
      batch 0 still running (a speculative copy) and cost every partition a
      request, for one copy of the initial state kept until the next planning;
    * 1: batch 0 committed in some partitions, maybe not all: the copy it ran with
      is reused as is (no job, no writes), so a partition that has not committed
      batch 0, or a replay, finds the rows its peers saw. Only a whole copy (its
      ``complete`` object written) counts; without one a copy is written as for 0;
    * 0: a new copy replaces any earlier one, as the initial state the query is
      started with is the one its first batch takes.
    """
    newest = newest_committed(operator, num_partitions, enough=_PAST_BATCH_0)
    if newest >= _PAST_BATCH_0:
        if operator.list_files(INITIAL_STATE_DIR):
            operator.delete_dir(INITIAL_STATE_DIR)
        return None
    if newest >= 1:
        tokens = initial_state_tokens(operator)
        if len(tokens) == 1:  # a planning replaces the whole folder: never more than one
            return tokens[0]
    return write_initial_state(operator, route())


def route_initial_state(initial_state: Any, df: Any, keys: list[str], n: int) -> pa.Table:
    """The initial state's rows as one Arrow table, each row's partition in column
    :data:`PID` (one Spark job).

    Rows are routed by Spark's own ``repartition(n, *keys)`` on the stream's key
    types, so every key lands in the partition its stream rows go to."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in df.schema.fields}
    cast = initial_state.select(
        *[
            F.col(c).cast(types[c]).alias(c) if c in keys else F.col(c)
            for c in initial_state.columns
        ]
    )
    return cast.repartition(n, *keys).withColumn(PID, F.spark_partition_id()).toArrow()


def write_initial_state(operator: Storage, routed: pa.Table) -> str:
    """Write the rows of each partition of ``routed`` (:func:`route_initial_state`)
    to ``initial_state/<token>/<partition>`` (Arrow IPC) under the operator, then
    the copy's ``complete`` object, and return the new token.

    Each task of the first batch reads its own partition's rows (one read); the
    tasks' closure carries only the token, where it carried every partition's rows
    to every task of every batch. The copy of an earlier planning is deleted."""
    pids = routed.column(PID)
    table = routed.drop_columns([PID])
    operator.delete_dir(INITIAL_STATE_DIR)
    token = uuid.uuid4().hex

    def write(pid: int) -> None:
        part = table.filter(pc.equal(pids, pid))
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part)
        operator.write_atomic(initial_state_name(token, pid), sink.getvalue())

    partitions = pc.unique(pids).to_pylist()  # only partitions with rows get an object
    with ThreadPoolExecutor(min(16, max(1, len(partitions)))) as pool:
        list(pool.map(write, partitions))  # I/O bound: pyarrow releases the GIL
    # last: a later planning reuses only a whole copy (initial_state_token)
    operator.write_atomic(initial_state_complete_name(token), b"")
    return token


def read_initial_state(
    operator: Storage, token: str, partition: int, keys: list[str], api: str,
    conf: PandasConf | None,
) -> dict[tuple, list[Any]] | None:  # fmt: skip
    """The initial-state items of ``partition`` by key (one read of what the
    planning wrote under ``token``), None when the partition has none."""
    try:
        raw = operator.read(initial_state_name(token, partition))
    except FileNotFoundError:  # no initial rows for this partition
        return None
    return initial_items(pa.ipc.open_stream(raw).read_all(), keys, api, conf)


def initial_items(
    table: pa.Table, keys: list[str], api: str, conf: PandasConf | None
) -> dict[tuple, list[Any]]:
    """Initial-state rows by key tuple, in the operator's deterministic order, as
    ``handleInitialState`` takes them: one pandas DataFrame per key (api
    ``pandas``, converted as Spark's worker converts input) or one ``Row`` per
    row (api ``rows``)."""
    table = deterministic_order(table, keys)
    key_cols = [table.column(k).to_pylist() for k in keys]
    key_list = list(zip(*key_cols, strict=True))
    out: dict[tuple, list[Any]] = {}
    if api == "pandas":
        frame = spark_pandas(table, (conf or PandasConf()).timezone)
        for start, end in group_bounds(key_list):
            out[key_list[start]] = [reindexed(frame.iloc[start:end])]
    else:
        make = row_maker(table.column_names)
        rows = list(zip(*[c.to_pylist() for c in table.columns], strict=True))
        for start, end in group_bounds(key_list):
            out[key_list[start]] = [make(r) for r in rows[start:end]]
    return out
