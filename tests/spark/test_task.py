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


def test_input_checks_name_the_missing_column_and_the_bad_time_type():
    from types import SimpleNamespace

    import pytest
    from pyspark.sql import types as T

    from spark_integration.task import checked_fields, time_column

    df = SimpleNamespace(
        schema=T.StructType(
            [T.StructField("user", T.StringType()), T.StructField("ts", T.StringType())]
        )
    )
    assert list(checked_fields(df, ["user", "ts"])) == ["user", "ts"]
    with pytest.raises(
        ValueError, match=r"the left input has no column 'k' \(it has \['ts', 'user'\]\)"
    ):
        checked_fields(df, ["user", "k"], "the left input")
    with pytest.raises(ValueError, match="timestamp column 'ts' must be a timestamp or epoch"):
        time_column(checked_fields(df, ["ts"]), "ts")
