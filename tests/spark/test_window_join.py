"""window_join on real Spark: equals a nested-loop join, each pair once."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta
from decimal import Decimal

import pytest

from spark_integration import StateBackend, window_join
from tests.spark.streams import run_stream, two_json_sources

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
    left, right, step = two_json_sources(
        spark, tmp_path, ("clicks", "ad string, click_ts long"),
        ("views", "ad string, view_ts long, n long"),
    )  # fmt: skip
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    out = window_join(
        left, right, key="ad", left_timestamp="click_ts", right_timestamp="view_ts",
        within="30 ms", grace="1 second", backend=backend,
    )  # fmt: skip
    assert out.columns == ["ad", "click_ts", "right_ad", "view_ts", "n"]
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


def test_timestamp_date_and_decimal_columns_join_and_read_back(spark, tmp_path):
    # rows of every Spark type msgpack lacks are held in state between batches:
    # event times as timestamps, values as dates, decimals and local timestamps,
    # and a map (read back from the store as lists, which Arrow refuses for a map)
    base = datetime(2024, 1, 1)

    def at(ms):
        return (base + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")

    batches = [
        (
            [{"ad": "x", "click_ts": at(10), "day": "2024-02-29", "price": "1.50",
              "tags": {"a": 1}},
             {"ad": "y", "click_ts": at(20), "day": "1969-12-31", "price": "-0.01",
              "tags": {"b": 2, "c": None}}],
            [{"ad": "x", "view_ts": at(35), "seen": "2001-02-03T04:05:06.789"}],
        ),
        (
            [{"ad": "x", "click_ts": at(50), "day": "2024-03-01", "price": "99.99",
              "tags": {}}],
            [{"ad": "y", "view_ts": at(40), "seen": "1999-12-31T23:59:59"},
             {"ad": "x", "view_ts": at(70), "seen": "2000-01-01T00:00:00"}],
        ),
    ]  # fmt: skip
    left, right, step = two_json_sources(
        spark, tmp_path,
        ("clicks", "ad string, click_ts timestamp, day date, price decimal(10,2), "
                   "tags map<string,int>"),
        ("views", "ad string, view_ts timestamp, seen timestamp_ntz"),
    )  # fmt: skip
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    out = window_join(
        left, right, key="ad", left_timestamp="click_ts", right_timestamp="view_ts",
        within="30 ms", backend=backend,
    )  # fmt: skip

    collected = run_stream(out, tmp_path / "ck", [step(i, *b) for i, b in enumerate(batches)])
    clicks = [c for cs, _ in batches for c in cs]
    views = [v for _, vs in batches for v in vs]
    expected = sorted(
        (c["ad"], datetime.fromisoformat(c["click_ts"]), date.fromisoformat(c["day"]),
         Decimal(c["price"]), sorted(c["tags"].items()), datetime.fromisoformat(v["view_ts"]),
         datetime.fromisoformat(v["seen"]))
        for c in clicks
        for v in views
        if c["ad"] == v["ad"]
        and abs(datetime.fromisoformat(c["click_ts"]) - datetime.fromisoformat(v["view_ts"]))
        <= timedelta(milliseconds=30)
    )  # fmt: skip
    got = sorted(
        (r["ad"], r["click_ts"], r["day"], r["price"], sorted(r["tags"].items()), r["view_ts"],
         r["seen"])
        for r in collected
    )  # fmt: skip
    assert got == expected
    # x at 10 with the view at 35; y at 20 with 40 and x at 50 with 35 (each
    # meeting a row held in state since the batch before); x at 50 with 70
    assert len(expected) == 4
