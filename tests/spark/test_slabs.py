"""Partitions kept in fewer databases (issue 41, parts 1-2): an operator of more
partitions than the cluster has task slots keeps them in a few *slabs* (slab
``s`` holds partitions ``s, s + S, ...``: sessionstore.checkpoint.partition.identity),
writes what a query of one database per partition writes, reads back by
partition in the CLI and the data source exactly as Spark's own hash assigns
keys, and moves to more databases (a larger cluster) or another partition count
on restart, exactly."""

from __future__ import annotations

import json
import logging

import pytest

from sessionstore.checkpoint.records.layout import read_metadata
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.tools.reader import CheckpointSource, store_rows
from spark_integration import StateBackend
from spark_integration.planning.resolve import TASKS_CONF
from tests.spark.streams import run_stream_batches
from tests.spark.test_rescale import _query, _same_batches, _steps, _uninterrupted
from tests.tools.cli_runner import run_cli

pytestmark = pytest.mark.slow

CASE = "sessions_final"
#: (partitions, tasks, the files' micro-batches): 16 partitions in local[2]'s 4
#: databases, then in 8 (8 tasks asked: a larger cluster), then 24 partitions
RUNS = ((16, None, range(0, 2)), (16, "8", range(2, 4)), (24, None, range(4, 6)))


def restarts(spark, tmp_path, backend, runs, caplog):
    """Run the query of ``CASE`` once per ``(partitions, tasks, the files'
    micro-batches)`` of ``runs``, restarting on one checkpoint; ``(output batches,
    the layout recorded after each run, the rescale log lines)``."""
    operator = open_filesystem(backend.checkpoint_uri).child(CASE)
    got, layouts, lines = [], [], []
    for partitions, tasks, part in runs:
        if tasks is not None:
            spark.conf.set(TASKS_CONF, tasks)
        try:
            with caplog.at_level(logging.WARNING, "spark_integration.planning.rescale"):
                caplog.clear()
                query = _query(spark, tmp_path / "in", backend, partitions, CASE)
                lines += caplog.messages
        finally:
            spark.conf.unset(TASKS_CONF)
        got += run_stream_batches(query, tmp_path / "ck", _steps(tmp_path / "in", part))
        recorded = read_metadata(operator)
        layouts.append((recorded["num_partitions"], recorded.get("key_groups")))
    return got, layouts, lines


def test_restarts_that_spread_and_relabel_the_partitions_write_the_uninterrupted_output(
    spark, tmp_path, tmp_path_factory, caplog
):
    from pyspark.sql import functions as F

    from spark_integration.datasource import register

    expected = _uninterrupted(spark, tmp_path_factory, CASE)
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    got, layouts, lines = restarts(spark, tmp_path, backend, RUNS, caplog)
    _same_batches(expected, got)
    assert layouts == [(4, 16), (8, 16), (4, 24)]
    assert len(lines) == 2, lines
    assert "from 16 to 16 partitions (in 4, now 8 databases) at version 2" in lines[0]
    assert "from 16 to 24 partitions (in 8, now 4 databases) at version 4" in lines[1]

    # every row's partition is the one Spark's own hash gives its key
    source = CheckpointSource(backend.checkpoint_uri, {})
    assert source.layout(CASE) == (4, 24)
    rows = list(store_rows(source, CASE, "sessions", version=4))  # the rescaled state
    assert len(rows) > 5
    keys = spark.createDataFrame(
        sorted({r["key"] for r in rows}), "user string, uid long"
    ).select("user", "uid", F.expr("pmod(hash(user, uid), 24)").alias("p"))
    sparks = {(k["user"], k["uid"]): k["p"] for k in keys.collect()}
    assert {(r["key"], r["partition"]) for r in rows} == set(sparks.items())
    assert len(set(sparks.values())) > 4  # more partitions than databases hold rows

    # the CLI reads one partition's rows, and only those
    wanted = rows[0]["partition"]
    out = run_cli("dump", backend.checkpoint_uri, "--store", "sessions", "--version", "4",
                  "--partition", str(wanted))  # fmt: skip
    assert out.returncode == 0, out.stderr
    dumped = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(json.dumps(r, sort_keys=True) for r in dumped) == sorted(
        json.dumps({**r, "key": list(r["key"])}, sort_keys=True)
        for r in rows if r["partition"] == wanted
    )  # fmt: skip
    assert run_cli("dump", backend.checkpoint_uri, "--store", "sessions", "--partition",
                   "24").returncode == 2  # fmt: skip

    listing = run_cli("ls", backend.checkpoint_uri)
    assert listing.returncode == 0 and "1, 5, 9, ... (6 of 24, step 4)" in listing.stdout

    # the data source: a Spark partition per database, rows labelled the same
    register(spark)
    read = spark.read.format("sessionstore").option("path", backend.checkpoint_uri)
    read = read.option("batchId", "4")
    table = read.option("store", "sessions").load()
    assert table.rdd.getNumPartitions() == 4
    labelled = {((r["key_0"], r["key_1"]), r["partition_id"]) for r in table.collect()}
    assert labelled == {(r["key"], r["partition"]) for r in rows}
    one = read.option("store", "sessions").option("partition", str(wanted)).load().collect()
    assert {r["partition_id"] for r in one} == {wanted} and len(one) == len(dumped)


def test_a_checkpoint_with_a_database_per_partition_continues_as_it_is(
    spark, tmp_path, tmp_path_factory, caplog
):
    """8 partitions written with a database each (8 tasks asked: the layout every
    checkpoint had before partitions shared databases, no ``key_groups``), then
    restarted where a new checkpoint of 8 partitions would get 4 databases: it
    continues in its 8, with no rescale, exactly."""
    expected = _uninterrupted(spark, tmp_path_factory, CASE)
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    runs = ((8, "8", range(0, 3)), (8, None, range(3, 6)))
    got, layouts, lines = restarts(spark, tmp_path, backend, runs, caplog)
    _same_batches(expected, got)
    assert layouts == [(8, None), (8, None)] and lines == []
    assert not open_filesystem(backend.checkpoint_uri).child(CASE).exists("_generations")
