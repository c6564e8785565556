"""Bootstrapping ``sessionize`` from a history on real Spark: the state built from
the history's batches, then the query fed the rest, against the query run from
the start; refusals (committed state, a running query, bad input)."""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from sessionstore.checkpoint.offline.change import ChangeError, CheckpointBusyError
from sessionstore.checkpoint.records.layout import PartitionFiles
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.tools.reader import CheckpointSource, store_rows
from spark_integration import StateBackend, bootstrap_sessionize, bootstrap_temporal_join
from tests.spark.streams import drive, run_stream, run_stream_batches
from tests.spark.test_repartition import SCHEMA, _batches, _query, file_steps

pytestmark = pytest.mark.slow

#: the stream's data files (then its two closing ones: 8 micro-batches), of which
#: the first HISTORY are the history
DATA_FILES = 6
HISTORY = 3


def _stream() -> list[list[dict]]:
    """This module's stream: test_repartition's events in DATA_FILES data files and
    the two closing ones."""
    return _batches(count=DATA_FILES)

SESSIONS = {"key": ["user", "uid"], "timestamp": "ts", "gap": 3000}


def _history(spark, batches):
    """The history as a batch DataFrame of the stream's event columns."""
    rows = [r for rows in batches[:HISTORY] for r in rows]
    return (
        spark.createDataFrame(rows, SCHEMA)
        .filter("kind = 'e'")
        .select("user", "uid", "ts", "amount")
    )


def _diff(expected, got):
    return (
        Counter(map(str, expected)) - Counter(map(str, got)),
        Counter(map(str, got)) - Counter(map(str, expected)),
    )


def test_bootstrapped_then_the_rest_equals_the_run_from_the_start(spark, tmp_path):
    batches = _stream()
    whole = StateBackend(f"file://{tmp_path}/whole", local_dir=str(tmp_path / "l1"))
    query = _query(spark, tmp_path / "in1", whole, 2, "sessions")
    steps = file_steps(batches, tmp_path / "in1", range(len(batches)))
    expected = run_stream_batches(query, tmp_path / "ck1", steps)
    assert len(expected) == 8 and sum(map(len, expected)) > 20

    backend = StateBackend(f"file://{tmp_path}/boot", local_dir=str(tmp_path / "l2"))
    done = bootstrap_sessionize(
        _history(spark, batches), **SESSIONS, backend=backend, name="sessions", num_partitions=2
    )
    events = [r for rows in batches[:HISTORY] for r in rows if r["kind"] == "e"]
    assert done == {
        "operator": "sessions", "version": 0, "partitions": 2, "events": len(events),
        "event_time": max(r["ts"] for r in events), "resumed": None,
    }  # fmt: skip
    query = _query(spark, tmp_path / "in2", backend, 2, "sessions")
    rest = file_steps(batches, tmp_path / "in2", range(HISTORY, len(batches)))
    got = run_stream_batches(query, tmp_path / "ck2", rest)
    # batch by batch: the first batch starts from the history's event time, so it
    # emits what the history closed and what the stream's batch HISTORY emitted
    # (those advances closed no more than it does), then the same batches follow
    assert len(got) == 8 - HISTORY and sum(map(len, expected[:HISTORY])) > 0
    assert _diff([r for b in expected[: HISTORY + 1] for r in b], got[0]) == (Counter(), Counter())
    for mine, theirs in zip(got[1:], expected[HISTORY + 1 :], strict=True):
        assert _diff(theirs, mine) == (Counter(), Counter())

    # a second bootstrap of the same operator is refused: it holds committed state
    with pytest.raises(ChangeError, match="already holds committed state"):
        bootstrap_sessionize(
            _history(spark, batches), **SESSIONS, backend=backend, name="sessions",
            num_partitions=2, quiet_s=0,
        )  # fmt: skip


def test_a_temporal_join_bootstrapped_from_the_table_history(spark, tmp_path):
    """The table's rows of the first batches as the history: the query fed the
    rest joins as the query that read those table rows as its first batches."""
    from pyspark.sql import functions as F

    batches = _stream()
    # the run from the start: the first batches bring the table's rows only
    tables_first = [[r for r in rows if r["kind"] == "t"] for rows in batches[:HISTORY]]
    whole = StateBackend(f"file://{tmp_path}/whole", local_dir=str(tmp_path / "l1"))
    query = _query(spark, tmp_path / "in1", whole, 2, "join")
    steps = file_steps(tables_first + batches[HISTORY:], tmp_path / "in1", range(len(batches)))
    expected = run_stream_batches(query, tmp_path / "ck1", steps)
    assert not any(expected[:HISTORY]) and sum(map(len, expected)) > 20

    history = (
        spark.createDataFrame([r for rows in tables_first for r in rows], SCHEMA)
        .select("uid", F.col("ts").alias("plan_ts"), "plan")
    )  # fmt: skip
    assert history.count() > 10
    backend = StateBackend(f"file://{tmp_path}/boot", local_dir=str(tmp_path / "l2"))
    stream = spark.createDataFrame([], SCHEMA).select("user", "uid", "ts", "amount")
    done = bootstrap_temporal_join(
        stream, history, "uid", "ts", "plan_ts", history_retention=10**9, how="left",
        backend=backend, name="join", num_partitions=2,
    )  # fmt: skip
    assert (done["version"], done["events"]) == (0, history.count())
    assert done["event_time"] == max(r["ts"] for rows in tables_first for r in rows)
    query = _query(spark, tmp_path / "in2", backend, 2, "join")
    got = run_stream_batches(
        query, tmp_path / "ck2", file_steps(batches, tmp_path / "in2", range(HISTORY, len(batches)))
    )
    assert len(got) == 8 - HISTORY
    for mine, theirs in zip(got, expected[HISTORY:], strict=True):
        assert _diff(theirs, mine) == (Counter(), Counter())


def test_the_query_refuses_a_bootstrap_of_another_shape(spark, tmp_path):
    batches = _stream()
    backend = StateBackend(f"file://{tmp_path}/boot", local_dir=str(tmp_path / "l"))
    other = {**SESSIONS, "gap": 5000}
    bootstrap_sessionize(
        _history(spark, batches), **other, backend=backend, name="sessions", num_partitions=2
    )
    query = _query(spark, tmp_path / "in", backend, 2, "sessions")  # gap 3000
    with pytest.raises(Exception, match="was written with stores"):
        run_stream(query, tmp_path / "ck", file_steps(batches, tmp_path / "in", range(3, 4)))


def test_bad_input_is_refused_naming_it(spark, tmp_path):
    batches = _stream()
    backend = StateBackend(f"file://{tmp_path}/boot", local_dir=str(tmp_path / "l"))
    history = _history(spark, batches)
    with pytest.raises(ValueError, match=r"the input has no column 'nope' \(it has \['amount'"):
        bootstrap_sessionize(history, ["user", "nope"], "ts", 3000, backend=backend)
    with pytest.raises(
        ValueError, match="timestamp column 'user' must be a timestamp .* not string"
    ):
        bootstrap_sessionize(history, "uid", "user", 3000, backend=backend)
    stream = _query(spark, tmp_path / "in", backend, 2, "sessions")
    with pytest.raises(ValueError, match="needs a batch DataFrame of the history"):
        bootstrap_sessionize(stream, "uid", "session_start", 3000, backend=backend)
    # nothing was written
    assert not open_filesystem(backend.checkpoint_uri).list_dirs()


def test_a_bootstrap_while_the_query_runs_is_refused(spark, tmp_path):
    batches = _stream()
    backend = StateBackend(f"file://{tmp_path}/ckpt", local_dir=str(tmp_path / "local"))
    folder = tmp_path / "in"
    query = _query(spark, folder, backend, 2, "sessions")
    outcome = []

    def bootstrap_now():
        try:
            bootstrap_sessionize(
                _history(spark, batches), **SESSIONS, backend=backend, name="sessions",
                num_partitions=2,
            )  # fmt: skip
        except CheckpointBusyError as exc:
            outcome.append(str(exc))

    stream = (
        query.writeStream.outputMode("append")
        .option("checkpointLocation", str(tmp_path / "spark-ck"))
        .foreachBatch(lambda batch, _: batch.count())
        .start()
    )
    drive(stream, [*file_steps(batches, folder, range(2)), bootstrap_now])
    assert len(outcome) == 1 and "a query seems to hold the checkpoint" in outcome[0]


JOB = Path(__file__).with_name("bootstrap_job.py")


def _dumped(uri):
    return sorted(
        repr({k: v for k, v in r.items() if k != "partition"})
        for r in store_rows(CheckpointSource(uri), "sessions", "sessions", raw=True)
    )


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    """The rows of a bootstrap that nothing interrupted."""
    tmp = tmp_path_factory.mktemp("reference")
    backend = StateBackend(f"file://{tmp}/ckpt", local_dir=str(tmp / "local"))
    bootstrap_sessionize(
        _history(spark, _stream()), **SESSIONS, backend=backend, name="sessions",
        num_partitions=2,
    )  # fmt: skip
    rows = _dumped(backend.checkpoint_uri)
    assert len(rows) > 20
    return rows


class _HandedOff(Exception):
    """The bootstrap's Spark job is done: its commit runs in bootstrap_job.py."""


def _killed_at(spark, tmp_path, uri, step, at):
    """A bootstrap whose driver dies by SIGKILL at the ``at``-th call of ``step``:
    the Spark job stages every partition in this session, and the commit that
    follows it on the driver (``commit_bootstrap``, pure Python) runs in
    bootstrap_job.py, given the very arguments, and is killed there. Nothing of
    the bootstrap runs in this process after the job (no cleanup either: the
    hand-off is outside the job's try), as when the driver dies."""
    from spark_integration.operators import bootstrap as operator

    handoff = tmp_path / "commit.pickle"

    def hand_off(*args):
        handoff.write_bytes(pickle.dumps(args))
        raise _HandedOff

    original = operator.commit_bootstrap
    operator.commit_bootstrap = hand_off
    try:
        with pytest.raises(_HandedOff):
            bootstrap_sessionize(
                _history(spark, _stream()), **SESSIONS,
                backend=StateBackend(uri, local_dir=str(tmp_path / "killed-local")),
                name="sessions", num_partitions=2,
            )  # fmt: skip
    finally:
        operator.commit_bootstrap = original
    return subprocess.run(
        [sys.executable, str(JOB), str(handoff), step, str(at)], capture_output=True
    )


@pytest.mark.parametrize("step, at", [("commit_change", 1), ("_apply_partition", 2)])
def test_kill_9_leaves_no_state_or_the_bootstrapped_one(spark, tmp_path, reference, step, at):
    uri = f"file://{tmp_path}/ckpt"
    run = _killed_at(spark, tmp_path, uri, step, at)
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()[-3000:]
    operator = open_filesystem(uri).child("sessions")
    backend = StateBackend(uri, local_dir=str(tmp_path / "local"))
    if step == "commit_change":  # every partition staged, nothing committed: no state
        assert operator.list_dirs("_changes")  # the staging is there, unused
        assert not operator.exists("_metadata")
        assert [PartitionFiles(operator.child(str(p))).snapshots() for p in (0, 1)] == [set()] * 2
    else:  # committed, not applied: the query refuses the operator until a rerun
        query = _query(spark, tmp_path / "in", backend, 2, "sessions")
        with pytest.raises(Exception, match="committed but not applied"):
            run_stream(query, tmp_path / "ck", file_steps(_stream(), tmp_path / "in", [3]))
    done = bootstrap_sessionize(  # the rerun
        _history(spark, _stream()), **SESSIONS, backend=backend, name="sessions",
        num_partitions=2,
    )  # fmt: skip
    assert (done["resumed"] is None) == (step == "commit_change")
    assert _dumped(uri) == reference
    assert not operator.list_dirs("_changes")
