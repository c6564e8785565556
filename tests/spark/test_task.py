"""The task runtime's deterministic row order (no Spark session needed)."""

from __future__ import annotations

import random

import pyarrow as pa

from spark_integration.task import deterministic_order


def test_any_delivery_order_gives_the_same_sequence():
    rows = [
        {"user": u, "ts": t, "v": v, "s": {"a": a}}
        for u, t, v, a in [
            ("b", 1, 2, 1),
            ("a", 1, 2, 0),
            ("a", 1, 1, 5),
            ("a", 0, 9, None),
            ("b", 1, 2, 0),
        ]
    ]
    want = deterministic_order(pa.Table.from_pylist(rows), ["ts"]).to_pylist()
    assert [r["ts"] for r in want] == [0, 1, 1, 1, 1]
    assert want[1:3] == [
        {"user": "a", "ts": 1, "v": 1, "s": {"a": 5}},
        {"user": "a", "ts": 1, "v": 2, "s": {"a": 0}},
    ]
    rng = random.Random(1)
    for _ in range(20):
        shuffled = rows[:]
        rng.shuffle(shuffled)
        assert deterministic_order(pa.Table.from_pylist(shuffled), ["ts"]).to_pylist() == want
