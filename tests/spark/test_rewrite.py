"""Rewriting values on real Spark: a sessionize query stopped after 3 micro-batches,
one aggregate of every stored session doubled (by ``sessionstore.rewrite`` and by
the Spark job ``rewrite_state``), restarted with the same checkpoints for 3 more;
its output against an uninterrupted run's, session by session."""

from __future__ import annotations

from collections import defaultdict

import pytest

from sessionstore import rewrite
from sessionstore.checkpoint.offline.change import ChangeError
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.tools.reader import CheckpointSource, store_rows
from spark_integration import StateBackend, rewrite_state, sessionize
from tests.spark.shared_runs import SharedRuns
from tests.spark.streams import json_source, run_stream, without_due_batches
from tests.spark.test_repartition import SCHEMA, _batches, file_steps

pytestmark = pytest.mark.slow

#: the files of _batches fed: 3 before the stop, 1 after it, then the 2 that close
#: every session (the claim is about what the restart carries over, not about how
#: many files follow it)
DATA_FILES = 4
AGGREGATES = {"n": "count", "total": ("sum", "amount")}


def double_total(row):
    row["value"]["total"] *= 2
    return row


def _query(spark, folder, backend):
    events = json_source(spark, folder, SCHEMA).filter("kind = 'e'")
    with without_due_batches(spark):  # versions are the files' batches
        return sessionize(events.select("user", "uid", "ts", "amount"), ["user", "uid"], "ts",
                          gap=3000, aggregations=AGGREGATES, backend=backend,
                          name="sessions", num_partitions=4)  # fmt: skip


def _stopped_and_restarted(spark, tmp_path, tag, between):
    batches = _batches(count=DATA_FILES)
    backend = StateBackend(f"file://{tmp_path}/{tag}", local_dir=str(tmp_path / f"l-{tag}"))
    folder, checkpoint = tmp_path / f"in-{tag}", tmp_path / f"ck-{tag}"
    first = run_stream(_query(spark, folder, backend), checkpoint,
                       file_steps(batches, folder, range(3)))  # fmt: skip
    between(backend.checkpoint_uri)
    later = run_stream(_query(spark, folder, backend), checkpoint,
                       file_steps(batches, folder, range(3, len(batches))))  # fmt: skip
    return first, later


@pytest.fixture(scope="module")
def clean(spark, tmp_path_factory):
    """``clean()``: the rows (first, later) of :func:`_stopped_and_restarted` with
    nothing done between its runs, run once for the module (every test's changed
    run compares with this very query over the very same files)."""
    runs = SharedRuns(tmp_path_factory)

    def run(root):
        return _stopped_and_restarted(spark, root, "clean", lambda uri: None)

    return lambda: runs.get("clean", run)


def _session(row):
    return (row["user"], row["uid"]), row["session_start"], row["session_end"]


@pytest.mark.parametrize("form", ["python", "spark"])
def test_the_restarted_query_emits_the_doubled_sums(spark, tmp_path, form, clean):
    clean_first, clean_later = clean()
    stored = []

    def doubled(uri):
        stored.extend(store_rows(CheckpointSource(uri), "sessions", "sessions"))
        if form == "python":
            done = rewrite(uri, "sessions", double_total, force=True)
        else:
            done = rewrite_state(spark, uri, "sessions", double_total, force=True)
        assert done["version"] == 3 and done["rows"] == len(stored) > 3
        assert done["changed"] == sum(1 for s in stored if s["value"]["total"])  # 2 * 0 is 0

    first, later = _stopped_and_restarted(spark, tmp_path, "doubled", doubled)
    assert sorted(map(repr, first)) == sorted(map(repr, clean_first))
    # a later session holds the stored sessions of its key inside it (merged into
    # it): its total grows by theirs, and nothing else changes
    added = defaultdict(int)
    for row in clean_later:
        key, start, end = _session(row)
        added[key, start, end] = sum(
            s["value"]["total"] for s in stored
            if s["key"] == key and start <= s["start"] and s["end"] <= end
        )  # fmt: skip
    assert sum(added.values()) == sum(s["value"]["total"] for s in stored) > 0
    expected = [{**r, "total": r["total"] + added[_session(r)]} for r in clean_later]
    assert sorted(map(repr, later)) == sorted(map(repr, expected))


def test_a_wrong_type_is_refused_by_the_spark_job_before_anything_is_written(
    spark, tmp_path, clean
):
    def stringly(row):
        row["value"]["n"] = str(row["value"]["n"])
        return row

    refused = []

    def attempt(uri):
        op = open_filesystem(uri)
        before = {rel: op.read(rel) for rel in op.list_files()}
        with pytest.raises(ChangeError, match=r"aggregate 'n' \(count\): '\d+' is not a count"):
            rewrite_state(spark, uri, "sessions", stringly, force=True)
        refused.append({rel: op.read(rel) for rel in op.list_files()} == before)

    clean_first, clean_later = clean()
    first, later = _stopped_and_restarted(spark, tmp_path, "refused", attempt)
    assert refused == [True]
    assert sorted(map(repr, first + later)) == sorted(map(repr, clean_first + clean_later))


def test_a_rewrite_while_the_query_runs_is_refused(spark, tmp_path):
    from sessionstore.checkpoint.offline.change import CheckpointBusyError
    from tests.spark.streams import drive

    batches = _batches(count=DATA_FILES)
    backend = StateBackend(f"file://{tmp_path}/ckpt", local_dir=str(tmp_path / "local"))
    folder = tmp_path / "in"
    outcome = []

    def rewrite_now():
        for attempt in (rewrite, lambda *a: rewrite_state(spark, *a)):
            try:
                attempt(backend.checkpoint_uri, "sessions", double_total)
            except CheckpointBusyError as exc:
                outcome.append(str(exc))

    stream = (
        _query(spark, folder, backend).writeStream.outputMode("append")
        .option("checkpointLocation", str(tmp_path / "spark-ck"))
        .foreachBatch(lambda batch, _: batch.count())  # runs the operator
        .start()
    )  # fmt: skip
    drive(stream, file_steps(batches, folder, range(3)) + [rewrite_now])
    assert len(outcome) == 2 and all("a query seems to hold the checkpoint" in o for o in outcome)
    assert not open_filesystem(backend.checkpoint_uri).child("sessions").list("_audit")
