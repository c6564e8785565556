"""window_join on real Spark: equals a nested-loop join, each pair once."""

from __future__ import annotations

import random

import pytest

from spark_integration import StateBackend, window_join
from tests.spark.streams import json_source, run_stream, write_json

pytestmark = pytest.mark.slow


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
    left = json_source(spark, left_src, "ad string, click_ts long")
    right = json_source(spark, right_src, "ad string, view_ts long, n long")
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    out = window_join(
        left, right, key="ad", left_timestamp="click_ts", right_timestamp="view_ts",
        within="30 ms", grace="1 second", backend=backend,
    )  # fmt: skip
    assert out.columns == ["ad", "click_ts", "right_ad", "view_ts", "n"]

    def step(i, clicks, views):
        return lambda: (write_json(left_src, i, clicks), write_json(right_src, i, views))

    collected = run_stream(
        out, tmp_path / "ck", [step(i, c, v) for i, (c, v) in enumerate(batches)]
    )
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
