"""Session-window aggregation: exact vectors for each rule, through both paths."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sessionstore import InMemorySessionStore, SessionWindow, StateDB
from sessionstore.operators import (
    Aggregation,
    SessionUpdate,
    SessionWindowAggregator,
    SessionWindows,
)
from tests.operators.sessions.records import process_tuples

U = SessionUpdate


def make(gap, grace=0, emit="update", retention=None, aggs=None):
    store = InMemorySessionStore("s", retention or gap + grace + 1)
    return SessionWindowAggregator(
        store, SessionWindows(gap, grace), aggregations=aggs or {"n": "count"}, emit=emit
    )


@pytest.fixture(params=["records", "batch"])
def feed(request):
    """Feed records one call each, or all at once through the batch path."""

    def run(agg, records):
        if request.param == "records":
            out = []
            for key, ts in records:
                out.extend(agg.process(key, None, ts))
            return out
        return process_tuples(agg, [(k, None, t) for k, t in records])

    return run


def sessions(agg):
    return [(w.key, w.start, w.end, acc) for w, acc in agg.store.fetch_range(None, None)]


def test_merging_two_sessions(feed):
    agg = make(gap=10, retention=1000)
    out = feed(agg, [("a", 0), ("a", 20), ("a", 10)])
    assert out == [
        U("a", 0, 0, {"n": 1}, 0),
        U("a", 20, 20, {"n": 1}, 20),
        U("a", 0, 0, None, 0),
        U("a", 20, 20, None, 20),
        U("a", 0, 20, {"n": 3}, 20),
    ]
    assert sessions(agg) == [("a", 0, 20, [3])]


def test_chain_merges_of_three_sessions(feed):
    agg = make(gap=5, grace=100, retention=1000)  # grace: a@5 is late but accepted
    feed(agg, [("a", 0), ("a", 10), ("a", 20)])
    assert [s[1:3] for s in sessions(agg)] == [(0, 0), (10, 10), (20, 20)]
    out = feed(agg, [("a", 5), ("a", 15)])
    assert out == [
        U("a", 0, 0, None, 0),
        U("a", 10, 10, None, 10),
        U("a", 0, 10, {"n": 3}, 10),
        U("a", 0, 10, None, 10),
        U("a", 20, 20, None, 20),
        U("a", 0, 20, {"n": 5}, 20),
    ]
    assert sessions(agg) == [("a", 0, 20, [5])]


def test_same_timestamp_and_record_inside_a_session(feed):
    """As Kafka: no tombstone for the window that the update replaces (a second
    record at the same time, a record inside the session), only for a window that
    changes."""
    agg = make(gap=10, retention=1000)
    out = feed(agg, [("a", 5), ("a", 5), ("a", 0), ("a", 3)])
    assert out == [
        U("a", 5, 5, {"n": 1}, 5),
        U("a", 5, 5, {"n": 2}, 5),
        U("a", 5, 5, None, 5),
        U("a", 0, 5, {"n": 3}, 5),
        U("a", 0, 5, {"n": 4}, 5),
    ]
    assert sessions(agg) == [("a", 0, 5, [4])]


def test_two_records_at_the_same_time_emit_no_tombstone_between_them():
    """The issue's example, record by record: gap 5 minutes, a custom collect."""
    store = InMemorySessionStore("s", 10**9)
    agg = SessionWindowAggregator(
        store, SessionWindows(5 * 60_000), initializer=list,
        aggregator=lambda k, v, acc: acc + [v], merger=lambda k, a, b: a + b,
    )  # fmt: skip
    assert agg.process("k", "first", 0) == [U("k", 0, 0, ["first"], 0)]
    assert agg.process("k", "second", 0) == [U("k", 0, 0, ["first", "second"], 0)]
    # a record inside [start, end] keeps the window too
    agg.process("k", "third", 60_000)
    assert agg.process("k", "inside", 30_000) == [
        U("k", 0, 60_000, ["first", "second", "third", "inside"], 60_000)
    ]


def test_net_updates_one_row_per_session_per_batch():
    """``net=True``: per batch, each session's last value, a tombstone only for a
    session an earlier batch emitted, nothing for a session born and merged away in
    the batch or for a value that did not change."""
    agg = make(gap=10, grace=20, retention=1000, aggs={"n": "count", "hi": ("max", None)})

    def batch(*records):
        return agg.process_rows(
            [k for k, _, _ in records], [t for _, _, t in records],
            [v for _, v, _ in records], net=True,
        )  # fmt: skip

    # a[0, 0] and a[20, 20] are born and merged away in the batch: one row
    assert batch(("a", 5, 0), ("a", 1, 20), ("a", 1, 10), ("b", 1, 3)) == [
        U("a", 0, 20, {"n": 3, "hi": 5}, 20),
        U("b", 3, 3, {"n": 1, "hi": 1}, 3),
    ]
    # inside a's session: an update of the same window, no tombstone
    assert batch(("a", 7, 15), ("a", 2, 16)) == [U("a", 0, 20, {"n": 5, "hi": 7}, 20)]
    # a grows: its old window is deleted
    assert batch(("a", 1, 30), ("a", 1, 25)) == [
        U("a", 0, 20, None, 20),
        U("a", 0, 30, {"n": 7, "hi": 7}, 30),
    ]
    # b and a close (close time 60 - 10 - 20 = 30): closing is no change
    assert batch(("c", 1, 60)) == [U("c", 60, 60, {"n": 1, "hi": 1}, 60)]
    assert sessions(agg)[-1] == ("c", 60, 60, [1, 1])


def test_net_updates_skip_unchanged_values():
    agg = make(gap=10, retention=1000, aggs={"hi": ("max", None)})
    assert agg.process_rows(["a", "a"], [0, 4], [5, 1], net=True) == [U("a", 0, 4, {"hi": 5}, 4)]
    assert agg.process_rows(["a"], [2], [3], net=True) == []  # same window, same max
    assert process_tuples(agg, [("a", 9, 3)]) == [U("a", 0, 4, {"hi": 9}, 4)]


def test_gap_is_inclusive(feed):
    agg = make(gap=10, retention=1000)
    feed(agg, [("a", 0), ("a", 10), ("a", 21)])
    assert [s[1:] for s in sessions(agg)] == [(0, 10, [2]), (21, 21, [1])]


def test_grace_zero_drops_late_records(feed):
    agg = make(gap=10, grace=0)
    out = feed(agg, [("a", 100), ("b", 85), ("a", 92)])
    # close time 90: b@85 alone ends before it; a@92 merges with a[100, 100]
    assert out == [
        U("a", 100, 100, {"n": 1}, 100),
        U("a", 100, 100, None, 100),
        U("a", 92, 100, {"n": 2}, 100),
    ]
    assert agg.dropped_records == 1


def test_grace_accepts_late_records_until_it_runs_out(feed):
    agg = make(gap=10, grace=20)
    out = feed(agg, [("a", 100), ("a", 75), ("b", 69), ("a", 69)])
    assert out == [
        U("a", 100, 100, {"n": 1}, 100),
        U("a", 75, 75, {"n": 1}, 75),
        # a@69 is before close time 70 but merges into a[75, 75], which is not
        U("a", 75, 75, None, 75),
        U("a", 69, 75, {"n": 2}, 75),
    ]
    assert agg.dropped_records == 1  # b@69 alone ends before 100 - 10 - 20


def test_none_key_and_none_timestamp_are_dropped(feed):
    agg = make(gap=10)
    assert feed(agg, [(None, 5), ("a", None)]) == []
    assert agg.dropped_records == 2
    assert agg.stream_time is None


def test_final_mode_emits_once_at_close_in_end_start_key_order(feed):
    agg = make(gap=10, emit="final", retention=1000)
    assert feed(agg, [("z", 1), ("x", 3), ("y", 5), ("z", 5), ("w", 5)]) == []
    # x@3 and z[1,5] and y@5 and w@5 close when stream time passes 5 + 10
    out = feed(agg, [("q", 15), ("q", 16)])
    assert out == [
        U("x", 3, 3, {"n": 1}, 3),
        U("z", 1, 5, {"n": 2}, 5),
        U("w", 5, 5, {"n": 1}, 5),
        U("y", 5, 5, {"n": 1}, 5),
    ]
    assert feed(agg, [("q", 40)]) == [U("q", 15, 16, {"n": 2}, 16)]


def test_final_mode_never_merges_into_a_closed_session(feed):
    update = make(gap=10, grace=5, retention=1000)
    final = make(gap=10, grace=5, emit="final", retention=1000)
    records = [("a", 0), ("b", 16), ("a", 9)]  # b@16 closes a[0, 0] (close time 1)
    feed(update, records)
    out = feed(final, records)
    assert out == [U("a", 0, 0, {"n": 1}, 0)]
    assert [s[:3] for s in sessions(update)] == [("a", 0, 9), ("b", 16, 16)]
    assert [s[:3] for s in sessions(final)] == [("a", 0, 0), ("a", 9, 9), ("b", 16, 16)]
    assert feed(final, [("c", 100)]) == [U("a", 9, 9, {"n": 1}, 9), U("b", 16, 16, {"n": 1}, 16)]


def test_update_mode_merges_closed_but_retained_sessions(feed):
    # Kafka's rule: with a long retention a closed session can still be extended by a
    # record that is not late itself.
    agg = make(gap=10, retention=1000)
    out = feed(agg, [("a", 0), ("b", 20), ("a", 10)])
    assert out[-1] == U("a", 0, 10, {"n": 2}, 10)
    short = make(gap=10)  # retention gap + 1: a[0, 0] is gone once stream time is 20
    out = feed(short, [("a", 0), ("b", 20), ("a", 10)])
    assert out[-1] == U("a", 10, 10, {"n": 1}, 10)


def test_retention_is_raised_to_cover_open_sessions():
    store = InMemorySessionStore("s", 5)
    SessionWindowAggregator(store, SessionWindows(10, 2), aggregations={"n": "count"})
    assert store.retention_ms == 13


def test_builtin_aggregations_over_columns(feed):
    agg = make(
        gap=10,
        retention=1000,
        aggs={
            "n": "count",
            "spent": ("sum", "amount"),
            "cheapest": ("min", "amount"),
            "dearest": ("max", "amount"),
            "entry": ("first", "page"),
            "exit": ("last", "page"),
            "pages": ("collect", "page"),
        },
    )
    rows = [("u", {"amount": 5, "page": "/b"}, 3), ("u", {"amount": 2, "page": "/a"}, 1)]
    rows.append(("u", {"amount": 9, "page": "/c"}, 8))
    for key, value, ts in rows:
        out = agg.process(key, value, ts)
    assert out[-1].value == {
        "n": 3,
        "spent": 16,
        "cheapest": 2,
        "dearest": 9,
        "entry": "/a",
        "exit": "/c",
        "pages": ["/b", "/a", "/c"],
    }


def test_custom_aggregation():
    store = InMemorySessionStore("s", 1000)
    agg = SessionWindowAggregator(
        store,
        SessionWindows(10),
        initializer=lambda: "",
        aggregator=lambda key, value, acc: acc + value,
        merger=lambda key, a, b: a + b,
    )
    agg.process("k", "x", 0)
    agg.process("k", "z", 20)
    assert agg.process("k", "y", 10)[-1] == U("k", 0, 20, "xzy", 20)
    with pytest.raises(ValueError, match="initializer, aggregator and merger"):
        SessionWindowAggregator(store, SessionWindows(10), initializer=list)
    assert isinstance(agg.aggregation, Aggregation)


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"emit": "sometimes"}, "emit must be 'update' or 'final'"),
        ({"aggregations": {"n": "median"}}, "expected 'count' or"),
        ({"aggregations": {}}, "non-empty dict"),
    ],
)
def test_bad_configuration(kwargs, error):
    with pytest.raises(ValueError, match=error):
        SessionWindowAggregator(InMemorySessionStore("s", 10), SessionWindows(5), **kwargs)


def test_bad_windows_and_timestamps():
    with pytest.raises(ValueError, match="gap_ms must be a non-negative int"):
        SessionWindows(-1)
    agg = make(gap=10)
    agg.process("a", None, 5)
    with pytest.raises(TypeError, match="timestamp must be an int"):
        agg.process("a", None, 5.5)
    with pytest.raises(ValueError, match="does not fit"):
        process_tuples(agg, [("a", None, 2**63)])
    assert sessions(agg) == [("a", 5, 5, [1])]  # nothing committed was lost


def test_final_mode_state_survives_reopen_without_duplicates(tmp_path):
    def open_agg(db):
        store = db.session_store("s", 1000)
        return SessionWindowAggregator(
            store, SessionWindows(10), aggregations={"n": "count"}, emit="final"
        )

    with StateDB.open(tmp_path) as db:
        agg = open_agg(db)
        process_tuples(agg, [("a", None, 0), ("b", None, 5), ("c", None, 30)])
    with StateDB.open(tmp_path) as db:
        agg = open_agg(db)
        assert agg.stream_time == 30
        assert agg.process("d", None, 31) == []  # a and b were emitted before the reopen
        assert agg.process("d", None, 41) == [U("c", 30, 30, {"n": 1}, 30)]


def test_process_batch_with_arrow(tmp_path):
    agg = make(gap=10_000, retention=10**6, aggs={"n": "count", "spent": ("sum", "amount")})
    table = pa.table(
        {
            "user": ["a", "a", "b", None],
            "ts": pa.array([0, 5000, 3000, 1], pa.timestamp("ms")),
            "amount": [1, 2, 3, 4],
        }
    )
    out = agg.process_batch(table, key="user", timestamp="ts", value=["amount"])
    assert out.column_names == ["user", "start", "end", "value", "timestamp"]
    assert out.to_pylist()[-1] == {
        "user": "b",
        "start": 3000,
        "end": 3000,
        "value": {"n": 1, "spent": 3},
        "timestamp": 3000,
    }
    assert agg.dropped_records == 1
    with pytest.raises(KeyError, match="column 'nope' not in batch"):
        agg.process_batch(table, key="nope", timestamp="ts")


@pytest.mark.parametrize("batch", [False, True])
def test_replayed_records_are_not_collected_or_counted_twice(batch):
    store = InMemorySessionStore("s", 1000)
    agg = SessionWindowAggregator(
        store,
        SessionWindows(10),
        aggregations={"n": "count", "pages": ("collect", None)},
        track_offsets=True,
    )
    records = [("u", "/a", 1, 100), ("u", "/b", 5, 101), ("u", "/a", 1, 100), ("u", "/c", 8, 102)]
    if batch:
        process_tuples(agg, records)
    else:
        for key, value, ts, offset in records:
            agg.process(key, value, ts, offset)
    assert agg.replayed_records == 1
    # stored as [accumulator, offsets]: count 3, pages collected once each
    assert [(w.start, w.end, v) for w, v in store.fetch("u")] == [
        (1, 8, [[3, ["/a", "/b", "/c"]], [100, 101, 102]])
    ]
    with pytest.raises(ValueError, match="needs an int offset"):
        agg.process("u", "/d", 9)


FAST = {"n": "count", "sum": ("sum", None), "lo": ("min", None), "hi": ("max", None)}
FAST.update({"first": ("first", None), "last": ("last", None)})


@pytest.fixture
def fast_calls(monkeypatch):
    """Counts how many keys took each vectorised path."""
    from sessionstore.operators.sessions import replay as module

    calls = {"final": 0, "update": 0}
    real_final, real_update = module.run_fast_final, module.run_fast_keys

    def final(fast_keys, *args):
        calls["final"] += len(fast_keys)
        return real_final(fast_keys, *args)

    def update(fast_keys, *args):
        calls["update"] += len(fast_keys)
        return real_update(fast_keys, *args)

    monkeypatch.setattr(module, "run_fast_final", final)
    monkeypatch.setattr(module, "run_fast_keys", update)
    return calls


@pytest.mark.parametrize(
    "emit,batches",
    [
        # records exactly gap apart share a session; duplicates tie on first/last
        ("final", [[("a", 1, 0), ("a", 2, 5), ("a", 3, 5), ("b", 4, 5)], [("c", 0, 100)]]),
        ("update", [[("a", 1, 0), ("a", 2, 5), ("a", 3, 5), ("a", 4, 11)], [("c", 0, 100)]]),
        # out of order within a key, and a record exactly at a stored session's bounds
        (
            "final",
            [
                [("a", 1, 10), ("a", 2, 20)],
                [("a", 3, 15), ("a", 4, 10), ("a", 5, 25)],
                [("z", 0, 200)],
            ],
        ),
        # a record bridges two stored sessions; stored first/last tie with records
        (
            "final",
            [
                [("a", 1, 0), ("a", 2, 12)],
                [("a", 3, 6), ("a", 4, 0), ("a", 5, 12)],
                [("z", 0, 300)],
            ],
        ),
        ("update", [[("a", 1, 0), ("a", 2, 3)], [("a", 3, 3), ("a", 4, 8)], [("z", 0, 300)]]),
    ],
)
def test_vectorised_paths_match_the_record_path(fast_calls, emit, batches):
    def run(use_batches):
        store = InMemorySessionStore("s", 10_000)
        agg = SessionWindowAggregator(
            store, SessionWindows(6, grace_ms=50), aggregations=FAST, emit=emit
        )
        out = []
        for batch in batches:
            if use_batches:
                out += process_tuples(agg, batch)
            else:
                for key, value, ts in batch:
                    out += agg.process(key, value, ts)
        return out, list(store.fetch_range(None, None))

    expected = run(False)
    assert run(True) == expected
    assert fast_calls["final" if emit == "final" else "update"] > 0


def test_vectorised_final_never_merges_a_closed_stored_session(fast_calls):
    # a[0, 0] closes at stream time 16 (close time 16 - 6 - 5 = 5); a@9 is within gap
    # of it but must start a new session, in the batch path as in the record path
    def run(use_batches):
        store = InMemorySessionStore("s", 10_000)
        agg = SessionWindowAggregator(
            store, SessionWindows(10, grace_ms=5), aggregations=FAST, emit="final"
        )
        first = [("a", 1, 0), ("b", 1, 16)]
        second = [("a", 2, 9), ("b", 2, 17)]
        # a@19 continues a[9, 9], which lies within gap of the closed a[0, 0]
        third = [("a", 3, 19), ("b", 3, 20)]
        out = []
        for batch in (first, second, third):
            if use_batches:
                out += process_tuples(agg, batch)
            else:
                for key, value, ts in batch:
                    out += agg.process(key, value, ts)
        return out, list(store.fetch_range(None, None))

    assert run(True) == run(False)
    assert [w for w, _ in run(False)[1]][:2] == [
        SessionWindow("a", 0, 0),
        SessionWindow("a", 9, 19),
    ]
    assert fast_calls["final"] > 0


@pytest.mark.parametrize("batch", [False, True])
def test_advance_to_closes_sessions_without_records(batch):
    agg = make(gap=10, grace=5, emit="final", retention=1000)
    process_tuples(agg, [("a", None, 0), ("b", None, 3)])
    assert agg.advance_to(10) == []  # close time 10 - 15 < 0
    assert agg.advance_to(19) == [U("a", 0, 0, {"n": 1}, 0), U("b", 3, 3, {"n": 1}, 3)]
    assert agg.advance_to(5) == []  # never back
    assert agg.stream_time == 19
    assert agg.store.observed_stream_time == 19
    # the batch path stays exact after an advance
    records = [("c", None, 17), ("c", None, 30), ("a", None, 2)]
    if batch:
        out = process_tuples(agg, records)
    else:
        out = [u for k, v, t in records for u in agg.process(k, v, t)]
    assert out == []
    assert agg.dropped_records == 1  # a@2 is late


def test_a_failed_record_does_not_lose_sessions_it_closed(tmp_path):
    """A record that closes sessions and then fails rolls back; the sessions it
    closed are emitted by the next record, as if the failure never happened."""

    def add(key, value, acc):
        if value == "boom":
            raise ZeroDivisionError("aggregator failed")
        return acc + 1

    outputs = []
    for fail in (False, True):
        with StateDB.open(tmp_path / f"db-{fail}") as db:
            agg = SessionWindowAggregator(
                db.session_store("s", 1000), SessionWindows(5),
                lambda: 0, add, lambda k, a, b: a + b, emit="final",
            )  # fmt: skip
            agg.process("a", 1, 1)
            if fail:
                with pytest.raises(ZeroDivisionError):
                    agg.process("b", "boom", 20)  # closes a's session, then fails
                assert agg.stream_time == 1  # what the store holds
            outputs.append(agg.process("c", 1, 21))
    assert outputs[0] == outputs[1]
    assert [(u.key, u.start, u.end, u.value) for u in outputs[0]] == [("a", 1, 1, 1)]
