"""Quiet streams, joins: ``window_join`` and ``temporal_join`` expire their state in a
batch Spark runs for it, with no new row, as Spark's own stream-stream join evicts
its state in the batch without data that follows a watermark move
(spark_integration/planning/due_batches.py).

Each test feeds one file of rows for several keys (at 2 partitions some of them
share no partition with the next file's key), then a file whose one key moves the
event time 5 minutes on, past every earlier row's retention, then nothing. The
earlier keys' partitions see no further row: only the shared event time, in a batch
without input, can expire them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark_integration import StateBackend, temporal_join, window_join
from spark_integration.datasource import register
from tests.spark.streams import json_source, write_json
from tests.spark.test_quiet_streams import Collected, wait_for, wait_idle

pytestmark = pytest.mark.slow

T0 = 1_700_000_000_000
QUIET = "abdefg"  # keys of the first file only


def stored_keys(spark: Any, backend: StateBackend, operator: str, store: str) -> list:
    """The keys of ``store`` of ``operator`` as the sessionstore data source reads them."""
    register(spark)
    read = spark.read.format("sessionstore").option("path", backend.checkpoint_uri)
    rows = read.option("operator", operator).option("store", store).load().collect()
    return sorted(r["key"] for r in rows)


def run_quiet(
    spark: Any, tmp_path: Path, builds: dict, first: list, second: list, settled: Any
) -> dict[str, Collected]:
    """Start each build over one folder, feed ``first`` then ``second``, wait until
    ``settled(queries)`` holds, then until each query is idle
    (:func:`tests.spark.test_quiet_streams.wait_idle`) and stop them."""  # fmt: skip
    source = tmp_path / "in"
    source.mkdir()
    schema = "side string, key string, ts long, v long"
    queries = {
        name: Collected(build(json_source(spark, source, schema)), tmp_path / f"ck-{name}")
        for name, build in builds.items()
    }
    try:
        for index, rows in enumerate((first, second)):
            write_json(source, index, rows)
            for q in queries.values():
                q.query.processAllAvailable()
        wait_for(lambda: settled(queries))
        wait_idle(q.idle_triggers for q in queries.values())
    finally:
        for q in queries.values():
            q.query.stop()
    return queries


def test_quiet_window_join_expires_as_sparks_stream_stream_join(spark, tmp_path):
    """Spark's time-interval inner join (watermark 10 s on both sides) and
    ``window_join`` (within 5 s, grace 10 s) over the same stream: the same pairs,
    and once the input goes quiet both drop every buffered row of the first file
    in one batch without data (Spark's state rows, our stores' keys), and run no
    other batch over the idle period."""
    from pyspark.sql import functions as F

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    first = []
    for i, key in enumerate(QUIET):
        first.append({"side": "l", "key": key, "ts": T0 + i * 1_000, "v": i})
        first.append({"side": "r", "key": key, "ts": T0 + i * 1_000 + 2_000, "v": 10 + i})
    later = T0 + 300_000
    second = [
        {"side": "l", "key": "c", "ts": later, "v": 100},
        {"side": "r", "key": "c", "ts": later + 1_000, "v": 101},
    ]

    def side(stream, name, watermark):
        out = stream.filter(F.col("side") == name)
        if watermark:
            out = out.withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "10 seconds")
        return out.select("key", "t" if watermark else "ts", "v")

    def builtin(stream):
        left = side(stream, "l", True).select(F.col("key").alias("lk"), F.col("t").alias("lt"), "v")
        right = side(stream, "r", True).select(
            F.col("key").alias("rk"), F.col("t").alias("rt"), F.col("v").alias("rv")
        )
        on = (F.col("lk") == F.col("rk")) & F.col("rt").between(
            F.col("lt") - F.expr("INTERVAL 5 SECONDS"), F.col("lt") + F.expr("INTERVAL 5 SECONDS")
        )
        return left.join(right, on)

    def ours(stream):
        return window_join(
            side(stream, "l", False), side(stream, "r", False), key="key", left_timestamp="ts",
            right_timestamp="ts", within="5 seconds", grace="10 seconds", backend=backend,
            name="wj",
        )  # fmt: skip

    def spark_state_rows(q: Collected) -> int | None:
        progress = q.query.lastProgress
        return progress["stateOperators"][0]["numRowsTotal"] if progress else None

    def settled(qs):
        return any(r["lk"] == "c" for r in qs["spark"].rows) and spark_state_rows(qs["spark"]) == 2

    queries = run_quiet(spark, tmp_path, {"spark": builtin, "ours": ours}, first, second, settled)
    spark_pairs = sorted((r["lk"], r["v"], r["rv"]) for r in queries["spark"].rows)
    ours_pairs = sorted((r["key"], r["v"], r["right_v"]) for r in queries["ours"].rows)
    assert spark_pairs == sorted([(k, v, v + 10) for v, k in enumerate(QUIET)] + [("c", 100, 101)])
    assert ours_pairs == spark_pairs
    assert spark_state_rows(queries["spark"]) == 2  # only c's two rows are left
    assert stored_keys(spark, backend, "wj", "left") == ["c"]
    assert stored_keys(spark, backend, "wj", "right") == ["c"]
    assert queries["spark"].idle_batches() == 1
    assert queries["ours"].idle_batches() == 1


def test_quiet_temporal_join_expires_history(spark, tmp_path):
    """``temporal_join`` with 10 s of history: the first file gives every key two
    versions (the older one goes to history), the second one a version of ``c`` 5
    minutes later; with no further row, one batch without input expires the older
    versions in every partition, and no other batch runs over the idle period."""
    from pyspark.sql import functions as F

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    first = []
    for i, key in enumerate(QUIET):
        first.append({"side": "t", "key": key, "ts": T0 + i, "v": i})
        first.append({"side": "t", "key": key, "ts": T0 + 1_000 + i, "v": 10 + i})
        first.append({"side": "s", "key": key, "ts": T0 + 2_000, "v": 0})
    second = [{"side": "t", "key": "c", "ts": T0 + 300_000, "v": 100}]

    def ours(stream):
        def side(name):
            return stream.filter(F.col("side") == name).select("key", "ts", "v")

        return temporal_join(
            side("s"), side("t"), key="key", stream_timestamp="ts", table_timestamp="ts",
            history_retention="10 seconds", backend=backend, name="tj",
        )  # fmt: skip

    def versions() -> list:
        register(spark)
        read = spark.read.format("sessionstore").option("path", backend.checkpoint_uri)
        rows = read.option("operator", "tj").option("store", "table").load().collect()
        return sorted((r["key"], r["valid_from"]) for r in rows)

    queries = run_quiet(spark, tmp_path, {"ours": ours}, first, second, lambda qs: True)
    joined = sorted((r["key"], r["table_v"]) for r in queries["ours"].rows)
    assert joined == [(k, 10 + i) for i, k in enumerate(QUIET)]
    latest = [(k, T0 + 1_000 + i) for i, k in enumerate(QUIET)] + [("c", T0 + 300_000)]
    assert versions() == sorted(latest)
    assert queries["ours"].idle_batches() == 1
