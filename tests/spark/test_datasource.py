"""spark.read.format("sessionstore") equals the CLI's jsonl on the same version."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from spark_integration.datasource import register

pytestmark = pytest.mark.slow

SPECS = [StoreSpec("sessions", "session", 10**9), StoreSpec("plans", "versioned", 10**9)]


def test_reader_matches_the_cli(spark, tmp_path):
    uri = f"file://{tmp_path}/ck"
    for partition in (0, 1):
        p = StateStoreProvider(uri, "op", partition, SPECS, tmp_path / "local")
        for v in range(3):
            h = p.get_store(v)
            h["sessions"].put(f"u{partition}", v, v + 5, {"n": v})
            h["plans"].put(f"u{partition}", f"plan{v}", v * 10)
            h.commit()
        p.close()
    register(spark)
    for store, extra in (("sessions", ["start", "end"]), ("plans", ["valid_from", "valid_to"])):
        df = (
            spark.read.format("sessionstore")
            .option("path", uri)
            .option("operator", "op")
            .option("store", store)
            .option("batchId", "2")
            .load()
        )
        assert df.columns == ["partition_id", "key", *extra, "value"]
        got = sorted(
            (
                r["partition_id"],
                r["key"],
                *[r[c] for c in extra],
                json.loads(r["value"]) if store == "sessions" else r["value"],
            )
            for r in df.collect()
        )
        cli = subprocess.run(
            [sys.executable, "-m", "sessionstore.cli", "dump", uri, "--operator", "op", "--store", store, "--version", "2"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        want = sorted(
            (row["partition"], row["key"], *[row[c] for c in extra], row["value"])
            for row in map(json.loads, cli.stdout.splitlines())
        )
        assert got == want and len(got) >= 4
    with pytest.raises(Exception, match="has no store 'nope'"):
        spark.read.format("sessionstore").option("path", uri).option("operator", "op").option(
            "store", "nope"
        ).load()
