"""sessionize on real Spark streaming queries (local[2])."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest

from sessionstore.checkpoint.records.layout import changelog_name
from spark_integration import StateBackend, sessionize
from tests.faults import FailOnceAfterCommit
from tests.models import offline_sessions
from tests.spark.shared_runs import SharedRuns
from tests.spark.streams import (
    json_source,
    run_stream,
    run_stream_batches,
    spark_confs,
    without_due_batches,
    write_json,
)
from tests.spark.suite_a_streams import flat, run_together

pytestmark = pytest.mark.slow

GAP_MS = 10_000
SCHEMA = "user string, ts long, amount long"


def generated(seed=3, batches=5, per_batch=40):
    """Events of 6 users, some out of order within a batch, then two far-future
    events that close every session (the shared event time lags one batch)."""
    rng = random.Random(seed)
    out, t = [], 0
    for _ in range(batches):
        rows = []
        for _ in range(per_batch):
            t += rng.randrange(0, 3_000)
            rows.append((f"u{rng.randrange(6)}", t - rng.randrange(0, 2_000), rng.randrange(1, 9)))
        out.append(rows)
    far = t + 10 * GAP_MS
    out.append([("zz-close", far, 0)])
    out.append([("zz-close", far + 1, 0)])
    return out


def input_batches(seed):
    """This module's draw of :func:`generated`: the 200 events of its 5 default
    batches (and one more, the same draws in the same order) in 3 files, then the
    two closing files. A sessionstore query's CPU goes by the files it is fed (each
    a micro-batch, and with due batches a due-only batch after it), not by their
    rows: the same events of 6 users (about 65 sessions) in fewer micro-batches."""
    return generated(seed, batches=3, per_batch=67)


#: The restart tests stop their query after this many files of
#: :func:`input_batches`: two data files before, one data file and the closing ones
#: after (some sessions take rows from both sides)
SPLIT = 2


#: Spark's own stateful operators (the session_window runs these tests compare
#: with) without their batches without data: each runs one whenever its watermark
#: moves, but the two closing files (the far event moves the watermark past every
#: session, the event after it runs the batch that evicts them) emit every session
#: in data batches all the same, and which rows are late is decided in data batches
SPARK_DATA_BATCHES_ONLY = {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}


def rows_of(rows):
    return [{"user": user, "ts": ts, "amount": amount} for user, ts, amount in rows]


def fed(spark, source, checkpoint, batches, build, first=0):
    """What :func:`feed` runs, not started: ``build(stream)``, the checkpoint and the
    steps writing ``batches`` one file (one micro-batch) each (for
    :class:`tests.spark.suite_a_streams.Streams`)."""
    out = build(json_source(spark, source, SCHEMA))
    steps = [
        (lambda i=i, rows=rows: write_json(source, i, rows_of(rows)))
        for i, rows in enumerate(batches, start=first)
    ]
    return out, checkpoint, steps


def feed(spark, source, checkpoint, batches, build, first=0, mode=None):
    """Run ``build(stream)`` over ``batches``, one file (one micro-batch) at a time.
    Returns the rows, or with an output ``mode`` the rows of each micro-batch."""
    out, checkpoint, steps = fed(spark, source, checkpoint, batches, build, first)
    if mode is not None:
        return run_stream_batches(out, checkpoint, steps, mode)
    return run_stream(out, checkpoint, steps)


def query_run(
    spark, source, tmp_path, name, backend, batches, first=0, emit="final", num_partitions=None
):
    """What :func:`run_query` runs, not started (see :func:`fed`)."""

    def build(stream):
        return sessionize(
            stream,
            key="user",
            timestamp="ts",
            gap=f"{GAP_MS} ms",
            aggregations={"n": "count", "spent": ("sum", "amount"), "entry": ("first", "amount")},
            emit=emit,
            backend=backend,
            name=name,
            num_partitions=num_partitions,
        )

    return fed(spark, source, tmp_path / f"spark-ckpt-{name}", batches, build, first)


def run_query(
    spark, source, tmp_path, name, backend, batches, first=0, emit="final", num_partitions=None
):
    """``feed`` through sessionize (count, sum and first of amount per session); in
    update mode, the rows of each micro-batch."""
    out, checkpoint, steps = query_run(
        spark, source, tmp_path, name, backend, batches, first, emit, num_partitions
    )
    if emit == "update":
        return run_stream_batches(out, checkpoint, steps, "update")
    return run_stream(out, checkpoint, steps)


def as_sessions(rows):
    return sorted((r["user"], r["session_start"], r["session_end"], r["n"]) for r in rows)


@pytest.fixture(scope="module")
def uninterrupted(spark, tmp_path_factory):
    """``uninterrupted(seed, emit="final")``: the rows of each micro-batch of the
    uninterrupted :func:`query_run` over ``input_batches(seed)`` in ``emit`` mode,
    computed once for the module (:class:`tests.spark.shared_runs.SharedRuns`).

    The restart tests compare their stopped-and-restarted run with it: seed 11 in
    final mode is the reference of test_restart_from_checkpoint_gives_the_uninterrupted_output,
    test_restart_on_gcs_configured_by_conf_gives_the_uninterrupted_output,
    test_a_query_restarted_on_a_copied_checkpoint_continues_exactly,
    test_a_restart_at_the_confs_count_rescales_the_checkpoint and
    test_a_task_failing_after_its_commit_is_retried_without_double_counting. Each of
    those tests runs this very query (the same rows one file per micro-batch,
    the same aggregations, the conf's 2 partitions, due batches, a file:// checkpoint
    of its own); its output rows carry no operator name or path, so one run is every
    test's reference. test_final_sessions_equal_offline_sessionization and
    test_sessions_equal_sparks_own_session_window check the seed-11 runs (final, and
    update) against the offline model and Spark's session_window, so the restart
    tests' reference is itself checked."""
    from spark_integration.planning.due_batches import DUE_BATCHES_CONF
    from spark_integration.planning.resolve import PARTITIONS_CONF

    runs = SharedRuns(tmp_path_factory)

    def compute(seed, emit, folder):
        # the settings every sharing test's reference was planned with
        assert spark.conf.get(PARTITIONS_CONF) == "2"
        assert spark.conf.get(DUE_BATCHES_CONF, None) is None
        backend = StateBackend(f"file://{folder}/state", local_dir=str(folder / "local"))
        out, checkpoint, steps = query_run(
            spark, folder / "in", folder, "ref", backend, input_batches(seed), emit=emit
        )
        return run_stream_batches(
            out, checkpoint, steps, "update" if emit == "update" else "append"
        )

    def reference(seed, emit="final"):
        return runs.get((seed, emit), functools.partial(compute, seed, emit))

    return reference


def test_final_sessions_equal_offline_sessionization(uninterrupted):
    batches = input_batches(seed=11)
    rows = flat(uninterrupted(11))
    events = [(u, None, ts) for rows_ in batches for u, ts, _ in rows_ if u != "zz-close"]
    got = [s for s in as_sessions(rows) if s[0] != "zz-close"]
    assert got == offline_sessions(events, GAP_MS)
    spent = {(r["user"], r["session_start"]): r["spent"] for r in rows}
    for user, start, end, _ in got:
        expected = sum(
            a for rows_ in batches for u, ts, a in rows_ if u == user and start <= ts <= end
        )
        assert spent[(user, start)] == expected


@pytest.mark.parametrize("emit", ["final", "update"])
def test_restart_from_checkpoint_gives_the_uninterrupted_output(
    spark, tmp_path, emit, uninterrupted
):
    batches = input_batches(seed=11)
    reference = uninterrupted(11, emit)
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    run = functools.partial(run_query, spark, tmp_path / "part", tmp_path, "restart", emit=emit)
    # the same stream, stopped after SPLIT files and restarted with a new local dir
    # (a new executor): the state comes back from the checkpoint
    first = run(backend, batches[:SPLIT])
    moved = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local2"))
    second = run(moved, batches[SPLIT:], first=SPLIT)
    if emit == "update":
        # what the first batches emitted is known after the restart: the same rows
        # per micro-batch, deletes included
        assert [sorted(map(str, b)) for b in first + second] == [
            sorted(map(str, b)) for b in reference
        ]
        assert any(r["change"] == "delete" for b in reference for r in b)
    else:
        assert as_sessions(first + second) == as_sessions(flat(reference))
    assert len(flat(reference)) > 20


def test_a_restart_at_the_confs_count_rescales_the_checkpoint(
    spark, tmp_path, caplog, uninterrupted
):
    # the session's conf says 2 partitions (conftest); the checkpoint was made with 3:
    # a restart without num_partitions takes the conf's count and rescales (issue 41)
    from sessionstore.checkpoint.records.generation import state_root

    batches = input_batches(seed=11)
    reference = flat(uninterrupted(11))
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    run = functools.partial(run_query, spark, tmp_path / "part", tmp_path, "three", backend)
    first = run(batches[:SPLIT], num_partitions=3)
    with caplog.at_level("WARNING", logger="spark_integration.planning.rescale"):
        second = run(batches[SPLIT:], first=SPLIT)
    assert any("rescaled operator 'three'" in r.message and "from 3 to 2 partitions" in r.message
               for r in caplog.records)  # fmt: skip
    assert as_sessions(first + second) == as_sessions(reference)
    root = state_root(backend.checkpoint_uri, "three").removeprefix("file://")
    parts = sorted(p.name for p in (Path(root) / "three").iterdir() if p.name.isdigit())
    assert parts == ["0", "1"]
    newest = set()
    for part in parts:  # every partition ran every micro-batch after the rescale
        changelogs = (Path(root) / "three" / part / "changelog").rglob("*.changelog")
        newest.add(max(int(c.name.split(".")[0]) for c in changelogs))
    assert len(newest) == 1 and newest.pop() >= len(batches)  # due batches ran too


def test_partition_count_from_the_conf_key_or_the_cores(spark, tmp_path):
    from spark_integration.planning.resolve import PARTITIONS_CONF

    df = spark.createDataFrame([("a", 1), ("b", 2)], "user string, ts long")
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))

    def planned(name, **kwargs):
        """The operator's state partitions, as its first batch records them."""
        from sessionstore.checkpoint.partition.provider import recorded_partitions

        out = sessionize(df, "user", "ts", "1 second", backend=backend, name=name, **kwargs)
        out.collect()
        return recorded_partitions(backend.checkpoint_uri, name, {})

    assert spark.conf.get(PARTITIONS_CONF) == "2"  # conftest's
    assert planned("conf") == 2
    assert planned("given", num_partitions=5) == 5
    spark.conf.set(PARTITIONS_CONF, "3")
    try:
        assert planned("conf3") == 3
        spark.conf.unset(PARTITIONS_CONF)
        # local[2]: two partitions per core
        assert spark.sparkContext.defaultParallelism == 2
        assert planned("cores") == 4
        # in one Spark task per core (spark_integration.planning.placement)
        cores = sessionize(df, "user", "ts", "1 second", backend=backend, name="cores")
        assert cores.rdd.getNumPartitions() == 2
    finally:
        spark.conf.set(PARTITIONS_CONF, "2")


def test_restart_on_gcs_configured_by_conf_gives_the_uninterrupted_output(
    spark, tmp_path, gs_bucket, uninterrupted
):
    """The checkpoint on gs:// (the fake-gcs-server endpoint), the backend built from
    ``spark.sessionstore.*`` set on the session (storage options as text, as
    spark-submit passes them): stopped after SPLIT files, restarted on a new local
    dir, the output is the uninterrupted run's."""
    from sessionstore.checkpoint.storage.filesystem import open_filesystem

    uri, options = gs_bucket
    batches = input_batches(seed=11)
    # the reference (its backend given, planned before the conf is set)
    reference = flat(uninterrupted(11))
    conf = {"spark.sessionstore.checkpointUri": uri, "spark.sessionstore.localDir": ""}
    conf.update({f"spark.sessionstore.storage.{k}": str(v) for k, v in options.items()})
    outputs = []
    try:
        for local, part, first in (
            ("gs-local", batches[:SPLIT], 0),
            ("gs-local2", batches[SPLIT:], SPLIT),
        ):
            conf["spark.sessionstore.localDir"] = str(tmp_path / local)
            for key, value in conf.items():
                spark.conf.set(key, value)
            outputs.append(
                run_query(spark, tmp_path / "part", tmp_path, "gcs", None, part, first=first)
            )
    finally:
        for key in conf:
            spark.conf.unset(key)
    assert as_sessions(outputs[0] + outputs[1]) == as_sessions(reference)
    assert len(reference) > 20
    remote = open_filesystem(uri, options)
    assert remote.list_dirs("gcs") == ["0", "1"]  # event time lives in the changelogs
    # every file's micro-batch committed a version (due batches add more)
    assert remote.exists(f"gcs/0/{changelog_name(len(batches))}")
    # sessions that began before the restart and closed after it: state came back
    first_ts = min(ts for _, ts, _ in batches[SPLIT])
    assert any(r["session_start"] < first_ts for r in outputs[1])


def test_a_query_restarted_on_a_copied_checkpoint_continues_exactly(spark, tmp_path, uninterrupted):
    """Moving a job, or disaster recovery: Spark's checkpoint and the state are
    copied to another folder, the copy keeps only snapshot 2 and the changelogs
    after it, and the query restarts there on a new local dir. Its output is the
    uninterrupted run's (the copy used to refuse its own snapshots)."""
    batches = input_batches(seed=11)
    reference = flat(uninterrupted(11))
    backend = StateBackend(
        f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"), snapshot_interval=2
    )
    # versions 1-3 are the 3 data files' batches: the copy restores snapshot 2 and
    # replays changelog 3; the closing files after the move emit every open session
    with without_due_batches(spark):
        part = query_run(spark, tmp_path / "part", tmp_path, "moving", backend, batches[:3])
    first = run_stream(*part)
    moved = _copy_from_snapshot_2(tmp_path)
    backend = StateBackend(f"file://{moved}/state", local_dir=str(tmp_path / "new-local"))
    second = run_query(spark, tmp_path / "part", moved, "moving", backend, batches[3:], first=3)

    def rows(out):
        return sorted(sorted(r.items()) for r in out)

    assert rows(first + second) == rows(reference)
    # sessions that began in the snapshot's files and were emitted after the move:
    # the snapshot's state moved
    first_ts = min(ts for _, ts, _ in batches[2])
    assert any(r["session_start"] < first_ts for r in second)


def _copy_from_snapshot_2(tmp_path):
    """Once snapshot 2 of operator "moving" is uploaded, its state and Spark's
    checkpoint copied to ``tmp_path/moved``, keeping only snapshot 2 and the
    changelogs after it; the copy's folder."""
    import shutil
    import time

    partitions = sorted((tmp_path / "state" / "moving").glob("[0-9]*"))
    deadline = time.monotonic() + 60  # snapshot uploads run on the workers' background threads
    while not all((p / "snapshot" / "2.manifest").exists() for p in partitions):
        assert time.monotonic() < deadline, "snapshot 2 was not uploaded"
        time.sleep(0.1)
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "state", moved / "state")
    shutil.copytree(tmp_path / "spark-ckpt-moving", moved / "spark-ckpt-moving")
    for partition in sorted((moved / "state" / "moving").glob("[0-9]*")):
        for v in (1, 2):
            (partition / changelog_name(v)).unlink()
        assert sorted(f.name for f in (partition / changelog_name(3)).parent.iterdir()) == [
            "3.changelog"
        ]
    return moved


def test_timestamp_columns_in_and_out(spark, tmp_path):
    from datetime import UTC, datetime

    from pyspark.sql import functions as F

    rows = [("a", 1_000), ("a", 5_000), ("b", 2_000), ("a", 30_000), ("zz", 10**6)]
    rows.append(("zz", 10**6 + 1))
    source = tmp_path / "in"
    stream = json_source(spark, source, SCHEMA).withColumn("t", F.timestamp_millis("ts")).drop("ts")
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    # the two far events close every session in a data batch: due batches add nothing here
    with without_due_batches(spark):
        out = sessionize(stream, key="user", timestamp="t", gap="10 seconds", backend=backend)
    assert dict(out.dtypes)["session_start"] == "timestamp"
    steps = [
        (lambda i=i, user=user, ts=ts: write_json(source, i, rows_of([(user, ts, 1)])))
        for i, (user, ts) in enumerate(rows)
    ]
    collected = run_stream(out, tmp_path / "ck", steps)

    def utc(ms):
        return datetime.fromtimestamp(ms / 1000, tz=UTC)

    got = sorted(
        (
            r["user"],
            r["session_start"].astimezone(UTC),
            r["session_end"].astimezone(UTC),
            r["count"],
        )
        for r in collected
        if r["user"] != "zz"
    )
    assert got == [
        ("a", utc(1_000), utc(5_000), 2),
        ("a", utc(30_000), utc(30_000), 1),
        ("b", utc(2_000), utc(2_000), 1),
    ]


def test_a_task_failing_after_its_commit_is_retried_without_double_counting(
    spark, tmp_path, uninterrupted
):
    batches = input_batches(seed=11)
    reference = flat(uninterrupted(11))
    markers = tmp_path / "markers"
    markers.mkdir()
    for batch_id, partition in ((1, 0), (3, 1)):
        (markers / f"fail-{batch_id}-{partition}").touch()
    failing = StateBackend(
        f"file://{tmp_path}/state",
        local_dir=str(tmp_path / "local"),
        commit_observer=FailOnceAfterCommit(str(markers)),
    )
    rows = run_query(spark, tmp_path / "b", tmp_path, "failing", failing, batches)
    assert list(markers.iterdir()) == []  # both injected failures happened
    assert sorted(map(str, rows)) == sorted(map(str, reference))  # same rows, no duplicates


def test_sessions_equal_sparks_own_session_window(spark, tmp_path, uninterrupted):
    """Differential test against Spark's built-in session_window (count and sum),
    whose session end is the last event + gap: the sessions emitted on close, and
    the table that update mode's rows build when a sink applies each micro-batch's
    rows in a shuffled order (one row per session per batch, a delete only for a
    session an earlier batch emitted). Ours are the module's uninterrupted runs of
    the same input (:func:`uninterrupted`)."""
    from pyspark.sql import functions as F

    batches = input_batches(seed=11)

    def builtin(stream):
        return (
            stream.withColumn("t", F.timestamp_millis("ts"))
            .withWatermark("t", "1 minute")
            .groupBy(F.session_window("t", f"{GAP_MS // 1000} seconds"), "user")
            .agg(F.count("*").alias("n"), F.sum("amount").alias("spent"))
        )

    with spark_confs(spark, SPARK_DATA_BATCHES_ONLY):
        theirs = run_stream(*fed(spark, tmp_path / "in", tmp_path / "ck", batches, builtin))
    ours, per_batch = flat(uninterrupted(11)), uninterrupted(11, "update")

    def ms(value):
        return round(value.timestamp() * 1000)  # float seconds: round, not truncate

    spark_sessions = sorted(
        (
            r["user"],
            ms(r["session_window"]["start"]),
            ms(r["session_window"]["end"]) - GAP_MS,
            r["n"],
            r["spent"],
        )
        for r in theirs
        if r["user"] != "zz-close"
    )
    our_sessions = sorted(
        (r["user"], r["session_start"], r["session_end"], r["n"], r["spent"])
        for r in ours
        if r["user"] != "zz-close"
    )
    assert len(spark_sessions) > 20
    assert our_sessions == spark_sessions

    rng = random.Random(4)
    table: dict = {}
    deletes = 0
    for rows in per_batch:
        idents = [(r["user"], r["session_start"], r["session_end"]) for r in rows]
        assert len(set(idents)) == len(idents)  # one row per session identity
        rows = list(rows)
        rng.shuffle(rows)
        for r in rows:
            ident = (r["user"], r["session_start"], r["session_end"])
            if r["change"] == "delete":
                assert ident in table  # emitted by an earlier batch
                del table[ident]
                deletes += 1
            else:
                assert r["change"] == "upsert"
                table[ident] = (r["n"], r["spent"])
    updated = sorted(
        (*ident, n, spent) for ident, (n, spent) in table.items() if ident[0] != "zz-close"
    )
    assert updated == spark_sessions
    assert deletes > 0  # merges across batches happened
    # fewer rows than events: no row per event any more
    assert sum(map(len, per_batch)) < sum(map(len, batches))


def late_events(seed=11, batches=3, per_batch=60):
    """Clicks of 5 users; each batch also carries rows 1-19 s behind the previous
    batches (within a 20 s watermark delay; the first batch's have no batch before
    them). Then two events that close every session."""
    rng = random.Random(seed)
    out, t = [], 100_000
    for _ in range(batches):
        # late rows: behind the event time of the batches before this one
        rows = [(f"u{rng.randrange(5)}", t - rng.randrange(1_000, 19_000), 1000) for _ in range(4)]
        for _ in range(per_batch):
            t += rng.randrange(0, 2_500)
            rows.append((f"u{rng.randrange(5)}", t, rng.randrange(1, 9)))
        out.append(rows)
    far = t + 10 * GAP_MS
    return out + [[("zz-close", far, 0)], [("zz-close", far + 1, 0)]]


def test_the_input_watermark_sets_the_grace(spark, tmp_path):
    """With withWatermark on the input and no grace, sessionize keeps late rows
    within the delay and closes sessions as Spark's session_window does with the
    same watermark: the same sessions, with every late row counted."""
    from pyspark.sql import functions as F

    batches = late_events()

    def watermarked(stream):
        return stream.withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "20 seconds")

    def builtin(stream):
        return (
            watermarked(stream)
            .groupBy(F.session_window("t", f"{GAP_MS // 1000} seconds"), "user")
            .agg(F.count("*").alias("n"), F.sum("amount").alias("spent"))
        )

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))

    def ours(stream):
        return sessionize(
            watermarked(stream).drop("ts"), key="user", timestamp="t", gap=f"{GAP_MS} ms",
            aggregations={"n": "count", "spent": ("sum", "amount")}, backend=backend,
            name="watermarked",
        )  # fmt: skip

    def plain(stream):
        return sessionize(
            stream.withColumn("t", F.timestamp_millis("ts")).drop("ts"), key="user",
            timestamp="t", gap=f"{GAP_MS} ms", aggregations={"spent": ("sum", "amount")},
            backend=backend, name="plain",
        )  # fmt: skip

    # Ours without due batches: a due-only batch moves no event time, so which rows
    # are late is the same, and the two far events close every session in a data batch.
    with without_due_batches(spark):
        mine = fed(spark, tmp_path / "in-ours", tmp_path / "ck-ours", batches, ours)
        no_watermark = fed(spark, tmp_path / "in-plain", tmp_path / "ck-plain", batches, plain)
    with spark_confs(spark, SPARK_DATA_BATCHES_ONLY):
        runs = run_together(
            {  # Spark's, ours and ours without the watermark, side by side
                "theirs": fed(
                    spark, tmp_path / "in-spark", tmp_path / "ck-spark", batches, builtin
                ),
                "mine": mine,
                "plain": no_watermark,
            }
        )
    theirs, mine, no_grace = flat(runs["theirs"]), flat(runs["mine"]), flat(runs["plain"])

    def ms(value):
        return round(value.timestamp() * 1000)

    spark_sessions = sorted(
        (r["user"], ms(r["session_window"]["start"]), ms(r["session_window"]["end"]) - GAP_MS,
         r["n"], r["spent"])
        for r in theirs if r["user"] != "zz-close"
    )  # fmt: skip
    our_sessions = sorted(
        (r["user"], ms(r["session_start"]), ms(r["session_end"]), r["n"], r["spent"])
        for r in mine if r["user"] != "zz-close"
    )  # fmt: skip
    assert our_sessions == spark_sessions
    late = sum(1 for rows in batches for row in rows if row[2] == 1000)
    assert sum(s[4] // 1000 for s in our_sessions) == late  # no late row lost
    # without the watermark, grace is 0 and some of those rows are dropped as late
    kept = sum(r["spent"] // 1000 for r in no_grace if r["user"] != "zz-close")
    assert kept < late


def test_two_key_columns_and_typed_aggregates(spark, tmp_path):
    """The columnar path in Spark: two key columns (string, int), an int column's
    min and max (int stays int), a string column's last value, checked against
    sessions computed here from the raw events."""
    from pyspark.sql import functions as F

    rng = random.Random(7)
    batches, t = [], 0
    for _ in range(4):
        rows = []
        for _ in range(40):
            t += rng.randrange(1, 2_500)  # distinct times: no ties to break
            rows.append((f"u{rng.randrange(3)}", rng.randrange(2), t, rng.randrange(-50, 50),
                         rng.choice(["/", "/cart", "/item"])))  # fmt: skip
        rng.shuffle(rows)  # out of order within the batch, never by more than a gap
        batches.append(rows)
    far = t + 10 * GAP_MS
    batches += [[("zz", 0, far, 0, "/")], [("zz", 0, far + 1, 0, "/")]]
    schema = "user string, device int, ts long, amount int, page string"
    source = tmp_path / "in"
    stream = json_source(spark, source, schema)
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    with without_due_batches(spark):  # the two far events close every session in a data batch
        out = sessionize(
            stream, key=["user", "device"], timestamp="ts", gap=f"{GAP_MS} ms",
            aggregations={"n": "count", "lo": ("min", "amount"), "hi": ("max", "amount"),
                          "exit": ("last", "page")},
            backend=backend,
        )  # fmt: skip
    assert dict(out.dtypes)["lo"] == "int"
    keys = ("user", "device", "ts", "amount", "page")
    steps = [
        (lambda i=i, rows=rows: write_json(source, i, [dict(zip(keys, r, strict=True)) for r in rows]))
        for i, rows in enumerate(batches)
    ]  # fmt: skip
    collected = run_stream(out.where(F.col("user") != "zz"), tmp_path / "ck", steps)

    expected = []
    by_key: dict = {}
    for rows in batches[:-2]:
        for user, device, ts, amount, page in rows:
            by_key.setdefault((user, device), []).append((ts, amount, page))
    for (user, device), events in by_key.items():
        events.sort()
        session = [events[0]]
        for event in events[1:] + [None]:
            if event is not None and event[0] - session[-1][0] <= GAP_MS:
                session.append(event)
                continue
            amounts = [a for _, a, _ in session]
            expected.append((user, device, session[0][0], session[-1][0], len(session),
                             min(amounts), max(amounts), session[-1][2]))  # fmt: skip
            session = [event]
    got = [
        (r["user"], r["device"], r["session_start"], r["session_end"], r["n"], r["lo"], r["hi"],
         r["exit"])
        for r in collected
    ]  # fmt: skip
    assert sorted(got) == sorted(expected)
    assert len(expected) > 10
