"""Firing only the windows that became due since the last firing (what the window
aggregator does) equals scanning every pending window at each record (the plain
reading of the rules): same emissions in the same order, same store, pending
windows and stream time; also after a failed batch rolled back."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import StateDB
from sessionstore.operators.windows.aggregator import TimeWindows, WindowAggregator

RECORDS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", None]), st.one_of(st.integers(0, 60), st.none())),
    max_size=30,
)


def state(agg):
    windows = list(agg.store.fetch_all())
    return (
        windows,
        agg.state.pending.all(),
        agg.stream_time,
        agg.dropped_records,
        agg.state.early_tick,
    )


def aggregator_pair(db, size, advance_div, grace, aggregations, emit="final", early=None):
    """Two aggregators of the same windows on their own stores: the reference and
    the one under test."""
    windows = TimeWindows(size, max(1, size // advance_div), grace)
    return tuple(
        WindowAggregator(
            db.window_store(name, retention_ms=1, window_size_ms=size), windows,
            aggregations=aggregations, emit=emit, early_every_ms=early,
        )
        for name in ("reference", "tested")
    )  # fmt: skip


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(
    batches=st.lists(RECORDS, min_size=1, max_size=4),
    size=st.integers(1, 12),
    advance_div=st.sampled_from([1, 2, 3]),
    grace=st.integers(0, 6),
    emit=st.sampled_from(["final", "on_time"]),
    early=st.sampled_from([None, 5]),
    shift=st.integers(0, 2),
)
def test_batch_equals_records(batches, size, advance_div, grace, emit, early, shift):
    with tempfile.TemporaryDirectory() as tmp, StateDB.open(tmp) as db:
        rec, bat = aggregator_pair(
            db, size, advance_div, grace, {"n": "count", "keys": ("collect", None)}, emit, early
        )
        for n, records in enumerate(batches):
            records = [(k, None if t is None else t + 30 * n * shift) for k, t in records]
            expected = []
            for key, ts in records:
                rec.state.fired_due = None  # the reference scans every pending window
                expected.extend(rec.process(key, key, ts))
            got = bat.process_rows([k for k, _ in records], [t for _, t in records],
                                   [k for k, _ in records])  # fmt: skip
            assert got == expected
            assert state(bat) == state(rec)


def test_a_failed_batch_does_not_lose_due_windows(tmp_path):
    """A batch that fails after firing windows rolls back; the windows it fired are
    pending again and fire with the next batch, as if the failure never happened."""
    outputs = []
    for fail in (False, True):
        with StateDB.open(tmp_path / f"db-{fail}") as db:
            agg = WindowAggregator(
                db.window_store("w", retention_ms=1, window_size_ms=10),
                TimeWindows(10), aggregations={"n": "count"}, emit="final",
            )  # fmt: skip
            agg.process_rows(["a", "b"], [1, 2], [None, None])
            if fail:
                with pytest.raises(TypeError):
                    agg.process_rows(["a", "a"], [25, 1.5], [None, None])  # fires, then fails
                assert agg.stream_time == 2  # what the store holds
            outputs.append(agg.process_rows(["c", "a"], [30, 31], [None, None]))
    assert outputs[0] == outputs[1]
    assert [(u.key, u.start, u.end, u.value) for u in outputs[0]] == [
        ("a", 0, 10, {"n": 1}), ("b", 0, 10, {"n": 1}),
    ]  # fmt: skip


ROWS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", None]),
        st.one_of(st.integers(0, 60), st.none()),
        st.integers(-5, 9),
        st.sampled_from(["x", "y", None]),
    ),
    max_size=30,
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(ROWS, min_size=1, max_size=4),
    size=st.integers(1, 12),
    advance_div=st.sampled_from([1, 2, 3]),
    grace=st.integers(0, 6),
    shift=st.integers(0, 2),
)
def test_columnar_final_equals_records(batches, size, advance_div, grace, shift):
    import pyarrow as pa

    aggs_spec = {"n": "count", "total": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v"),
                 "first": ("first", "s"), "last": ("last", "s")}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, StateDB.open(tmp) as db:
        rec, col = aggregator_pair(db, size, advance_div, grace, aggs_spec)
        for n, rows in enumerate(batches):
            if not rows:
                continue
            rows = [(k, None if t is None else t + 30 * n * shift, v, s) for k, t, v, s in rows]
            expected = []
            for key, ts, v, s in rows:
                expected.extend(rec.process(key, {"v": v, "s": s}, ts))
            table = pa.table({
                "key": pa.array([r[0] for r in rows], pa.string()),
                "ts": pa.array([r[1] for r in rows], pa.int64()),
                "v": pa.array([r[2] for r in rows], pa.int64()),
                "s": pa.array([r[3] for r in rows], pa.string()),
            })  # fmt: skip
            got = col.process_table(table, "key", "ts", ["v", "s"])
            assert got is not None
            want = [(u.key, u.start, u.end, u.value, u.timestamp, u.kind) for u in expected]
            assert [
                (r["key"], r["start"], r["end"], r["value"], r["timestamp"], r["kind"])
                for r in got.to_pylist()
            ] == want
            assert state(col) == state(rec)


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(
    batches=st.lists(ROWS, min_size=1, max_size=4),
    size=st.integers(1, 12),
    advance_div=st.sampled_from([1, 2, 3]),
    grace=st.integers(0, 6),
    shift=st.integers(0, 2),
)
def test_net_updates_are_the_change_of_the_record_paths_table(
    batches, size, advance_div, grace, shift
):
    """``process_rows(net=True)`` in update mode: per batch, one update per window
    whose value changed, with the value the record path's updates leave in a table."""
    aggs_spec = {"n": "count", "hi": ("max", "v")}  # max often stays the same
    missing = object()
    with tempfile.TemporaryDirectory() as tmp, StateDB.open(tmp) as db:
        rec, net = aggregator_pair(db, size, advance_div, grace, aggs_spec, "update")
        table: dict = {}
        for n, rows in enumerate(batches):
            rows = [(k, None if t is None else t + 30 * n * shift, v) for k, t, v, _ in rows]
            after = dict(table)
            for key, ts, v in rows:
                for u in rec.process(key, {"v": v}, ts):
                    after[(u.key, u.start, u.end)] = u.value
            got = net.process_rows(
                [r[0] for r in rows], [r[1] for r in rows], [{"v": r[2]} for r in rows], net=True
            )
            idents = [(u.key, u.start, u.end) for u in got]
            assert len(set(idents)) == len(idents)
            assert {i: u.value for i, u in zip(idents, got, strict=True)} == {
                i: v for i, v in after.items() if table.get(i, missing) != v
            }
            assert {u.kind for u in got} <= {"update"}
            assert list(net.store.fetch_all()) == list(rec.store.fetch_all())
            assert (net.stream_time, net.dropped_records) == (rec.stream_time, rec.dropped_records)
            table = after
