"""Windowed stream-stream join: pairs once, replays once, late drops, expiry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import StateDB
from sessionstore.operators.window_join import LEFT, RIGHT, JoinedPair, WindowedJoin

P = JoinedPair


@pytest.fixture
def join(db):
    left = db.message_store("clicks", 1, segment_interval_ms=10)
    right = db.message_store("views", 1, segment_interval_ms=10)
    return WindowedJoin(left, right, within_ms=5, grace_ms=2)


def test_each_pair_once_whichever_side_comes_first(join):
    assert join.process(LEFT, "k", "l1", 10, offset=1) == []
    assert join.process(RIGHT, "k", "r1", 14, offset=1) == [P("k", 10, 14, ("l1", "r1"), 14)]
    assert join.process(RIGHT, "k", "r2", 16, offset=2) == []  # 16 - 10 > 5
    assert join.process(LEFT, "k", "l2", 12, offset=2) == [
        P("k", 12, 14, ("l2", "r1"), 14),
        P("k", 12, 16, ("l2", "r2"), 16),
    ]
    assert join.process(LEFT, "other", "x", 12, offset=3) == []


def test_window_bounds_are_inclusive(join):
    join.process(LEFT, "k", "l", 10, offset=1)
    assert join.process(RIGHT, "k", "r", 5, offset=1) == [P("k", 10, 5, ("l", "r"), 10)]
    assert join.process(RIGHT, "k", "r", 15, offset=2) == [P("k", 10, 15, ("l", "r"), 15)]
    assert join.process(RIGHT, "k", "r", 16, offset=3) == []


def test_a_replayed_message_is_stored_and_joined_once(join):
    join.process(LEFT, "k", "l", 10, offset=7)
    assert len(join.process(RIGHT, "k", "r", 11, offset=1)) == 1
    assert join.process(LEFT, "k", "l", 10, offset=7) == []
    assert [m for m in join.left.messages("k", 0, 100)] == [(10, 7, "l")]
    assert len(join.process(RIGHT, "k", "r2", 12, offset=2)) == 1


def test_late_messages_are_dropped_and_counted(join):
    join.process(LEFT, "k", "l", 100, offset=1)
    assert join.process(RIGHT, "k", "r", 92, offset=1) == []  # 92 < 100 - 5 - 2
    assert join.dropped_records == 1
    assert join.process(RIGHT, "k", "r", 93, offset=3) == []  # accepted, no partner
    assert join.dropped_records == 1
    assert join.process(RIGHT, "k", "r", 95, offset=2) == [P("k", 100, 95, ("l", "r"), 100)]
    assert join.process(RIGHT, None, "r", 99) == []
    assert join.dropped_records == 2


def test_expiry_drops_whole_segments(db, join):
    for i in range(10):
        join.process(LEFT, "k", i, i * 10, offset=i)
    families = [f for f in db.column_families() if f.startswith("clicks.")]
    # retention 2 * 5 + 2 + 1 = 13 at stream time 90: only segments from 7 on remain
    assert families == ["clicks.7", "clicks.8", "clicks.9"]


def test_an_advance_without_a_message_expires_and_judges_lateness(db, join):
    """``advance`` (the query's event time, before a batch) acts as a message at
    that time would, without storing one: both buffers expire what it leaves behind
    (whole segments), later messages are late against it, and it never goes back."""
    join.process(LEFT, "k", "l", 10, offset=1)
    join.process(RIGHT, "k", "r", 12, offset=1)
    join.advance(100)
    assert join.stream_time == 100
    # retention 13 at stream time 100: segments below 87 // 10 = 8 are gone
    assert [f for f in db.column_families() if f.startswith(("clicks.", "views."))] == []
    assert list(join.left.messages("k", 0, 200)) == []
    assert join.process(RIGHT, "k", "r2", 92, offset=2) == []  # 92 < 100 - 5 - 2
    assert join.dropped_records == 1
    join.advance(50)  # never back
    assert join.stream_time == 100
    assert join.process(LEFT, "k", "l2", 95, offset=2) == []  # accepted, no partner
    assert join.dropped_records == 1
    reopened = WindowedJoin(join.left, join.right, within_ms=5, grace_ms=2)
    assert reopened.stream_time == 100  # kept with the state
    with pytest.raises(TypeError, match="ts must be an int of epoch milliseconds, got NoneType"):
        join.advance(None)


def test_bad_configuration(db):
    a, b = db.message_store("a", 10), db.message_store("b", 10)
    with pytest.raises(ValueError, match="within_ms must be a non-negative int"):
        WindowedJoin(a, b, within_ms=-1)
    with pytest.raises(ValueError, match="separate message stores"):
        WindowedJoin(a, a, within_ms=1)
    with pytest.raises(TypeError, match="MessageStores"):
        WindowedJoin(a, db.session_store("s", 10), within_ms=1)
    with pytest.raises(ValueError, match="side must be"):
        WindowedJoin(a, b, within_ms=1).process("middle", "k", "v", 1)


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.sampled_from([LEFT, RIGHT]), st.sampled_from(["x", "y"]), st.integers(0, 40)),
        max_size=30,
    ),
    within=st.integers(0, 8),
)
def test_pairs_equal_a_nested_loop_join(tmp_path_factory, events, within):
    """With a grace period covering all lateness, the join emits exactly the pairs of
    a nested-loop join, each once."""
    with StateDB.open(tmp_path_factory.mktemp("db")) as db:
        join = WindowedJoin(
            db.message_store("l", 1), db.message_store("r", 1), within, grace_ms=100
        )
        sides = [e[0] for e in events]
        keys = [e[1] for e in events]
        times = [e[2] for e in events]
        # each message's value is its own timestamp, so pairs show (left ts, right ts)
        got = join.process_rows(sides, keys, times, times, list(range(len(events))))
    lefts = [(n, k, t) for n, (s, k, t) in enumerate(events) if s == LEFT]
    rights = [(n, k, t) for n, (s, k, t) in enumerate(events) if s == RIGHT]
    expected = sorted(
        (k, lt, rt, (lt, rt))
        for _, k, lt in lefts
        for _, k2, rt in rights
        if k == k2 and abs(lt - rt) <= within
    )
    assert sorted((p.key, p.left_timestamp, p.right_timestamp, p.value) for p in got) == expected
