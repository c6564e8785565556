"""window_aggregate on real Spark: tumbling and hopping windows equal a brute force."""

from __future__ import annotations

import random

import pytest

from spark_integration import StateBackend, window_aggregate
from tests.spark.test_sessionize import feed

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("advance", [None, 5_000])
def test_final_windows_equal_a_brute_force(spark, tmp_path, advance):
    rng = random.Random(9)
    size = 10_000
    batches, t = [], 0
    for _ in range(4):
        rows = []
        for _ in range(30):
            t += rng.randrange(0, 1_500)
            rows.append((f"u{rng.randrange(4)}", t - rng.randrange(0, 1_000), rng.randrange(1, 9)))
        batches.append(rows)
    far = t + 100_000
    batches += [[("zz", far, 0)], [("zz", far + 1, 0)]]
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))

    def build(stream):
        return window_aggregate(
            stream, key="user", timestamp="ts", size=f"{size} ms",
            advance=None if advance is None else f"{advance} ms", grace="2 seconds",
            aggregations={"n": "count", "spent": ("sum", "amount")}, backend=backend,
        )  # fmt: skip

    rows = feed(spark, tmp_path / "in", tmp_path / "ck", batches, build)
    got = sorted(
        (r["user"], r["window_start"], r["window_end"], r["n"], r["spent"], r["emission"])
        for r in rows
        if r["user"] != "zz"
    )
    step = advance or size
    expected: dict = {}
    for user, ts, amount in (r for b in batches for r in b if r[0] != "zz"):
        first = (ts - size) // step * step + step
        for start in range(first, ts // step * step + 1, step):
            n, spent = expected.get((user, start), (0, 0))
            expected[(user, start)] = (n + 1, spent + amount)
    want = sorted(
        (user, start, start + size, n, spent, "final")
        for (user, start), (n, spent) in expected.items()
    )
    assert got == want
