"""window_join on real Spark: equals a nested-loop join, each pair once."""

from __future__ import annotations

import json
import random

import pytest

from spark_integration import StateBackend, window_join

pytestmark = pytest.mark.slow


def write(folder, index, rows):
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{index:04d}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(folder / f"part-{index:04d}.json")


def test_matches_a_nested_loop_join(spark, tmp_path):
    rng = random.Random(2)
    batches = []
    for b in range(4):
        clicks = [
            {"ad": rng.choice("xyz"), "click_ts": b * 100 + rng.randrange(100)} for _ in range(8)
        ]
        views = [
            {"ad": rng.choice("xyz"), "view_ts": b * 100 + rng.randrange(100), "n": i}
            for i in range(8)
        ]
        batches.append((clicks, views))
    left_src, right_src = tmp_path / "clicks", tmp_path / "views"
    left_src.mkdir()
    right_src.mkdir()
    left = (
        spark.readStream.schema("ad string, click_ts long")
        .option("maxFilesPerTrigger", 1)
        .json(str(left_src))
    )
    right = (
        spark.readStream.schema("ad string, view_ts long, n long")
        .option("maxFilesPerTrigger", 1)
        .json(str(right_src))
    )
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    out = window_join(
        left, right, key="ad", left_timestamp="click_ts", right_timestamp="view_ts",
        within="30 ms", grace="1 second", backend=backend,
    )  # fmt: skip
    assert out.columns == ["ad", "click_ts", "right_ad", "view_ts", "n"]
    collected = []
    query = (
        out.writeStream.outputMode("append")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .foreachBatch(lambda batch, _: collected.extend(r.asDict() for r in batch.collect()))
        .start()
    )
    try:
        for i, (clicks, views) in enumerate(batches):
            write(left_src, i, clicks)
            write(right_src, i, views)
            query.processAllAvailable()
    finally:
        query.stop()
    clicks = [c for cs, _ in batches for c in cs]
    views = [v for _, vs in batches for v in vs]
    expected = sorted(
        (c["ad"], c["click_ts"], v["view_ts"], v["n"])
        for c in clicks
        for v in views
        if c["ad"] == v["ad"] and abs(c["click_ts"] - v["view_ts"]) <= 30
    )
    got = sorted((r["ad"], r["click_ts"], r["view_ts"], r["n"]) for r in collected)
    assert got == expected
    assert len(expected) > 5
