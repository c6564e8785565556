"""temporal_join on real Spark: equals a brute-force as-of join in pandas."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from spark_integration import StateBackend, temporal_join
from tests.spark.streams import json_source, run_stream, write_json

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("how", ["inner", "left"])
def test_matches_a_brute_force_as_of_join(spark, tmp_path, how):
    rng = random.Random(4)
    batches = []
    for b in range(4):
        rates = [
            {
                "currency": rng.choice("ABC"),
                "rate_ts": b * 100 + rng.randrange(100),
                "rate": rng.randrange(1, 9),
            }
            for _ in range(6)
        ]
        payments = [
            {
                "currency": rng.choice("ABCD"),
                "ts": b * 100 + rng.randrange(100),
                "amount": rng.randrange(100),
            }
            for _ in range(10)
        ]
        batches.append((rates, payments))
    table_src, stream_src = tmp_path / "rates", tmp_path / "payments"
    table = json_source(spark, table_src, "currency string, rate_ts long, rate long")
    stream = json_source(spark, stream_src, "currency string, ts long, amount long")
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    out = temporal_join(
        stream, table, key="currency", stream_timestamp="ts", table_timestamp="rate_ts",
        history_retention=10**9, how=how, backend=backend,
    )  # fmt: skip
    assert out.columns == ["currency", "ts", "amount", "rate"]

    def step(i, rates, payments):
        return lambda: (write_json(table_src, i, rates), write_json(stream_src, i, payments))

    steps = [step(i, r, p) for i, (r, p) in enumerate(batches)]
    collected = run_stream(out, tmp_path / "ck", steps)
    # brute force: the table as known by the end of each payment's batch
    expected = []
    for b, (_, payments) in enumerate(batches):
        known = pd.DataFrame([r for rates, _ in batches[: b + 1] for r in rates])
        for p in payments:
            match = known[(known.currency == p["currency"]) & (known.rate_ts <= p["ts"])]
            if not match.empty:
                best = match[match.rate_ts == match.rate_ts.max()].iloc[-1]
                expected.append((p["currency"], p["ts"], p["amount"], int(best["rate"])))
            elif how == "left":
                expected.append((p["currency"], p["ts"], p["amount"], None))
    got = sorted((r["currency"], r["ts"], r["amount"], r["rate"]) for r in collected)
    assert got == sorted(expected, key=lambda r: (r[0], r[1], r[2], r[3] is None, r[3] or 0))
