"""Rescale on restart (issue 41, part 3): a query restarted with another partition
count rescales its checkpoint with a Spark job before its first batch, and writes
exactly what an uninterrupted run at the first count writes; a rescale that dies
before its switch leaves the old count loading the old state."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from sessionstore.checkpoint.offline.rescale import RescaleError
from sessionstore.checkpoint.records.fence import FencedError, fenced_by
from sessionstore.checkpoint.records.generation import GENERATION_FIELD
from sessionstore.checkpoint.records.layout import changelog_name, read_metadata
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from spark_integration import (
    StateBackend,
    sessionize,
    transform_with_state,
    window_aggregate,
)
from tests.spark import processors as P
from tests.spark.shared_runs import uninterrupted_batches
from tests.spark.streams import json_source, run_stream_batches, without_due_batches, write_json
from tests.spark.test_repartition import SCHEMA, _batches
from tests.spark.test_repartition import _query as repartition_query

pytestmark = pytest.mark.slow

#: the micro-batches (one file each) run at each count: 4, then 7, then 3
RUNS = ((4, range(0, 2)), (7, range(2, 4)), (3, range(4, 6)))
MODES = {"sessions_update": "update", "windows_update": "update", "tws": "update"}


def _query(spark, folder, backend, n, case):
    from pyspark.sql import functions as F

    if case == "join":  # test_repartition's join, the same query: their references are one run
        return repartition_query(spark, folder, backend, n, case)
    src = json_source(spark, folder, SCHEMA)
    events = src.filter("kind = 'e'").select("user", "uid", "ts", "amount")
    common = {"backend": backend, "name": case, "num_partitions": n}
    aggs = {"events": "count", "total": ("sum", "amount")}
    with without_due_batches(spark):  # one micro-batch per file, compared batch by batch
        if case == "sessions_bytes":  # keys a rescale routes by Spark's hash of bool, bytes
            keyed = events.select(
                F.expr("uid % 2 = 0").alias("even"), F.col("user").cast("binary").alias("blob"),
                "ts", "amount",
            )  # fmt: skip
            return sessionize(keyed, ["even", "blob"], "ts", gap=3000, aggregations=aggs,
                              **common)  # fmt: skip
        if case.startswith("sessions"):
            emit = "update" if case.endswith("update") else "final"
            return sessionize(events, ["user", "uid"], "ts", gap=3000, emit=emit,
                              aggregations=aggs, **common)  # fmt: skip
        if case.startswith("windows"):
            emit = "update" if case.endswith("update") else "final"
            return window_aggregate(events, "user", "ts", size=4000, emit=emit,
                                    aggregations=aggs, **common)  # fmt: skip
        timed = events.withColumn("event", F.timestamp_millis("ts"))
        return transform_with_state(
            timed.withWatermark("event", "0 seconds"), "user", P.RowRescaled(),
            P.RESCALED_SCHEMA, time_mode="EventTime", **common,
        )  # fmt: skip


def _steps(folder, part):
    return [
        (lambda i=i, rows=rows: write_json(folder, i, rows))
        for i, rows in enumerate(_batches())
        if i in part
    ]


def _same_batches(expected, got):
    assert len(got) == len(expected)
    for batch, (want, have) in enumerate(zip(expected, got, strict=True)):
        missing = Counter(map(str, want)) - Counter(map(str, have))
        extra = Counter(map(str, have)) - Counter(map(str, want))
        assert (batch, missing, extra) == (batch, Counter(), Counter())


def _uninterrupted(spark, tmp_path_factory, case):
    """The run at 4 partitions without a stop: one run per case for every test of
    this module (and test_repartition's join), see tests/spark/shared_runs.py."""
    query = repartition_query if case == "join" else _query  # the same query, see _query
    mode = MODES.get(case, "append")
    expected = uninterrupted_batches(spark, tmp_path_factory, query, case, _batches(), 4, mode)
    assert sum(map(len, expected)) > 20
    return expected


@pytest.mark.parametrize(
    "case", ["sessions_final", "sessions_update", "windows_final", "join", "tws", "sessions_bytes"]
)
def test_restarts_at_4_7_3_partitions_write_the_uninterrupted_output(
    spark, tmp_path, tmp_path_factory, case, caplog
):
    expected = _uninterrupted(spark, tmp_path_factory, case)
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "l2"))
    operator = open_filesystem(backend.checkpoint_uri).child(case)
    got, mode = [], MODES.get(case, "append")
    for n, part in RUNS:
        with caplog.at_level(logging.WARNING, "spark_integration.planning.rescale"):
            caplog.clear()
            query = _query(spark, tmp_path / "in2", backend, n, case)
        if n == 4:
            assert caplog.messages == []
        else:
            [line] = caplog.messages
            assert f"rescaled operator {case!r} of {backend.checkpoint_uri} from " in line
            assert f"to {n} partitions at version {part[0]}" in line
        got += run_stream_batches(query, tmp_path / "ck2", _steps(tmp_path / "in2", part), mode)
        metadata = read_metadata(operator)
        assert metadata["num_partitions"] == n
        if n != 4:  # the state before the switch is deleted, but for its fences
            current = f"_generations/{metadata[GENERATION_FIELD]}/"
            left = [
                f for f in operator.list_files() if not f.startswith(current)
                and any(d in f for d in ("/changelog/", "/snapshot/", "/files/"))
            ]  # fmt: skip
            assert left and all(fenced_by(operator.read(f)) for f in left)
    _same_batches(expected, got)


class Crash(Exception):
    """A rescale dying between its last partition and its switch."""


def test_a_rescale_that_dies_before_its_switch_leaves_the_old_count_exact(
    spark, tmp_path, tmp_path_factory, monkeypatch
):
    from sessionstore.checkpoint.offline.repartition import finish_repartition
    from spark_integration.planning import rescale

    case = "sessions_final"
    expected = _uninterrupted(spark, tmp_path_factory, case)
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "l2"))
    operator = open_filesystem(backend.checkpoint_uri).child(case)

    def run(n, part):
        query = _query(spark, tmp_path / "in2", backend, n, case)
        return run_stream_batches(query, tmp_path / "ck2", _steps(tmp_path / "in2", part))

    got = run(4, range(0, 2))
    before = read_metadata(operator)

    def dies(plan):  # every partition and the generation's _metadata written, no switch
        finish_repartition(plan.copy)
        raise Crash

    monkeypatch.setattr(rescale, "commit_rescale", dies)
    with pytest.raises(Crash):
        _query(spark, tmp_path / "in2", backend, 7, case)
    monkeypatch.undo()
    assert read_metadata(operator) == before
    [left] = operator.list_dirs("_generations")  # a whole copy, never read
    got += run(4, range(2, 3))  # the old count loads the old state
    got += run(7, range(3, 6))  # and a new rescale writes another generation
    assert left not in operator.list_dirs("_generations")
    _same_batches(expected, got)


def test_a_checkpoint_between_batches_is_refused_and_unchanged(spark, tmp_path):
    """Partitions at different versions (a query running, or stopped in the middle
    of a batch) cannot be rescaled: the error says so, and nothing is written."""
    case = "sessions_final"
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "l2"))
    query = _query(spark, tmp_path / "in", backend, 4, case)
    run_stream_batches(query, tmp_path / "ck", _steps(tmp_path / "in", range(2)))
    operator = open_filesystem(backend.checkpoint_uri).child(case)
    operator.delete_dir("3/changelog")  # partition 3 lost its commits: version 0
    before = read_metadata(operator)
    with pytest.raises(
        RescaleError,
        match=r"cannot rescale .*/state/sessions_final to 7 partitions on restart: the "
        r"partitions of .* are not at one version \(0: 2, 1: 2, 2: 2, 3: 0\).*; the "
        r"checkpoint is unchanged",
    ):
        _query(spark, tmp_path / "in", backend, 7, case)
    assert read_metadata(operator) == before
    assert not operator.exists("_generations")


def test_a_batch_spark_replays_after_a_crash_is_served_by_the_rescaled_checkpoint(
    spark, tmp_path, tmp_path_factory
):
    """The driver dies after every partition committed batch 2 (version 3) but before
    Spark recorded the batch in its commit log. The restart at 7 rescales version 3,
    and Spark replays batch 2, which loads version 2: the generation serves it, and
    the output is the uninterrupted run's."""
    from pyspark.errors import StreamingQueryException

    case = "sessions_final"
    expected = _uninterrupted(spark, tmp_path_factory, case)
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "l2"))
    operator = open_filesystem(backend.checkpoint_uri).child(case)

    def run(n, part):
        query = _query(spark, tmp_path / "in2", backend, n, case)
        return run_stream_batches(query, tmp_path / "ck2", _steps(tmp_path / "in2", part))

    got = run(4, range(0, 2))

    def dies_after_the_state_committed(batch, _):
        batch.collect()  # every partition commits version 3
        raise Crash

    _steps(tmp_path / "in2", [2])[0]()
    query = (
        _query(spark, tmp_path / "in2", backend, 4, case)
        .writeStream.option("checkpointLocation", str(tmp_path / "ck2"))
        .foreachBatch(dies_after_the_state_committed)
        .start()
    )
    with pytest.raises(StreamingQueryException, match="Crash"):
        query.processAllAvailable()
    query.stop()
    assert all(operator.exists(f"{p}/{changelog_name(3)}") for p in range(4))
    assert not (tmp_path / "ck2" / "commits" / "2").exists()
    got += run(7, range(3, 6))  # batch 2 again (a replay), then 3..5
    assert read_metadata(operator)["num_partitions"] == 7
    _same_batches(expected, got)


def test_a_data_source_read_across_a_switch_never_mixes_two_counts(spark, tmp_path):
    """The data source lists the partitions when the read is planned and its tasks
    read them later: a rescale switching in between does not mix the two counts.
    The tasks read the state that was listed (its root read once), never the new
    one: the read fails naming the rescale (the root's _metadata, now a switch, or
    the fence in the replaced generation)."""
    from pyspark.sql.types import StructType

    from sessionstore.checkpoint.offline.rescale import (
        commit_rescale,
        copy_rescale,
        drop_state,
        plan_rescale,
    )
    from sessionstore.checkpoint.partition.load import VersionNotFoundError
    from sessionstore.checkpoint.partition.provider import CheckpointMismatchError
    from spark_integration.datasource import SessionStoreDataSource
    from tests.checkpoint.test_repartition import write_source

    uri = f"file://{tmp_path}/ck"
    write_source(uri, str(tmp_path / "l"))

    def planned_read():
        source = SessionStoreDataSource({"path": uri, "operator": "op", "store": "counts"})
        reader = source.reader(StructType.fromDDL(source.schema()))
        return reader, reader.partitions()

    def switched(n, key_groups=None):
        plan = plan_rescale(uri, "op", n, key_groups=key_groups)
        copy_rescale(plan)
        commit_rescale(plan)  # the state before is deleted only after
        return plan

    reader, listed = planned_read()
    assert [p.value for p in listed] == [[0], [1], [2], [3]]
    expected = sorted(row for p in listed for row in reader.read(p))
    drop_state(switched(7))
    with pytest.raises(CheckpointMismatchError, match=r"ck/op/_metadata was rescaled"):
        list(reader.read(listed[0]))
    reader, listed = planned_read()
    assert [p.value for p in listed] == [[p] for p in range(7)]
    rescaled = sorted(row for p in listed for row in reader.read(p))
    assert sorted(r[1:] for r in rescaled) == sorted(r[1:] for r in expected)
    again = switched(3)  # the old query's next version fenced: what a reader reads too
    with pytest.raises(
        FencedError, match=rf"is a fence, not a changelog: .* \(generation {again.generation}\)"
    ):
        list(reader.read(listed[0]))
    # 12 partitions in 4 databases: a Spark partition per database, rows as before
    drop_state(switched(4, key_groups=12))
    reader, listed = planned_read()
    assert [p.value for p in listed] == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    slabbed = sorted(row for p in listed for row in reader.read(p))
    assert sorted(r[1:] for r in slabbed) == sorted(r[1:] for r in expected)
    assert {r[0] for r in slabbed} <= set(range(12))
    # read as listed after another switch (to 2 databases): the state listed is
    # fenced, so the read fails rather than name its rows by the switch's layout
    moved = switched(2, key_groups=12)
    for p in listed:
        with pytest.raises(FencedError, match=rf"\(generation {moved.generation}\)"):
            list(reader.read(p))
    drop_state(moved)  # and once it is deleted, missing
    with pytest.raises(VersionNotFoundError):
        list(reader.read(listed[0]))
