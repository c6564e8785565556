"""Quiet streams: what time made due is emitted in a batch Spark runs for it, with no
new row, as Spark's own operators do (spark_integration/planning/due_batches.py).

Each test runs Spark's own operator and ours side by side over the same files, on
processing-time triggers: a first file, then a file whose event time closes what
the first opened, then nothing. Both must emit the same rows within a few triggers,
and ours no more batches than Spark's over the idle period: :data:`IDLE_TRIGGERS`
triggers in a row, counted (each reports its progress), that ran no batch."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from spark_integration import StateBackend, sessionize, window_aggregate
from spark_integration.datasource import register
from tests.spark.streams import json_source, spark_confs, write_json

pytestmark = pytest.mark.slow

SCHEMA = "user string, ts long"
GAP_S = 30
T0 = 1_700_000_000_000
#: two users' clicks around T0, then one click 5 minutes later: its event time
#: passes both sessions (and every window) of the first file
FIRST = [
    {"user": "a", "ts": T0},
    {"user": "a", "ts": T0 + 4_000},
    {"user": "b", "ts": T0 + 1_000},
]
SECOND = [{"user": "c", "ts": T0 + 300_000}]
TRIGGER = "500 milliseconds"
#: The idle period after the last batch a test waits for: this many triggers in a
#: row that ran no batch. What is due is a function of the checkpoint, which does
#: not change while the input is quiet, so a batch that should not run would run at
#: the first of them; counting triggers (not seconds) keeps the period whole when a
#: loaded machine runs fewer triggers per second.
IDLE_TRIGGERS = 6
#: Spark reports a trigger that ran no batch every so often (10 s by default), with
#: the id of the batch that has not run yet; at 0 it reports every such trigger,
#: which is how the idle triggers are counted. The number of progress reports kept
#: is raised to cover a whole test at 2 triggers per second.
PROGRESS_CONFS = {
    "spark.sql.streaming.noDataProgressEventInterval": "0",
    "spark.sql.streaming.numRecentProgressUpdates": "2000",
}


class Collected:
    """A running query's rows and the micro-batches it ran (foreachBatch)."""

    def __init__(self, out: Any, checkpoint: Path, mode: str = "append") -> None:
        self.rows: list[dict] = []
        #: the id of every micro-batch run (the sink is called once for each,
        #: batches without input included)
        self.ran: list[int] = []
        with spark_confs(out.sparkSession, PROGRESS_CONFS):  # read when the query starts
            self.query = (
                out.writeStream.outputMode(mode)
                .trigger(processingTime=TRIGGER)
                .option("checkpointLocation", str(checkpoint))
                .foreachBatch(self._take)
                .start()
            )
        self._started()

    def _started(self) -> None:
        """Wait until the query has started (one Python source at a time)."""
        self.query.processAllAvailable()

    def _take(self, batch: Any, batch_id: int) -> None:
        self.rows += [r.asDict() for r in batch.collect()]
        self.ran.append(batch_id)

    @property
    def batches(self) -> int:
        """How many micro-batches the query ran."""
        return len(self.ran)

    def idle_batches(self) -> int:
        """How many micro-batches ran after the last one with input rows (the batches
        the sink saw: a report of a trigger that ran none, which carries the id of
        the next batch, is not one)."""
        progress = self.query.recentProgress
        last = max(p["batchId"] for p in progress if p["numInputRows"])
        return len({b for b in self.ran if b > last})

    def idle_triggers(self) -> int:
        """How many triggers in a row ran no batch since the last one that did."""
        return idle_triggers(self.query, max(self.ran, default=-1))


def idle_triggers(query: Any, newest: int) -> int:
    """How many triggers of ``query`` ran no batch since batch ``newest``: each
    reports its progress (:data:`PROGRESS_CONFS`) with the id of the batch after it."""
    return sum(1 for p in query.recentProgress if p["batchId"] > newest)


def wait_for(check: Callable[[], bool], timeout: float = 30.0, every: float = 0.1) -> None:
    """Wait until ``check()`` holds (polling, ``every`` seconds)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(every)


def wait_idle(idle_counts: Iterable[Callable[[], int]]) -> None:
    """Wait until each query, through its count of triggers in a row without a batch
    (:meth:`Collected.idle_triggers`, :func:`idle_triggers`), ran :data:`IDLE_TRIGGERS`
    of them (the idle period: what was due has run). Polled once a trigger: each
    look reads every progress report the query kept."""
    counts = list(idle_counts)
    wait_for(lambda: all(c() >= IDLE_TRIGGERS for c in counts), timeout=60.0, every=0.5)


def run_quiet(spark: Any, tmp_path: Path, builds: dict[str, tuple[Callable, str]],
              expected: Callable[[dict], bool]) -> dict[str, Collected]:
    """Start each ``build(stream)`` (with its output mode) over one folder; write
    FIRST, let every query take it, write SECOND, wait until ``expected(queries)``
    holds, then until each query is idle (:func:`wait_idle`) and stop them. The
    queries, with their rows and batch counts (those after SECOND's batch in
    ``idle_batches``)."""  # fmt: skip
    source = tmp_path / "in"
    source.mkdir()
    queries = {
        name: Collected(build(json_source(spark, source, SCHEMA)), tmp_path / f"ck-{name}", mode)
        for name, (build, mode) in builds.items()
    }
    try:
        write_json(source, 0, FIRST)
        for q in queries.values():
            q.query.processAllAvailable()
        write_json(source, 1, SECOND)
        for q in queries.values():
            q.query.processAllAvailable()
        wait_for(lambda: expected(queries))
        wait_idle(q.idle_triggers for q in queries.values())
    finally:
        for q in queries.values():
            q.query.stop()
    return queries


def ms(value: Any) -> int:
    return value if isinstance(value, int) else round(value.timestamp() * 1000)


def with_time(stream: Any) -> Any:
    from pyspark.sql import functions as F

    return stream.withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "10 seconds")


def test_quiet_sessions_close_as_sparks_session_window(spark, tmp_path):
    """Item 1 of issue 39: Spark's session_window and sessionize (final, and update
    mode's store) over a stream that goes quiet: the same 2 sessions, written
    without any further row, and over the idle period no more batches than Spark's."""
    from pyspark.sql import functions as F

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))

    def builtin(stream):
        return (
            with_time(stream)
            .groupBy(F.session_window("t", f"{GAP_S} seconds"), "user")
            .agg(F.count("*").alias("n"))
        )

    def ours(emit, name):
        def build(stream):
            return sessionize(
                with_time(stream).drop("ts"), key="user", timestamp="t", gap=f"{GAP_S} s",
                aggregations={"n": "count"}, emit=emit, backend=backend, name=name,
            )  # fmt: skip

        return build

    def closed(rows, start, end):
        return sorted((r["user"], ms(r[start]), r["n"]) for r in rows if r["user"] != "c")

    want = [("a", T0, 2), ("b", T0 + 1_000, 1)]
    builds = {
        "spark": (builtin, "append"),
        "final": (ours("final", "final"), "append"),
        "update": (ours("update", "update"), "update"),
    }

    def spark_rows(qs):
        return [{**r, "s": r["session_window"]["start"]} for r in qs["spark"].rows]

    def done(qs):
        return (
            closed(spark_rows(qs), "s", "s") == want
            and closed(qs["final"].rows, "session_start", "session_start") == want
        )

    queries = run_quiet(spark, tmp_path, builds, done)
    print({k: (q.batches, q.idle_batches(), q.rows) for k, q in queries.items()})
    assert closed(spark_rows(queries), "s", "s") == want
    assert closed(queries["final"].rows, "session_start", "session_start") == want
    # update mode: the close is no row; it shows in the batches run (one more than
    # its data batches, as in final mode) and in the state, where no session of
    # the first file is left open
    assert queries["spark"].idle_batches() == 1
    assert queries["final"].idle_batches() == 1
    assert queries["update"].idle_batches() == 1
    register(spark)
    read = spark.read.format("sessionstore").option("path", backend.checkpoint_uri)
    dump = read.option("operator", "update").option("store", "sessions").load().collect()
    assert sorted(r["key"] for r in dump) == ["c"]


def test_quiet_windows_close_as_sparks_window_aggregation(spark, tmp_path):
    """window_aggregate over a stream that goes quiet, against Spark's windowed
    count with the same watermark: ``final`` writes the same windows, ``on_time``
    the same values at the windows' end, and ``early_every`` an early result of the
    window the last row opened, all without a further row; one idle batch each."""
    from pyspark.sql import functions as F

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))

    def builtin(stream):
        return with_time(stream).groupBy(F.window("t", "10 seconds"), "user").agg(
            F.count("*").alias("n")
        )

    def ours(emit, early, name):
        def build(stream):
            return window_aggregate(
                with_time(stream).drop("ts"), key="user", timestamp="t", size="10 s",
                aggregations={"n": "count"}, emit=emit, early_every=early, backend=backend,
                name=name,
            )  # fmt: skip

        return build

    want = [("a", T0, 2), ("b", T0, 1)]

    def windows(rows, start, emission=None):
        return sorted(
            (r["user"], ms(r[start]), r["n"])
            for r in rows
            if r["user"] != "c" and emission in (None, r.get("emission"))
        )

    def spark_rows(qs):
        return [{**r, "s": r["window"]["start"]} for r in qs["spark"].rows]

    def done(qs):
        return (
            windows(spark_rows(qs), "s") == want
            and windows(qs["final"].rows, "window_start") == want
            and windows(qs["on_time"].rows, "window_start", "on_time") == want
            and any(r["user"] == "c" for r in qs["on_time"].rows)
        )

    builds = {
        "spark": (builtin, "append"),
        "final": (ours("final", None, "final"), "append"),
        "on_time": (ours("on_time", "1 s", "on_time"), "append"),
    }
    queries = run_quiet(spark, tmp_path, builds, done)
    assert windows(spark_rows(queries), "s") == want
    assert windows(queries["final"].rows, "window_start") == want
    assert windows(queries["on_time"].rows, "window_start", "on_time") == want
    early_c = [
        (ms(r["window_start"]), r["n"], r["emission"])
        for r in queries["on_time"].rows
        if r["user"] == "c"
    ]
    assert early_c == [(T0 + 300_000, 1, "early")]
    for q in queries.values():
        assert q.idle_batches() == 1


def test_due_batch_after_a_restart_and_its_replay(spark, tmp_path):
    """What is due is read from the checkpoint, not from driver memory: an
    ``availableNow`` run over both files stops with the first file's sessions due,
    and a restart on a processing-time trigger, with no new row, emits them in a
    batch without input. That due-only batch, replayed (its commit removed from
    Spark's commit log, as when the driver dies after the state commit and before
    Spark's), emits exactly the same rows."""
    from pyspark.sql import functions as F

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    source = tmp_path / "in"
    write_json(source, 0, FIRST)
    write_json(source, 1, SECOND)
    checkpoint = tmp_path / "ck"
    by_batch: dict[int, list] = {}

    def start(trigger: dict) -> Any:
        stream = json_source(spark, source, SCHEMA)
        out = sessionize(
            stream.withColumn("t", F.timestamp_millis("ts")).drop("ts"), key="user",
            timestamp="t", gap=f"{GAP_S} s", grace=0, backend=backend, name="restarted",
        )  # fmt: skip

        def take(batch, batch_id):
            rows = sorted(map(str, batch.collect()))
            by_batch[batch_id] = [*by_batch.get(batch_id, []), rows]

        with spark_confs(spark, PROGRESS_CONFS):  # idle triggers reported, as in Collected
            return (
                out.writeStream.trigger(**trigger).option("checkpointLocation", str(checkpoint))
                .foreachBatch(take).start()
            )  # fmt: skip

    def closed():
        return [b for b, runs in by_batch.items() if any("'a'" in r for r in runs[-1])]

    start({"once": True}).awaitTermination(120)
    before = set(by_batch)
    query = start({"processingTime": TRIGGER})
    try:
        wait_for(lambda: closed() != [])
        # the idle period of run_quiet, after the newest batch taken: nothing more is due
        wait_idle([lambda: idle_triggers(query, max(by_batch))])
    finally:
        query.stop()
    (due,) = closed()
    assert due not in before and max(by_batch) == due  # one batch, after the restart
    first = by_batch[due][0]
    assert [("'a'" in r, "'b'" in r) for r in first] == [(True, False), (False, True)]
    (checkpoint / "commits" / str(due)).unlink()
    query = start({"processingTime": TRIGGER})
    try:
        wait_for(lambda: len(by_batch[due]) == 2)
        # idle: a run that began with a replay reports no progress (Spark 4.x),
        # so the idle triggers cannot be counted here
        time.sleep(2)
    finally:
        query.stop()
    assert by_batch[due] == [first, first]  # the replay emits the same rows
    assert max(by_batch) == due  # and nothing after it


#: a file after SECOND whose event time passes SECOND's session ("c") too
THIRD = [{"user": "a", "ts": T0 + 600_000}]


def run_once(out: Any, checkpoint: Path, trigger: dict, mode: str = "append") -> list[list[dict]]:
    """Run ``out`` to its end on ``trigger`` (``availableNow`` or ``once``): the rows
    of each micro-batch it ran, empty ones included (foreachBatch)."""
    batches: list[list[dict]] = []
    query = (
        out.writeStream.outputMode(mode).trigger(**trigger)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(lambda batch, _: batches.append([r.asDict() for r in batch.collect()]))
        .start()
    )  # fmt: skip
    try:
        assert query.awaitTermination(180), "the run did not end"
    finally:
        query.stop()
    return batches


def session_builds(backend: Any) -> dict[str, Callable[[Any], Any]]:
    """Spark's session_window count and sessionize's (final), each returning rows
    ``user, start, n`` (Spark's window start is sessionize's session start)."""
    from pyspark.sql import functions as F

    def builtin(stream):
        return (
            with_time(stream)
            .groupBy(F.session_window("t", f"{GAP_S} seconds"), "user")
            .agg(F.count("*").alias("n"))
            .select("user", F.col("session_window.start").alias("start"), "n")
        )

    def ours(stream):
        out = sessionize(
            with_time(stream).drop("ts"), key="user", timestamp="t", gap=f"{GAP_S} s",
            aggregations={"n": "count"}, backend=backend, name="sessions",
        )  # fmt: skip
        return out.select("user", F.col("session_start").alias("start"), "n")

    return {"spark": builtin, "ours": ours}


def sessions(batches: list[list[dict]]) -> list[tuple]:
    return sorted((r["user"], ms(r["start"]), r["n"]) for rows in batches for r in rows)


def test_an_available_now_run_ends_with_nothing_due_left(spark, tmp_path):
    """Item 2 of issue 39: an ``availableNow`` run over files whose last one closes
    what the first opened emits what Spark's session_window emits in the same run
    (Spark's batch without data after the last file's), in as many batches; and two
    consecutive runs over growing input emit, together, what one uninterrupted run
    emits. A run with nothing new and nothing due runs no batch."""
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    builds = session_builds(backend)
    source = tmp_path / "in"
    for index, rows in enumerate([FIRST, SECOND]):
        write_json(source, index, rows)
    first = {
        name: run_once(build(json_source(spark, source, SCHEMA)), tmp_path / f"ck-{name}",
                       {"availableNow": True})
        for name, build in builds.items()
    }  # fmt: skip
    want = [("a", T0, 2), ("b", T0 + 1_000, 1)]
    assert sessions(first["spark"]) == want
    assert sessions(first["ours"]) == want  # in this run, not the next
    assert len(first["ours"]) == len(first["spark"]) == 3  # 2 files, 1 due-only batch
    assert first["ours"][-1] != [] and first["ours"][-2] == []  # the last batch closed them

    write_json(source, 2, THIRD)  # the input grows: the second run closes "c"
    second = {
        name: run_once(build(json_source(spark, source, SCHEMA)), tmp_path / f"ck-{name}",
                       {"availableNow": True})
        for name, build in builds.items()
    }  # fmt: skip
    assert sessions(second["ours"]) == sessions(second["spark"]) == [("c", T0 + 300_000, 1)]
    assert len(second["ours"]) == len(second["spark"]) == 2
    whole = StateBackend(f"file://{tmp_path}/whole", local_dir=str(tmp_path / "local-whole"))
    uninterrupted = run_once(
        session_builds(whole)["ours"](json_source(spark, source, SCHEMA)), tmp_path / "ck-whole",
        {"availableNow": True},
    )  # fmt: skip
    assert sessions(first["ours"] + second["ours"]) == sessions(uninterrupted)
    assert sessions(uninterrupted) == [*want, ("c", T0 + 300_000, 1)]

    third = run_once(
        builds["ours"](json_source(spark, source, SCHEMA)), tmp_path / "ck-ours",
        {"availableNow": True},
    )  # fmt: skip
    assert third == []  # nothing new, nothing due: no batch


def test_trigger_once_runs_one_batch_and_the_next_run_closes(spark, tmp_path):
    """``Trigger.Once`` runs exactly one batch per run, for Spark's operators as for
    ours, so neither can close what that batch made due in the same run: Spark's
    session_window and sessionize emit nothing in the first run over both files.
    The next run, with no new file, emits the closed sessions in a due-only batch
    (Spark's own operator, which asks for batches only from the batch before in the
    same run, waits for a new row); the run after it runs no batch."""
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    builds = session_builds(backend)
    source = tmp_path / "in"
    for index, rows in enumerate([FIRST, SECOND]):
        write_json(source, index, rows)

    def run(name: str) -> list[list[dict]]:
        stream = json_source(spark, source, SCHEMA)
        return run_once(builds[name](stream), tmp_path / f"ck-{name}", {"once": True})

    runs = {name: [run(name) for _ in range(3)] for name in builds}
    print(runs)
    assert [len(r) for r in runs["spark"]] == [1, 0, 0]
    assert sessions(runs["spark"][0]) == []
    assert [len(r) for r in runs["ours"]] == [1, 1, 0]
    assert sessions(runs["ours"][0]) == []
    assert sessions(runs["ours"][1]) == [("a", T0, 2), ("b", T0 + 1_000, 1)]
