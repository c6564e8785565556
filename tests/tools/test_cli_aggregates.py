"""Dumps of aggregating operators' stores show the aggregates by name, from the
output plan each operator records with its state; ``--raw`` shows the accumulators.

The checkpoints are written by the operator core through the provider, as a Spark
task writes them, and read by the CLI run in the test's process
(:func:`tests.tools.cli_runner.run_cli`).
"""

from __future__ import annotations

import csv
import io
import json

import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, StateStoreProvider, StoreSpec
from sessionstore.operators import (
    CountWindowAggregator,
    SessionWindowAggregator,
    SessionWindows,
    TimeWindows,
    WindowAggregator,
)
from tests.tools.cli_runner import run_cli as run

CLICKS = {"clicks": "count", "entry": ("first", "page"), "exit": ("last", "page")}
SESSIONS = [StoreSpec("sessions", "session", 10**9)]


def lines(*args):
    out = run(*args)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def write(uri, local, operator, specs, make, batches, partition=0):
    """Commit one version per batch; ``make(handle)`` builds the operator and each
    batch is a list of calls on it. Returns everything the operator emitted."""
    provider = StateStoreProvider(uri, operator, partition, specs, local)
    emitted = []
    for version, batch in enumerate(batches):
        handle = provider.get_store(version)
        op = make(handle)
        for call in batch:
            emitted += call(op)
        handle.commit()
    provider.close()
    return emitted


def click(key, ts, page):
    return lambda op: op.process(key, {"page": page}, ts)


def sessionize(handle, aggregations=CLICKS):
    return SessionWindowAggregator(
        handle["sessions"], SessionWindows(100), aggregations=aggregations, emit="update"
    )


def write_sessions(uri, local):
    return write(
        uri, local, "sessionize", SESSIONS, sessionize,
        [[click("u1", 1, "/a"), click("u2", 3, "/x"), click("u1", 5, "/b")],
         [click("u1", 9, "/c"), click("u1", 500, "/d")]],
    )  # fmt: skip


SESSION_ROWS = [
    {"partition": 0, "key": "u1", "start": 1, "end": 9,
     "value": {"clicks": 3, "entry": "/a", "exit": "/c"}},
    {"partition": 0, "key": "u1", "start": 500, "end": 500,
     "value": {"clicks": 1, "entry": "/d", "exit": "/d"}},
    {"partition": 0, "key": "u2", "start": 3, "end": 3,
     "value": {"clicks": 1, "entry": "/x", "exit": "/x"}},
]  # fmt: skip
RAW_SESSION_VALUES = [
    [3, [1, "/a"], [9, "/c"]],
    [1, [500, "/d"], [500, "/d"]],
    [1, [3, "/x"], [3, "/x"]],
]


def test_session_dump_shows_the_aggregates_the_operator_emitted(tmp_path):
    uri = f"file://{tmp_path}/ck"
    emitted = write_sessions(uri, tmp_path / "local")
    rows = lines("dump", uri, "--store", "sessions")
    assert rows == SESSION_ROWS
    # the operator's own output: the last update of every session that survives
    last = {(u.key, u.start, u.end): u.value for u in emitted}
    assert {(r["key"], r["start"], r["end"]): r["value"] for r in rows} == {
        k: v for k, v in last.items() if v is not None
    }
    raw = lines("dump", uri, "--store", "sessions", "--raw")
    assert raw == [{**r, "value": v} for r, v in zip(SESSION_ROWS, RAW_SESSION_VALUES, strict=True)]
    assert lines("get", uri, "--store", "sessions", "--key", "u2") == SESSION_ROWS[2:]
    assert lines("get", uri, "--store", "sessions", "--key", "u2", "--raw") == raw[2:]
    # the live local database (no _metadata there) carries the plan as well
    assert lines("dump", str(tmp_path / "local"), "--store", "sessions") == SESSION_ROWS
    # and an earlier version of the checkpoint
    assert lines("dump", uri, "--store", "sessions", "--version", "1") == [
        {"partition": 0, "key": "u1", "start": 1, "end": 5,
         "value": {"clicks": 2, "entry": "/a", "exit": "/b"}},
        SESSION_ROWS[2],
    ]  # fmt: skip


def test_flat_formats_have_a_column_per_aggregate(tmp_path):
    uri = f"file://{tmp_path}/ck"
    write_sessions(uri, tmp_path / "local")
    out = run("dump", uri, "--store", "sessions", "--format", "csv", "--epoch-ms")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "partition,key,start,end,clicks,entry,exit",
        "0,u1,1,9,3,/a,/c",
        "0,u1,500,500,1,/d,/d",
        "0,u2,3,3,1,/x,/x",
    ]
    out = run("dump", uri, "--store", "sessions", "--format", "csv", "--raw", "--epoch-ms")
    assert list(csv.reader(io.StringIO(out.stdout)))[:2] == [
        ["partition", "key", "start", "end", "value"],
        ["0", "u1", "1", "9", '[3, [1, "/a"], [9, "/c"]]'],
    ]
    out = run("dump", uri, "--store", "sessions", "--format", "table", "--limit", "1", "--epoch-ms")
    assert out.returncode == 0, out.stderr
    table = [[c.strip() for c in line.split("│")[1:-1]] for line in out.stdout.splitlines()]
    assert [row for row in table if row] == [["0", "u1", "1", "9", "3", "/a", "/c"]]
    header = out.stdout.splitlines()[1]
    assert [c.strip() for c in header.split("┃")[1:-1]] == [
        "partition", "key", "start", "end", "clicks", "entry", "exit",
    ]  # fmt: skip
    target = tmp_path / "s.parquet"
    out = run("dump", uri, "--store", "sessions", "--format", "parquet", "--output", str(target))
    assert out.returncode == 0, out.stderr
    table = pq.read_table(target)
    assert [(f.name, str(f.type)) for f in table.schema] == [
        ("partition", "int64"), ("key", "string"), ("start", "int64"), ("end", "int64"),
        ("clicks", "string"), ("entry", "string"), ("exit", "string"),
    ]  # fmt: skip
    assert table.to_pylist()[0] == {
        "partition": 0, "key": "u1", "start": 1, "end": 9, "clicks": "3", "entry": "/a",
        "exit": "/c",
    }  # fmt: skip


def test_window_and_count_window_stores(tmp_path):
    uri = f"file://{tmp_path}/ck"
    windows = [StoreSpec("windows", "window", 1000, window_size_ms=10)]

    def window_op(handle):
        return WindowAggregator(
            handle["windows"], TimeWindows(10), emit="update",
            aggregations={"total": ("sum", "amount"), "pages": ("collect", "page")},
        )  # fmt: skip

    def buy(ts, amount, page):
        return lambda op: op.process("k", {"amount": amount, "page": page}, ts)

    write(uri, tmp_path / "l1", "windows", windows, window_op,
          [[buy(1, 5, "/a"), buy(4, 7, "/b"), buy(12, 1, "/c")]])  # fmt: skip
    assert lines("dump", uri, "--operator", "windows", "--store", "windows") == [
        {"partition": 0, "key": "k", "start": 0, "end": 10,
         "value": {"total": 12, "pages": ["/a", "/b"]}},
        {"partition": 0, "key": "k", "start": 10, "end": 20,
         "value": {"total": 1, "pages": ["/c"]}},
    ]  # fmt: skip

    # count windows keep each key's open window in a key-value store; an aggregate
    # named "count" meets the window's own count column
    def count_op(handle):
        return CountWindowAggregator(
            handle["open"], 3, aggregations={"count": "count", "last": ("last", "page")}
        )

    def message(offset, page):
        return lambda op: op.process("k", {"page": page}, offset)

    write(uri, tmp_path / "l2", "counts", [StoreSpec("open", "kv", 0)], count_op,
          [[message(o, f"/{o}") for o in range(5)]])  # fmt: skip
    args = ("dump", uri, "--operator", "counts", "--store", "open")
    assert lines(*args) == [
        {"partition": 0, "key": "k", "window": 1, "count": 2,
         "value": {"count": 2, "last": "/4"}},
    ]  # fmt: skip
    assert lines(*args, "--raw") == [
        {"partition": 0, "key": "k", "value": [1, 2, [2, [4, "/4"]], 4]}
    ]
    out = run(*args, "--format", "csv")
    assert out.stdout.splitlines() == [
        "partition,key,window,count,value.count,last",
        "0,k,1,2,2,/4",
    ]


def test_stores_without_a_plan_stay_raw(tmp_path):
    uri = f"file://{tmp_path}/ck"

    # an older checkpoint: accumulators written before operators recorded plans
    def old(handle):
        return handle["sessions"]

    write(uri, tmp_path / "l1", "old", SESSIONS, old,
          [[lambda store: store.put("u1", 1, 9, [3, [1, "/a"], [9, "/c"]]) or []]])  # fmt: skip
    assert lines("dump", uri, "--operator", "old", "--store", "sessions") == [
        {"partition": 0, "key": "u1", "start": 1, "end": 9, "value": [3, [1, "/a"], [9, "/c"]]}
    ]
    out = run("dump", uri, "--operator", "old", "--store", "sessions", "--format", "csv")
    assert out.stdout.splitlines()[0] == "partition,key,start,end,value"

    # a custom aggregation cannot be recorded; switching to one drops the old plan
    def custom(handle):
        return SessionWindowAggregator(
            handle["sessions"], SessionWindows(100), emit="update",
            initializer=lambda: [0], aggregator=lambda k, v, acc: [acc[0] + 1],
            merger=lambda k, a, b: [a[0] + b[0]],
        )  # fmt: skip

    make = iter([sessionize, custom])
    write(uri, tmp_path / "l2", "custom", SESSIONS, lambda h: next(make)(h),
          [[click("u1", 1, "/a")], [click("u2", 1, "/b")]])  # fmt: skip
    assert lines("dump", uri, "--operator", "custom", "--store", "sessions") == [
        {"partition": 0, "key": "u1", "start": 1, "end": 1, "value": [1, [1, "/a"], [1, "/a"]]},
        {"partition": 0, "key": "u2", "start": 1, "end": 1, "value": [1]},
    ]


def test_a_value_the_plan_cannot_finish_is_a_clear_error(tmp_path):
    uri = f"file://{tmp_path}/ck"

    def both(handle):
        sessionize(handle)
        return handle["sessions"]

    write(uri, tmp_path / "l", "bad", SESSIONS, both,
          [[lambda store: store.put("u1", 1, 9, "not an accumulator") or []]])  # fmt: skip
    out = run("dump", uri, "--store", "sessions")
    assert out.returncode == 2
    assert "key 'u1' holds 'not an accumulator'" in out.stderr and "--raw" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert lines("dump", uri, "--store", "sessions", "--raw")[0]["value"] == "not an accumulator"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("ab"), st.integers(0, 400), st.sampled_from(["/x", "/y", "/z"])),
        max_size=25,
    ),
    st.booleans(),
)
def test_the_recorded_plan_finishes_every_stored_session_as_the_operator_emitted_it(
    records, track_offsets
):
    from sessionstore.operators.aggregations import recorded_output

    store = InMemorySessionStore("s", 10**9)
    agg = SessionWindowAggregator(
        store, SessionWindows(50), emit="update", track_offsets=track_offsets,
        aggregations={**CLICKS, "n": ("sum", "n"), "low": ("min", "n"), "pages": ("collect", "page")},
    )  # fmt: skip
    last = {}
    for offset, (key, ts, page) in enumerate(records):
        for u in agg.process(key, {"page": page, "n": ts % 7}, ts, offset):
            last[(u.key, u.start, u.end)] = u.value
    finish = recorded_output(store)
    stored = {(w.key, w.start, w.end): finish(v) for w, v in store.fetch_range(None, None)}
    assert stored == {k: ({}, v) for k, v in last.items() if v is not None}


def test_a_plan_of_a_newer_release_reads_raw():
    import msgpack

    from sessionstore.operators.aggregations import OUTPUT_PLAN_AUX, recorded_output

    store = InMemorySessionStore("s", 10**9)
    assert recorded_output(store) is None
    for plan in (
        {"layout": "future", "aggregates": [["n", "count", None]]},
        {"layout": "acc", "aggregates": [["n", "median", "x"]]},
    ):
        store.write_aux(OUTPUT_PLAN_AUX, msgpack.packb(plan))
        assert recorded_output(store) is None
    store.write_aux(
        OUTPUT_PLAN_AUX, msgpack.packb({"layout": "acc", "aggregates": [["n", "count", None]]})
    )
    assert recorded_output(store)([7]) == ({}, {"n": 7})
