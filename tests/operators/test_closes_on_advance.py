"""``closes_on="advance"``: an event-time aggregator judged, batch by batch, by the
time it was last advanced to (Spark's watermark), never by the partition's own time.

Each micro-batch of a query starts with ``advance_to(shared)``, the largest time any
partition had after the batch before. Then which sessions and windows a batch emits,
and which rows are late, do not depend on which keys share a partition: the
property tests split one stream's keys over 1, 2 or 3 partitions and compare every
batch. The batch paths (record-exact replay, vectorised, columnar) equal the record
path in this mode as in the default one.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from zlib import crc32

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, StateDB
from sessionstore.operators import (
    SessionWindowAggregator,
    SessionWindows,
    TimeWindows,
    WindowAggregator,
)
from tests.operators.sessions.records import closed_rows, kv_table
from tests.operators.store_factories import memory_store

KEYS = st.sampled_from(["a", "b", "c", "d", "e"])
ROW = st.tuples(KEYS, st.integers(0, 80), st.integers(0, 9))
STREAM = st.lists(st.lists(ROW, max_size=20), min_size=1, max_size=6)
SESSION_AGGS = {"n": "count", "total": ("sum", "v"), "first": ("first", "v")}
WINDOW_AGGS = {"n": "count", "total": ("sum", "v")}


def _shifted(stream, shift):
    """Later batches mostly later, as a stream's are (rows may still be late)."""
    return [[(k, t + 40 * n * shift, v) for k, t, v in rows] for n, rows in enumerate(stream)]


def _run_partitioned(make, stream, parts, path):
    """Each batch's output, the stream's keys split over ``parts`` partitions (one
    aggregator each), every batch started by advancing each partition to the largest
    stream time any partition had after the batch before, as the engine does.
    ``path``: "record" (process per row), "rows" (process_rows) or "table"
    (process_batch, the columnar path where it applies)."""
    aggs = [make(f"p{i}") for i in range(parts)]
    out, dropped = [], []
    shared = None
    for rows in stream:
        batch = []
        for p, agg in enumerate(aggs):
            if shared is not None:
                batch += [_plain(u) for u in agg.advance_to(shared)]
            mine = sorted(
                (r for r in rows if crc32(r[0].encode()) % parts == p), key=lambda r: r[1]
            )
            if not mine:
                continue
            if path == "record":
                for k, t, v in mine:
                    batch += [_plain(u) for u in agg.process(k, {"v": v}, t)]
            elif path == "rows":
                batch += [_plain(u) for u in agg.process_rows(
                    [r[0] for r in mine], [r[1] for r in mine], [{"v": r[2]} for r in mine]
                )]  # fmt: skip
            else:
                table = agg.process_batch(kv_table(mine), "key", "ts", ["v"])
                batch += [
                    (r["key"], r["start"], r["end"], _value(r["value"]), r.get("kind"))
                    for r in table.to_pylist()
                ]
        times = [agg.stream_time for agg in aggs if agg.stream_time is not None]
        shared = max(times) if times else None
        out.append(Counter(batch))
        dropped.append(sum(agg.dropped_records for agg in aggs))
    return out, dropped


def _plain(u):
    return (u.key, u.start, u.end, _value(u.value), getattr(u, "kind", None))


def _plain_columns(closed):
    """Sessions closed as columns, as :func:`_plain` gives their updates."""
    return [(*row[:3], _value(row[3]), None) for row in closed_rows(closed)]


def _value(value):
    return None if value is None else tuple(sorted((k, repr(v)) for k, v in value.items()))


def _sessions(gap, grace, emit):
    def make(name):
        store = memory_store(name, gap + grace + 1)
        return SessionWindowAggregator(
            store, SessionWindows(gap, grace), aggregations=SESSION_AGGS, emit=emit,
            closes_on="advance",
        )  # fmt: skip

    return make


@settings(max_examples=120, deadline=None)
@given(
    stream=STREAM,
    gap=st.integers(0, 12),
    grace=st.integers(0, 8),
    shift=st.integers(0, 2),
    emit=st.sampled_from(["final", "update"]),
    path=st.sampled_from(["record", "rows", "table"]),
)
def test_session_batches_do_not_depend_on_the_partitioning(stream, gap, grace, shift, emit, path):
    stream = _shifted(stream, shift)
    one = _run_partitioned(_sessions(gap, grace, emit), stream, 1, "record")
    for parts in (2, 3):
        assert _run_partitioned(_sessions(gap, grace, emit), stream, parts, path) == one


@settings(max_examples=150, deadline=None)
@given(
    stream=STREAM,
    gap=st.integers(0, 12),
    grace=st.integers(0, 8),
    shift=st.integers(0, 2),
    emit=st.sampled_from(["final", "update"]),
    advance=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_session_batch_paths_equal_the_record_path_when_held(
    stream, gap, grace, shift, emit, advance
):
    """Any row order (not sorted), advances between some batches only: process_rows
    and process_table leave what process per row leaves, state included."""
    windows = SessionWindows(gap, grace)
    stores = {name: memory_store(name, gap + grace + 1) for name in ("rec", "rows", "table")}
    aggs = {
        name: SessionWindowAggregator(
            store, windows, aggregations=SESSION_AGGS, emit=emit, closes_on="advance"
        )  # fmt: skip
        for name, store in stores.items()
    }
    for rows, adv in zip(_shifted(stream, shift), advance, strict=False):
        st_now = aggs["rec"].stream_time
        if adv and st_now is not None:
            closed = [_plain(u) for u in aggs["rec"].advance_to(st_now)]
            assert [_plain(u) for u in aggs["rows"].advance_to(st_now)] == closed
            # as columns (what the Spark task asks for) from the columnar path's state
            assert _plain_columns(aggs["table"].advance_columns(st_now)) == closed
        if not rows:
            continue
        want = []
        for k, t, v in rows:
            want += [_plain(u) for u in aggs["rec"].process(k, {"v": v}, t)]
        got = aggs["rows"].process_rows(
            [r[0] for r in rows], [r[1] for r in rows], [{"v": r[2]} for r in rows]
        )
        assert [_plain(u) for u in got] == want
        table = aggs["table"].process_batch(kv_table(rows), "key", "ts", ["v"])
        assert Counter(
            (r["key"], r["start"], r["end"], _value(r["value"]), None) for r in table.to_pylist()
        ) == Counter(want)
        snaps = {name: _session_state(stores[name], agg) for name, agg in aggs.items()}
        assert snaps["rows"] == snaps["rec"] == snaps["table"]


def _session_state(store, agg):
    index = agg.state.index.all() if agg.state.index is not None else None
    return (
        list(store.fetch_range(None, None)), index, agg.stream_time, agg.state.emitted_close,
        agg.dropped_records, store.observed_stream_time,
    )  # fmt: skip


def test_a_batch_closes_nothing_its_own_rows_pass():
    """The rows of a batch move the stream time (what the engine shares) but close
    nothing: a session their time passes closes at the next advance, still visible
    (the store's time stays at the last advance), and a row late by the partition's
    own time but not by the judged time is accepted."""
    store = InMemorySessionStore("s", 3, segment_interval_ms=7)
    agg = SessionWindowAggregator(
        store, SessionWindows(2, 0), aggregations={"n": "count"}, emit="final",
        closes_on="advance",
    )  # fmt: skip
    assert agg.process_rows(["a", "b"], [10, 100], [None, None]) == []
    assert agg.stream_time == 100 and store.observed_stream_time is None
    # late by the partition's time (100 - 2 > 11) but not by the judged one (none yet)
    assert agg.process_rows(["a"], [11], [None]) == []
    assert agg.dropped_records == 0
    assert [(u.key, u.start, u.end, u.value) for u in agg.advance_to(100)] == [
        ("a", 10, 11, {"n": 2})
    ]
    assert store.observed_stream_time == 100
    assert agg.process_rows(["a"], [50], [None]) == []  # late now: judged by 100
    assert agg.dropped_records == 1
    assert [(u.key, u.start, u.end) for u in agg.finish_input()] == [("b", 100, 100)]


def _windows(size, advance, grace, emit):
    dbs = []

    def make(name):
        db = StateDB.open(tempfile.mkdtemp())
        dbs.append(db)
        store = db.window_store(name, retention_ms=1, window_size_ms=size)
        return WindowAggregator(
            store, TimeWindows(size, advance, grace), aggregations=WINDOW_AGGS, emit=emit,
            closes_on="advance",
        )  # fmt: skip

    return make, dbs


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    stream=STREAM,
    size=st.integers(1, 12),
    advance_div=st.sampled_from([1, 2, 3]),
    grace=st.integers(0, 6),
    shift=st.integers(0, 2),
    emit=st.sampled_from(["final", "update", "on_time"]),
    path=st.sampled_from(["record", "rows", "table"]),
)
def test_window_batches_do_not_depend_on_the_partitioning(
    stream, size, advance_div, grace, shift, emit, path
):
    stream = _shifted(stream, shift)
    advance = max(1, size // advance_div)
    make, dbs = _windows(size, advance, grace, emit)
    try:
        one = _run_partitioned(make, stream, 1, "record")
        for parts in (2, 3):
            assert _run_partitioned(make, stream, parts, path) == one
    finally:
        for db in dbs:
            db.close()


@pytest.mark.parametrize("emit", ["final", "update"])
def test_a_window_fires_at_the_next_advance_not_with_the_rows(emit):
    make, dbs = _windows(10, 10, 0, emit)
    try:
        agg = make("w")
        out = agg.process_rows(["a", "a"], [1, 25], [{"v": 1}, {"v": 2}])
        if emit == "update":
            assert [(u.start, u.value, u.kind) for u in out] == [
                (0, {"n": 1, "total": 1}, "update"), (20, {"n": 1, "total": 2}, "update"),
            ]  # fmt: skip
            assert agg.advance_to(25) == []
        else:
            assert out == []  # the window [0, 10) is due by 25, but only an advance fires
            fired = agg.advance_to(25)
            assert [(u.start, u.value, u.kind) for u in fired] == [
                (0, {"n": 1, "total": 1}, "final")
            ]
        # judged by 25 now: the window [0, 10) is closed
        assert agg.process_rows(["a"], [3], [{"v": 5}]) == []
        assert agg.dropped_records == 1
    finally:
        for db in dbs:
            db.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_a_held_store_keeps_its_time_through_writes(tmp_path, kind):
    """hold_stream_time: put and put_many write what is visible at the held time and
    never move it (nor drop a row as late by a time the writes would have moved to);
    advance_stream_time still does, and the time survives a commit and reopen."""
    if kind == "memory":
        store = InMemorySessionStore("s", 10, segment_interval_ms=7)
    else:
        db = StateDB.open(str(tmp_path / "db"))
        store = db.session_store("s", retention_ms=10, segment_interval_ms=7)
    store.hold_stream_time()
    store.advance_stream_time(100)
    with store.batch():
        store.put("a", 500, 500, 1)  # would move the time to 500 and hide the next
        store.put_many([("b", 95, 95, 2), ("c", 91, 91, 3), ("d", 90, 90, 4)])
    assert store.observed_stream_time == 100
    got = sorted((w.key, w.end, v) for w, v in store.fetch_range(None, None))
    assert got == [("a", 500, 1), ("b", 95, 2), ("c", 91, 3)]  # 90 <= 100 - 10: late
    assert store.dropped_records == 1
    with store.batch():  # as an aggregator's advance_to: committed with its batch
        store.advance_stream_time(104)
    assert store.observed_stream_time == 104
    assert sorted(w.key for w, _ in store.fetch_range(None, None)) == ["a", "b"]
    if kind == "rocksdb":
        db.close()
        db = StateDB.open(str(tmp_path / "db"))
        assert db.session_store("s", retention_ms=10).observed_stream_time == 104
        db.close()
