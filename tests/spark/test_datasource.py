"""spark.read.format("sessionstore") equals the CLI's jsonl on the same version."""

from __future__ import annotations

import json

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from spark_integration.datasource import register
from tests.tools.cli_runner import run_cli

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
    out = run_cli("dump", uri, "--store", store, "--version", "2")
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
    # values a join holds (msgpack extension types), read back typed
    from datetime import UTC, date, datetime
    from decimal import Decimal

    from spark_integration.datasource import _text

    when = datetime(2024, 1, 1, 12, tzinfo=UTC)
    assert infer_type([when, None]) == "timestamp"
    assert infer_type([datetime(2024, 1, 1)]) == "timestamp_ntz"
    assert infer_type([{"day": date(2024, 2, 29), "price": Decimal("1.50")}]) == (
        "struct<`day`: date, `price`: string>"
    )
    assert infer_type([when, datetime(2024, 1, 1)]) == "string"
    assert [_text(when), _text(date(2024, 2, 29)), _text(Decimal("1.50"))] == [
        "2024-01-01T12:00:00+00:00", "2024-02-29", "1.50",
    ]  # fmt: skip
    assert _fields("user string, m map<string, int>, `when` timestamp") == [
        ("user", "string"), ("m", "map<string, int>"), ("when", "timestamp"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="cannot read 'oops' in 'a int, oops' as 'name type'"):
        _fields("a int, oops")


def test_sessionize_state_reads_as_named_aggregates(spark, tmp_path):
    """After a real sessionize query, the store's value is a struct of the aggregates
    by name, equal to the query's own output; raw reads the accumulators."""
    from spark_integration import StateBackend, sessionize

    uri = f"file://{tmp_path}/state"
    events = [("u1", 1, "/a"), ("u2", 3, "/x"), ("u1", 5, "/b"), ("u1", 9, "/c"), ("u1", 500, "/d")]
    out = sessionize(
        spark.createDataFrame(events, "user string, ts long, page string"),
        key="user", timestamp="ts", gap="100 ms", grace="1 s", emit="update",
        aggregations={"clicks": "count", "entry": ("first", "page"), "exit": ("last", "page")},
        backend=StateBackend(uri, local_dir=str(tmp_path / "local")), num_partitions=2,
    ).collect()  # fmt: skip
    emitted = {
        (r.user, r.session_start, r.session_end): (r.clicks, r.entry, r.exit)
        for r in out
        if r.change == "upsert"
    }
    register(spark)
    read = spark.read.format("sessionstore").option("path", uri).option("store", "sessions")
    state = read.load()
    assert state.schema.simpleString() == (
        "struct<partition_id:int,key:string,start:bigint,end:bigint,"
        "value:struct<clicks:bigint,entry:string,exit:string>>"
    )
    got = {(r.key, r.start, r.end): (r.value.clicks, r.value.entry, r.value.exit)
           for r in state.collect()}  # fmt: skip
    assert got == {
        ("u1", 1, 9): (3, "/a", "/c"), ("u1", 500, 500): (1, "/d", "/d"),
        ("u2", 3, 3): (1, "/x", "/x"),
    }  # fmt: skip
    assert {k: v for k, v in emitted.items() if k in got} == got
    raw = read.option("raw", "true").load()
    assert raw.schema["value"].simpleString() == "value:array<string>"
    assert sorted(r.value for r in raw.collect()) == [
        ["1", '[3, "/x"]', '[3, "/x"]'], ["1", '[500, "/d"]', '[500, "/d"]'],
        ["3", '[1, "/a"]', '[9, "/c"]'],
    ]  # fmt: skip
    with pytest.raises(Exception, match="option 'raw' must be 'true' or 'false', got 'yes'"):
        read.option("raw", "yes").load()


def test_a_pickled_store_is_refused_unless_allow_pickle(spark, tmp_path):
    """A checkpoint whose _metadata names the pickle serde: the data source refuses
    it with one line naming the store and the option, before sampling anything
    (no unpickling); with .option("allowPickle", "true") it reads."""
    from tests.tools.test_cli_pickle import _pickled_checkpoint

    uri, marker = _pickled_checkpoint(tmp_path)
    register(spark)
    read = spark.read.format("sessionstore").option("path", uri).option("store", "s")
    with pytest.raises(Exception) as caught:
        read.load().collect()
    message = str(caught.value)
    assert f"store 's' of {uri}/op is pickled" in message
    assert '.option("allowPickle", "true")' in message
    assert not marker.exists()
    rows = read.option("allowPickle", "true").option("key", "k1").load().collect()
    assert [r.value for r in rows] == ["hello"]
