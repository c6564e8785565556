"""temporal_join on real Spark: equals a brute-force as-of join in pandas."""

from __future__ import annotations

import random
from datetime import date, datetime
from decimal import Decimal

import pandas as pd
import pytest

from spark_integration import StateBackend, temporal_join
from tests.spark.streams import run_stream, two_json_sources

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
    table, stream, step = two_json_sources(
        spark, tmp_path, ("rates", "currency string, rate_ts long, rate long"),
        ("payments", "currency string, ts long, amount long"),
    )  # fmt: skip
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    out = temporal_join(
        stream, table, key="currency", stream_timestamp="ts", table_timestamp="rate_ts",
        history_retention=10**9, how=how, backend=backend,
    )  # fmt: skip
    assert out.columns == ["currency", "ts", "amount", "rate"]

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


def test_parquet_dumps_of_the_table_hold_its_versions_times_as_timestamps(spark, tmp_path):
    """Over a timestamp table input the versioned store records so: ``dump --format
    parquet`` writes ``valid_from``/``valid_to`` as timestamp[ms, UTC] columns, the
    instants of the table's rows; over epoch milliseconds they stay int64. jsonl
    and the data source keep integers (its schema declares the times bigint)."""
    import json
    from datetime import UTC, datetime

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from spark_integration.datasource import register
    from tests.tools.test_cli import run as cli

    register(spark)
    rates = [("A", 1_000_123, 5), ("A", 1_004_000, 6), ("B", 2_000_000, 7)]
    payments = [("A", 1_002_000, 10), ("B", 2_500_000, 20)]
    # (key, valid_from, valid_to, rate) of every version the table holds
    versions = sorted([("A", 1_000_123, 1_004_000, 5), ("A", 1_004_000, None, 6),
                       ("B", 2_000_000, None, 7)])  # fmt: skip

    def instant(ms):
        return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)

    for name, stamped in [("ts", True), ("ms", False)]:
        table = spark.createDataFrame(rates, "currency string, rate_ts long, rate long")
        stream = spark.createDataFrame(payments, "currency string, ts long, amount long")
        if stamped:
            table = table.withColumn("rate_ts", F.timestamp_millis("rate_ts"))
            stream = stream.withColumn("ts", F.timestamp_millis("ts"))
        backend = StateBackend(f"file://{tmp_path}/{name}", local_dir=str(tmp_path / f"l-{name}"))
        out = temporal_join(
            stream, table, key="currency", stream_timestamp="ts", table_timestamp="rate_ts",
            history_retention=10**9, backend=backend,
        )  # fmt: skip
        assert sorted((r.currency, r.amount, r.rate) for r in out.collect()) == [
            ("A", 10, 5), ("B", 20, 7),
        ]  # fmt: skip
        target = tmp_path / f"{name}.parquet"
        dumped = cli("dump", backend.checkpoint_uri, "--store", "table", "--format", "parquet",
                     "--output", str(target))  # fmt: skip
        assert dumped.returncode == 0, dumped.stderr
        dump = pq.read_table(target)
        want = pa.timestamp("ms", tz="UTC") if stamped else pa.int64()
        assert dump.schema.field("valid_from").type == want
        assert dump.schema.field("valid_to").type == want
        got = sorted(
            (r["key"], r["valid_from"], r["valid_to"], json.loads(r["value"])["rate"])
            for r in dump.to_pylist()
        )
        shown = instant if stamped else (lambda ms: ms)
        assert got == [(k, shown(f), shown(t), rate) for k, f, t, rate in versions]
        lines = cli("dump", backend.checkpoint_uri, "--store", "table").stdout.splitlines()
        assert sorted((r["valid_from"], r["valid_to"]) for r in map(json.loads, lines)) == sorted(
            (f, t) for _, f, t, _ in versions
        )
        read = spark.read.format("sessionstore").option("path", backend.checkpoint_uri)
        df = read.option("store", "table").load()
        assert df.schema["valid_from"].dataType.simpleString() == "bigint"
        assert sorted(r.valid_from for r in df.collect()) == sorted(f for _, f, _, _ in versions)


def test_table_values_of_timestamp_date_and_decimal_types_are_held_and_read_back(spark, tmp_path):
    # the table's rows (the versions a later stream row looks up) hold values of
    # the Spark types msgpack lacks; the second batch's payment reads a version
    # held in state since the first
    rates = [
        [{"currency": "A", "rate_ts": "2024-01-01T00:00:00", "rate": "1.0850",
          "fixed": "2024-02-29T12:30:00.125", "until": "2024-03-31"}],
        [{"currency": "A", "rate_ts": "2024-01-01T00:00:10", "rate": "1.0900",
          "fixed": "1969-12-31T23:59:59", "until": "1969-12-31"}],
    ]  # fmt: skip
    payments = [
        [{"currency": "A", "ts": "2024-01-01T00:00:05", "amount": 3}],
        [{"currency": "A", "ts": "2024-01-01T00:00:06", "amount": 4},
         {"currency": "A", "ts": "2024-01-01T00:00:11", "amount": 5}],
    ]  # fmt: skip
    table, stream, step = two_json_sources(
        spark, tmp_path,
        ("rates", "currency string, rate_ts timestamp, rate decimal(10,4), fixed timestamp, "
         "until date"),
        ("payments", "currency string, ts timestamp, amount long"),
    )  # fmt: skip
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    out = temporal_join(
        stream, table, key="currency", stream_timestamp="ts", table_timestamp="rate_ts",
        history_retention="1 day", backend=backend,
    )  # fmt: skip

    collected = run_stream(out, tmp_path / "ck", [step(i, rates[i], payments[i]) for i in (0, 1)])
    got = sorted((r["amount"], r["rate"], r["fixed"], r["until"]) for r in collected)
    first, second = rates[0][0], rates[1][0]

    def version(rate):
        return (
            Decimal(rate["rate"]), datetime.fromisoformat(rate["fixed"]),
            date.fromisoformat(rate["until"]),
        )  # fmt: skip

    assert got == [(3, *version(first)), (4, *version(first)), (5, *version(second))]
