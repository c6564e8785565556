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


def _write(uri, local):
    for partition in (0, 1):
        p = StateStoreProvider(uri, "op", partition, SPECS, local)
        for v in range(3):
            h = p.get_store(v)
            h["sessions"].put((f"u{partition}", v % 2), v, v + 5, {"n": v, "avg": v / 2})
            h["plans"].put(f"u{partition}", f"plan{v}", v * 10)
            h.commit()
        p.close()


def _cli(uri, store):
    out = subprocess.run(
        [sys.executable, "-m", "sessionstore.cli", "dump", uri, "--store", store, "--version", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return list(map(json.loads, out.stdout.splitlines()))


def test_reader_has_typed_columns_and_matches_the_cli(spark, tmp_path):
    uri = f"file://{tmp_path}/ck"
    _write(uri, tmp_path / "local")
    register(spark)
    read = spark.read.format("sessionstore").option("path", uri).option("batchId", "2")
    sessions = read.option("store", "sessions").load()
    # a tuple key becomes one column per field; the dict value a struct; ints and
    # floats (0 and 0.5 in "avg") widen to double
    assert sessions.schema.simpleString() == (
        "struct<partition_id:int,key_0:string,key_1:bigint,start:bigint,end:bigint,"
        "value:struct<n:bigint,avg:double>>"
    )
    got = sorted(
        (r.partition_id, [r.key_0, r.key_1], r.start, r.end, r.value.asDict())
        for r in sessions.collect()
    )
    want = sorted(
        (row["partition"], row["key"], row["start"], row["end"], row["value"])
        for row in _cli(uri, "sessions")
    )
    assert got == want and len(got) == 4
    plans = read.option("store", "plans").load()
    assert plans.columns == ["partition_id", "key", "valid_from", "valid_to", "value"]
    got = sorted(tuple(r) for r in plans.collect())
    want = sorted(
        (row["partition"], row["key"], row["valid_from"], row["valid_to"], row["value"])
        for row in _cli(uri, "plans")
    )
    assert got == want and len(got) == 4
    named = (
        read.option("store", "sessions")
        .option("keySchema", "user string, bucket int")
        .option("valueSchema", "n bigint")
        .option("partition", "1")
        .load()
    )
    assert named.columns == ["partition_id", "user", "bucket", "start", "end", "value"]
    assert sorted((r.user, r.bucket, r.value.n) for r in named.collect()) == [
        ("u1", 0, 0), ("u1", 1, 1),
    ]  # fmt: skip
    as_json = read.option("store", "sessions").option("valueSchema", "string").load()
    assert {json.loads(r.value)["n"] for r in as_json.collect()} == {0, 1}


def test_reader_errors(spark, tmp_path):
    uri = f"file://{tmp_path}/ck"
    _write(uri, tmp_path / "local")
    register(spark)
    with pytest.raises(Exception, match="has no store 'nope'"):
        spark.read.format("sessionstore").option("path", uri).option("store", "nope").load()
    with pytest.raises(Exception, match="needs .option\\('store'"):
        spark.read.format("sessionstore").option("path", uri).load()


def test_type_inference_and_ddl_fields():
    from spark_integration.datasource import _fields, infer_type

    assert infer_type([1, 2.5]) == "double"
    assert infer_type([1, "a"]) == "string"
    assert infer_type([None, None]) == "string"
    assert infer_type([{"n": 1}, {"n": None, "tags": ["a"]}]) == (
        "struct<`n`: bigint, `tags`: array<string>>"
    )
    assert infer_type([[1, 2], [3.0]]) == "array<double>"
    assert _fields("user string, m map<string, int>, `when` timestamp") == [
        ("user", "string"), ("m", "map<string, int>"), ("when", "timestamp"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="cannot read 'oops' in 'a int, oops' as 'name type'"):
        _fields("a int, oops")
