"""The columnar emit-on-close path (process_table) equals the record path: same
closed sessions in the same order, same store, end index, times and drop counts."""

from __future__ import annotations

from itertools import accumulate

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore
from sessionstore.operators import SessionWindowAggregator, SessionWindows
from tests.operators.sessions.test_properties import snapshot
from tests.operators.store_factories import memory_store, rocksdb_stores

AGGS = {
    "n": "count",
    "total": ("sum", "v"),
    "lo": ("min", "v"),
    "hi": ("max", "v"),
    "first": ("first", "s"),
    "last": ("last", "s"),
}
KEYS = st.sampled_from([f"k{i}" for i in range(8)] + ["k", "k\x00", None])
LABELS = st.sampled_from(["x", "y", None])


def table_of(rows: list[tuple], two_keys: bool | str) -> pa.Table:
    data = {"user": pa.array([r[0] for r in rows], pa.string())}
    if two_keys == "bool":  # a key type Arrow and the key codec order alike only by chance
        data["zone"] = pa.array([None if r[4] is None else r[4] == 2 for r in rows], pa.bool_())
    elif two_keys:
        data["zone"] = pa.array([r[4] for r in rows], pa.int32())
    data["ts"] = pa.array([r[1] for r in rows], pa.int64())
    data["v"] = pa.array([r[2] for r in rows], pa.int64())
    data["s"] = pa.array([r[3] for r in rows], pa.string())
    return pa.table(data)


def row_dicts(table: pa.Table, two_keys: bool) -> list[tuple]:
    out = []
    for r in table.to_pylist():
        key = (r["user"], r["zone"]) if two_keys else r["user"]
        out.append((key, r["start"], r["end"], r["value"], r["timestamp"]))
    return out


def run_both(make_store, batches, gap, grace, retention, two_keys=False):
    rec_store, col_store = make_store("rec", retention), make_store("col", retention)
    windows = SessionWindows(gap, grace)
    rec = SessionWindowAggregator(rec_store, windows, aggregations=AGGS, emit="final")
    col = SessionWindowAggregator(col_store, windows, aggregations=AGGS, emit="final")
    key = ["user", "zone"] if two_keys else "user"
    emitted = 0
    for rows in batches:
        if not rows:
            continue  # an empty batch is the caller's (nothing to do)
        expected = []
        for user, ts, v, s, zone in rows:
            k = None if user is None or (two_keys and zone is None) else user
            if two_keys and k is not None:
                k = (user, zone == 2 if two_keys == "bool" else zone)
            expected.extend(rec.process(k, {"v": v, "s": s}, ts))
        got = col.process_table(table_of(rows, two_keys), key, "ts", ["v", "s"])
        assert got is not None, "the batch should take the columnar path"
        want = [(u.key, u.start, u.end, u.value, u.timestamp) for u in expected]
        assert row_dicts(got, two_keys) == want
        assert snapshot(col_store, col) == snapshot(rec_store, rec)
        emitted += len(want)
    return emitted


def _in_order(rows):
    times = list(accumulate(r[1] for r in rows))
    return [(r[0], t, *r[2:]) for r, t in zip(rows, times, strict=True)]


ROW = st.tuples(
    KEYS,
    st.one_of(st.integers(0, 6), st.none()),
    st.integers(-5, 9),
    LABELS,
    st.sampled_from([1, 2, None]),
)
# steps of time in order (mostly), then a few rows moved out of order
IN_ORDER = st.lists(
    st.tuples(KEYS, st.integers(0, 5), st.integers(-5, 9), LABELS, st.sampled_from([1, 2])),
    max_size=40,
).map(_in_order)
ANY_ORDER = st.lists(
    st.tuples(KEYS, st.integers(0, 120), st.integers(-5, 9), LABELS, st.sampled_from([1, 2, None])),
    max_size=30,
)
BATCHES = st.lists(st.one_of(IN_ORDER, ANY_ORDER), min_size=1, max_size=5)


def _shifted(batches, shift):
    """Later batches start later, as a stream does; None times stay None."""
    return [
        [(k, None if t is None else t + 40 * n * shift, *rest) for k, t, *rest in b]
        for n, b in enumerate(batches)
    ]


@settings(max_examples=200, deadline=None)
@given(
    batches=BATCHES,
    gap=st.integers(0, 12),
    grace=st.integers(0, 8),
    shift=st.integers(0, 3),
    extra_retention=st.sampled_from([0, 30]),
    two_keys=st.sampled_from([False, True, "bool"]),
)
def test_columnar_final_equals_records(batches, gap, grace, shift, extra_retention, two_keys):
    run_both(
        memory_store, _shifted(batches, shift), gap, grace, gap + grace + 1 + extra_retention,
        two_keys,
    )  # fmt: skip


@pytest.mark.parametrize("two_keys", [False, "bool"])
def test_columnar_final_covers_stored_sessions_ties_and_late_rows(two_keys):
    """One scripted stream through every branch (gap 10, grace 8): an open stored
    session that two runs of a batch join into one session, a row exactly gap after
    a stored session, keys that replay record by record (a row near a closed
    session, a late row, ties on last), None keys and times, and sessions closing by
    time alone. The order of rows matters: a row decides what is late for the next."""
    batches = [
        [
            ("a", 20, 1, "x", 1),
            ("b", 10, 5, "y", 1),
            ("a", 30, 2, "y", 1),
            ("c", 11, 3, "x", 1),
            ("h", 25, 1, "h", 1),
        ],
        [
            ("a", 25, 7, "z", 1),  # inside a's stored [20, 30]
            ("a", 38, 4, "q", 1),  # 13 after 25: another run, both join a's session
            ("h", 35, 2, "i", 1),  # exactly gap after h's stored session: joins it
            ("b", 22, 6, "w", 1),  # extends b's stored session
            ("b", 22, 9, "tie", 1),  # same time: last arrival is last
            (None, 25, 0, "n", 1),
            ("c", None, 0, "n", 1),
            ("d", 40, 8, "d", 1),
        ],
        [("b", 21, 9, "late", 1), ("e", 90, 1, "e", 1), ("f", 95, 2, "f", 1), ("a", 48, 3, "a", 1)],
        [("g", 200, 3, "g", 1)],
    ]
    emitted = run_both(memory_store, batches, 10, 8, 19, two_keys)
    assert emitted >= 6


@settings(max_examples=30, deadline=None)
@given(batches=BATCHES, gap=st.integers(0, 12), grace=st.integers(0, 8), shift=st.integers(0, 3))
def test_columnar_final_equals_records_in_rocksdb(batches, gap, grace, shift):
    with rocksdb_stores() as make:
        run_both(make, _shifted(batches, shift), gap, grace, gap + grace + 1)


def _aggregator(aggs=AGGS, emit="final"):
    store = InMemorySessionStore("s", 100)
    return store, SessionWindowAggregator(store, SessionWindows(5), aggregations=aggs, emit=emit)


@pytest.mark.parametrize(
    "why, aggs, emit",
    [
        ("update mode", AGGS, "update"),
        ("collect", {"all": ("collect", "v")}, "final"),
        ("float sum", {"t": ("sum", "f")}, "final"),
        ("null in a sum", {"t": ("sum", "w")}, "final"),
        ("a sum that could overflow int64", {"t": ("sum", "big")}, "final"),
    ],
)
def test_batches_that_do_not_qualify_change_nothing(why, aggs, emit):
    store, agg = _aggregator(aggs, emit)
    table = pa.table({
        "user": ["a", "b"], "ts": [1, 2], "v": [1, 2], "s": ["x", "y"], "f": [0.5, 1.5],
        "w": [1, None], "big": [2**61, 2**61],
    })  # fmt: skip
    assert agg.process_table(table, "user", "ts", ["v", "s", "f", "w", "big"]) is None, why
    assert list(store.fetch_range(None, None)) == []
    assert agg.stream_time is None


def test_process_batch_uses_the_columnar_path_and_keeps_value_types():
    _, agg = _aggregator()
    table = pa.table({
        "user": ["a", "a", "b"], "ts": [1, 3, 2], "v": pa.array([4, 6, 1], pa.int16()),
        "s": ["x", "y", "z"],
    })  # fmt: skip
    agg.process_batch(table, "user", "ts", ["v", "s"])
    out = agg.process_batch(pa.table({**table.to_pydict(), "ts": [50, 51, 52]}), "user", "ts",
                            ["v", "s"])  # fmt: skip
    assert out.column("value").type.field("first").type == pa.string()
    assert out.to_pylist() == [  # by end, then start, then key
        {"user": "b", "start": 2, "end": 2, "timestamp": 2,
         "value": {"n": 1, "total": 1, "lo": 1, "hi": 1, "first": "z", "last": "z"}},
        {"user": "a", "start": 1, "end": 3, "timestamp": 3,
         "value": {"n": 2, "total": 10, "lo": 4, "hi": 6, "first": "x", "last": "y"}},
    ]  # fmt: skip


def test_bad_keys_raise_as_the_record_path_does():
    _, agg = _aggregator({"n": "count"})
    with pytest.raises(TypeError, match="float"):
        agg.process_batch(pa.table({"user": [1.5], "ts": [1]}), "user", "ts", None)


def test_large_int_sums_stay_exact_on_the_vectorised_record_path():
    """Sums whose int64 total would overflow fall back to Python ints (update mode)."""
    store = InMemorySessionStore("s", 10**6)
    agg = SessionWindowAggregator(
        store, SessionWindows(10), aggregations={"t": ("sum", None)}, emit="update"
    )
    n = 3_000  # 3,000 * 2**52 > 2**63
    out = agg.process_rows(["a"] * n, list(range(n)), [2**52] * n)
    assert out[-1].value == {"t": n * 2**52}


def test_timestamp_columns_are_epoch_milliseconds_floored():
    """An Arrow timestamp column (any unit) gives the sessions an epoch-ms column
    gives, sub-millisecond parts floored, as on the record path."""
    micros = [-1_001, 1_500, 2_999, 80_000_700]  # -1.001 ms floors to -2 ms
    users = ["b", "a", "a", "a"]
    as_ms = pa.table({"user": users, "ts": [-2, 1, 2, 80_000]})
    as_us = pa.table({"user": users, "ts": pa.array(micros, pa.timestamp("us"))})
    outs = []
    for table in (as_ms, as_us):
        _, agg = _aggregator({"n": "count"})
        first = agg.process_table(table, "user", "ts", None).to_pylist()
        scale = 1000 if pa.types.is_timestamp(table.column("ts").type) else 1
        later = pa.table({"user": ["z"], "ts": pa.array([10**6 * scale], table.column("ts").type)})
        outs.append(first + agg.process_table(later, "user", "ts", None).to_pylist())
    assert outs[0] == outs[1]
    assert [(r["user"], r["start"], r["end"]) for r in outs[0]] == [
        ("b", -2, -2), ("a", 1, 2), ("a", 80_000, 80_000),
    ]  # fmt: skip


def test_keys_equal_in_python_but_not_in_bytes_stay_apart():
    """True == 1 in Python, but they are different keys to the store: a row of key 1
    must not join key True's open session."""
    rec_store, col_store = memory_store("rec", 1000), memory_store("col", 1000)
    rec, col = (
        SessionWindowAggregator(s, SessionWindows(5), aggregations={"n": "count"}, emit="final")
        for s in (rec_store, col_store)
    )
    for table in (pa.table({"k": [True], "ts": [1]}), pa.table({"k": [1], "ts": [3]})):
        for row in table.to_pylist():
            rec.process(row["k"], None, row["ts"])
        assert col.process_table(table, "k", "ts", None).num_rows == 0
    assert snapshot(col_store, col) == snapshot(rec_store, rec)
    assert [(type(w.key), w.start, w.end) for w, _ in col_store.fetch_range(None, None)] == [
        (int, 3, 3), (bool, 1, 1),
    ]  # fmt: skip
