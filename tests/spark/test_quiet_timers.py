"""Quiet streams for transform_with_state: processor timers fire with no new row,
in a batch the due source runs for them (spark_integration/planning/due_timers.py),
as under Spark's own transformWithState(InPandas).

Each differential test runs Spark's operator and ours over the same files on
processing-time triggers, then lets the input go quiet: both write the same
expiry rows within a few triggers, and ours runs one batch for them, then none."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from spark_integration import StateBackend, transform_with_state, transform_with_state_in_pandas
from tests.spark import processors as P
from tests.spark.streams import json_source, spark_confs, write_json
from tests.spark.test_quiet_streams import FIRST, SCHEMA, SECOND, T0, TRIGGER, Collected, wait_for

pytestmark = pytest.mark.slow

PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


SHUFFLE = "spark.sql.shuffle.partitions"


@pytest.fixture
def rocksdb(spark):
    """Spark's transformWithState runs only on its RocksDB provider; here on one
    shuffle partition, as each key's expiry does not depend on its partition and
    every partition costs each of its batches (one per trigger) a task, a Python
    worker and a RocksDB commit. Ours set their own partition count. Both confs
    are restored after."""
    with spark_confs(spark, {PROVIDER: ROCKSDB, SHUFFLE: "1"}):
        yield


def sparks(stream: Any, processor: Any, schema: str, time_mode: str) -> Any:
    return stream.groupBy("user").transformWithStateInPandas(
        statefulProcessor=processor, outputStructType=schema, outputMode="Append",
        timeMode=time_mode,
    )  # fmt: skip


def ours(api: str, processor: Any, schema: str, time_mode: str, backend: StateBackend,
         name: str) -> Any:  # fmt: skip
    run = transform_with_state_in_pandas if api == "pandas" else transform_with_state
    return lambda stream: run(
        stream, "user", processor, schema, time_mode=time_mode, backend=backend, name=name
    )


class Running(Collected):
    """:class:`Collected` for a query that may run a batch on every trigger (Spark's
    transformWithState in processing time), where ``processAllAvailable`` never
    returns: waits for progress reports instead."""

    def _started(self) -> None:
        wait_for(lambda: self.query.lastProgress is not None, timeout=120)

    def took(self, rows: int) -> None:
        """Wait until the query has read ``rows`` input rows in all."""
        wait_for(
            lambda: sum(p["numInputRows"] for p in self.query.recentProgress) >= rows,
            timeout=120,
        )


class Appeared:
    """When ``rows(query)`` first held ``want`` (monotonic seconds)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def check(self, queries: dict[str, Collected], want: list, rows: Any) -> bool:
        for name, q in queries.items():
            if name not in self.at and rows(q) == want:
                self.at[name] = time.monotonic()
        return len(self.at) == len(queries)


def quiet(
    spark: Any,
    tmp_path: Path,
    builds: dict,
    files: list[list[dict]],
    want: list,
    rows: Any,
    idle_s: float = 3.0,
) -> tuple[dict[str, Collected], dict[str, float]]:
    """Start each build over one folder; write ``files`` one batch each; wait until
    every query's ``rows(q) == want``; stay idle ``idle_s``; stop. The queries and
    how long after the last file each took to write ``want``."""  # fmt: skip
    source = tmp_path / "in"
    source.mkdir()
    queries = {
        name: Running(build(json_source(spark, source, SCHEMA)), tmp_path / f"ck-{name}")
        for name, build in builds.items()
    }
    appeared = Appeared()
    try:
        taken = 0
        for i, rows_ in enumerate(files):
            write_json(source, i, rows_)
            taken += len(rows_)
            for q in queries.values():
                q.took(taken)
        written = time.monotonic()
        wait_for(lambda: appeared.check(queries, want, rows), timeout=60)
        time.sleep(idle_s)
    finally:
        for q in queries.values():
            q.query.stop()
    return queries, {k: round(t - written, 1) for k, t in appeared.at.items()}


def test_processing_time_timers_fire_on_a_quiet_stream_as_in_spark(spark, tmp_path, rocksdb):
    """A processor expiring a key 2.5 s (processing time, 5 triggers) after its last
    row, through Spark's transformWithStateInPandas and ours (pandas and row API):
    the input goes quiet after one file; every query writes each key's expiry
    within a few triggers of its deadline, with no new row, and ours runs one batch
    for them over the idle period, then none. (Spark's query runs a batch per
    trigger until the deadline: a longer one only costs more of them.)"""
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    mode = "ProcessingTime"
    idle = 2_500
    # ours start first: their due sources' Python workers start before Spark's
    # query keeps the machine busy with a batch per trigger
    builds = {
        "pandas": ours("pandas", P.PandasIdleExpiry(idle), P.IDLE_SCHEMA, mode, backend, "pandas"),
        "rows": ours("rows", P.RowIdleExpiry(idle), P.IDLE_SCHEMA, mode, backend, "rows"),
        "spark": lambda s: sparks(s, P.PandasIdleExpiry(idle), P.IDLE_SCHEMA, mode),
    }
    want = [("a", 2), ("b", 1)]

    def rows(q):
        return sorted((r["id"], r["events"]) for r in q.rows)

    queries, after = quiet(spark, tmp_path, builds, [FIRST], want, rows)
    print({k: (q.batches, q.idle_batches(), after[k]) for k, q in queries.items()})
    for q in queries.values():
        assert rows(q) == want
    assert queries["pandas"].idle_batches() == 1
    assert queries["rows"].idle_batches() == 1
    assert queries["spark"].idle_batches() >= 1  # ours no more than Spark's
    # due 2.5 s after the file's batch: ours written within a few triggers of Spark's
    assert after["pandas"] <= after["spark"] + 3
    assert after["rows"] <= after["spark"] + 3


def test_event_time_timers_fire_on_a_quiet_stream_as_in_spark(spark, tmp_path, rocksdb):
    """An event-time processor (a timer 10 ms after a key's latest event), through
    Spark's transformWithStateInPandas and ours: a second file moves the watermark
    past the first file's timers, then the input goes quiet. Both fire them, with
    no new row, in one batch after the second file's."""
    from pyspark.sql import functions as F

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    mode = "EventTime"

    def timed(build):
        def with_watermark(stream):
            stream = stream.withColumn("t", F.timestamp_millis("ts"))
            return build(stream.withWatermark("t", "10 seconds"))

        return with_watermark

    builds = {
        "spark": timed(lambda s: sparks(s, P.PandasExpiry(), P.TIMER_SCHEMA, mode)),
        "pandas": timed(ours("pandas", P.PandasExpiry(), P.TIMER_SCHEMA, mode, backend, "et")),
    }
    want = [("a", 2, T0 + 4_010), ("b", 1, T0 + 1_010)]

    def rows(q):
        return sorted((r["id"], r["events"], r["fired_at"]) for r in q.rows)

    queries, after = quiet(spark, tmp_path, builds, [FIRST, SECOND], want, rows)
    print({k: (q.batches, q.idle_batches(), after[k]) for k, q in queries.items()})
    for q in queries.values():
        assert rows(q) == want  # c's timer waits for the event time to pass it
        assert q.idle_batches() == 1


def test_a_pending_timer_fires_after_a_restart_without_input_and_replays_alike(spark, tmp_path):
    """What is due is read from the checkpoint: an ``availableNow`` run takes one
    file and stops with its keys' processing-time timers pending; a restart on a
    processing-time trigger, with no new row, fires them in one batch without
    input, and nothing after it. That due-only batch, replayed (its entry removed
    from Spark's commit log, as when the driver dies after the state commit and
    before Spark's), emits exactly the same rows."""
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    source = tmp_path / "in"
    write_json(source, 0, FIRST)
    checkpoint = tmp_path / "ck"
    by_batch: dict[int, list] = {}

    def start(trigger: dict) -> Any:
        out = transform_with_state(
            json_source(spark, source, SCHEMA), "user", P.RowIdleExpiry(), P.IDLE_SCHEMA,
            time_mode="ProcessingTime", backend=backend, name="restarted",
        )  # fmt: skip

        def take(batch, batch_id):
            rows = sorted((r["id"], r["events"]) for r in batch.collect())
            by_batch[batch_id] = [*by_batch.get(batch_id, []), rows]

        return (
            out.writeStream.trigger(**trigger).option("checkpointLocation", str(checkpoint))
            .foreachBatch(take).start()
        )  # fmt: skip

    def fired():
        return [b for b, runs in by_batch.items() if runs[-1]]

    start({"availableNow": True}).awaitTermination(120)
    before = set(by_batch)
    assert fired() == []
    query = start({"processingTime": TRIGGER})
    try:
        wait_for(lambda: fired() != [], timeout=60)
        time.sleep(2)  # idle: nothing more is due
    finally:
        query.stop()
    (due,) = fired()
    assert due not in before and max(by_batch) == due  # one batch, after the restart
    assert by_batch[due] == [[("a", 2), ("b", 1)]]
    (checkpoint / "commits" / str(due)).unlink()
    query = start({"processingTime": TRIGGER})
    try:
        wait_for(lambda: len(by_batch[due]) == 2, timeout=60)
        time.sleep(2)
    finally:
        query.stop()
    assert by_batch[due] == [[("a", 2), ("b", 1)]] * 2  # the replay emits the same rows
    assert max(by_batch) == due  # and nothing after it
