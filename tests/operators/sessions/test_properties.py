"""process_rows (the batch path) equals process() record by record: same updates in
the same order, same store contents, same stream time and drop counts."""

from __future__ import annotations

from itertools import accumulate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, StateDB
from sessionstore.operators import SessionWindowAggregator, SessionWindows
from tests.models import offline_sessions
from tests.operators.sessions.records import process_tuples
from tests.operators.store_factories import memory_store, rocksdb_stores

KEYS = st.sampled_from(["a", "b", "aa", ("t", 1), None])
RECORD = st.tuples(KEYS, st.integers(0, 9), st.one_of(st.none(), st.integers(0, 120)))
BATCHES = st.lists(st.lists(RECORD, max_size=25), min_size=1, max_size=5)

AGGS = {
    "n": "count",
    "total": ("sum", None),
    "lo": ("min", None),
    "hi": ("max", None),
    "first": ("first", None),
    "last": ("last", None),
    "all": ("collect", None),
}


def snapshot(store, agg):
    rows = list(store.fetch_range(None, None))
    index = agg.state.index.all() if agg.state.index is not None else None
    return rows, index, agg.stream_time, agg.state.emitted_close, agg.dropped_records


FAST_AGGS = {k: v for k, v in AGGS.items() if k != "all"}  # no collect: vectorised path


def run_both(make_store, batches, gap, grace, emit, retention, track=False, aggs=AGGS):
    one = make_store("one", retention)
    many = make_store("many", retention)
    windows = SessionWindows(gap, grace)
    rec = SessionWindowAggregator(one, windows, aggregations=aggs, emit=emit, track_offsets=track)
    bat = SessionWindowAggregator(many, windows, aggregations=aggs, emit=emit, track_offsets=track)
    for batch in batches:
        # with tracking, a record's value doubles as its offset, so values repeat
        # exactly when a record is replayed
        offsets = [r[1] for r in batch] if track else None
        expected = []
        for key, value, ts in batch:
            expected.extend(rec.process(key, value, ts, value if track else None))
        got = bat.process_rows(
            [r[0] for r in batch], [r[2] for r in batch], [r[1] for r in batch], offsets
        )
        assert got == expected
        assert snapshot(many, bat) == snapshot(one, rec)
        assert bat.replayed_records == rec.replayed_records


@settings(max_examples=150, deadline=None)
@given(
    batches=BATCHES,
    gap=st.integers(0, 15),
    grace=st.integers(0, 20),
    emit=st.sampled_from(["update", "final"]),
    extra_retention=st.sampled_from([0, 5, 100]),
)
def test_batch_equals_records_in_memory(batches, gap, grace, emit, extra_retention):
    run_both(memory_store, batches, gap, grace, emit, gap + grace + 1 + extra_retention)


# mostly in-order batches, so that most keys take the vectorised path
def _in_order(rows):
    times = list(accumulate(step for _, _, step in rows))
    return [(key, value, t) for (key, value, _), t in zip(rows, times, strict=True)]


IN_ORDER = st.lists(
    st.lists(st.tuples(KEYS, st.integers(0, 9), st.integers(0, 6)), max_size=30).map(_in_order),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(
    batches=st.one_of(IN_ORDER, BATCHES),
    gap=st.integers(0, 15),
    grace=st.integers(0, 20),
    emit=st.sampled_from(["update", "final"]),
    extra_retention=st.sampled_from([0, 30]),
    shift=st.integers(0, 3),
)
def test_vectorised_path_equals_records(batches, gap, grace, emit, extra_retention, shift):
    # later batches start later, as a stream does
    batches = [
        [(k, v, None if t is None else t + 50 * n * shift) for k, v, t in b]
        for n, b in enumerate(batches)
    ]

    run_both(
        memory_store, batches, gap, grace, emit, gap + grace + 1 + extra_retention, aggs=FAST_AGGS
    )


@settings(max_examples=100, deadline=None)
@given(
    batches=BATCHES,
    gap=st.integers(0, 15),
    grace=st.integers(0, 20),
    emit=st.sampled_from(["update", "final"]),
)
def test_batch_equals_records_with_replayed_offsets(batches, gap, grace, emit):
    run_both(memory_store, batches, gap, grace, emit, gap + grace + 1 + 100, track=True)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    batches=BATCHES,
    gap=st.integers(0, 15),
    grace=st.integers(0, 20),
    emit=st.sampled_from(["update", "final"]),
)
def test_batch_equals_records_in_rocksdb(batches, gap, grace, emit):
    with rocksdb_stores() as make:
        run_both(make, batches, gap, grace, emit, gap + grace + 1)


@settings(max_examples=100, deadline=None)
@given(
    times=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 6)), max_size=60),
    gap=st.integers(0, 10),
    batch_size=st.integers(1, 20),
)
def test_in_order_sessions_equal_offline_sessionization(times, gap, batch_size):
    records, t = [], 0
    for key, step in times:
        t += step
        records.append((key, None, t))
    store = InMemorySessionStore("s", 10**9)
    agg = SessionWindowAggregator(store, SessionWindows(gap), aggregations={"n": "count"})
    for i in range(0, len(records), batch_size):
        process_tuples(agg, records[i : i + batch_size])
    got = sorted((w.key, w.start, w.end, acc[0]) for w, acc in store.fetch_range(None, None))
    assert got == offline_sessions(records, gap)
    assert agg.dropped_records == 0


@pytest.mark.parametrize("emit, net", [("update", False), ("final", False), ("update", True)])
def test_replay_from_the_same_state_is_byte_identical(tmp_path, emit, net):
    batch = [("a", 1, 10), ("b", 2, 12), ("a", 3, 25), ("a", 4, 11), ("b", 5, 90), ("a", 6, 200)]
    outputs, states = [], []
    for run in range(2):
        with StateDB.open(tmp_path / f"run{run}") as db:
            store = db.session_store("s", 1000)
            agg = SessionWindowAggregator(
                store, SessionWindows(10, 5), aggregations={"n": "count"}, emit=emit
            )
            outputs.append(process_tuples(agg, batch[:3], net=net))
            outputs[-1] += process_tuples(agg, batch[3:], net=net)
            states.append(list(db.scan("s.0")) + list(db.scan("meta")))
    assert outputs[0] == outputs[1]
    assert states[0] == states[1]


MANY_KEYS = st.sampled_from([f"k{i}" for i in range(12)] + [None])
MANY_IN_ORDER = st.lists(
    st.lists(st.tuples(MANY_KEYS, st.integers(0, 9), st.integers(0, 4)), max_size=40).map(
        _in_order
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(
    batches=MANY_IN_ORDER,
    gap=st.integers(0, 8),
    grace=st.integers(0, 5),
    shift=st.integers(0, 3),
)
def test_final_mode_with_many_keys_equals_records(batches, gap, grace, shift):
    """Final mode over many keys: most keys have no stored session, the case the
    vectorised split on gaps handles."""
    batches = [[(k, v, t + 40 * n * shift) for k, v, t in b] for n, b in enumerate(batches)]

    run_both(memory_store, batches, gap, grace, "final", gap + grace + 1, aggs=FAST_AGGS)


def test_the_batch_path_leaves_the_garbage_collector_as_it_found_it():
    import gc

    store = InMemorySessionStore("s", 10**9)
    agg = SessionWindowAggregator(store, SessionWindows(5), aggregations={"n": "count"})
    assert gc.isenabled()
    agg.process_rows(["a", "b"], [1, 2], [None, None])
    assert gc.isenabled()
    gc.disable()
    try:
        agg.process_rows(["a"], [3], [None])
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(TypeError):
        agg.process_rows(["a"], [1.5], [None])  # fails inside: the collector is back on
    assert gc.isenabled()


def applied(table, updates):
    """``table`` ({(key, start, end): value}) after a sink applies ``updates``: a
    tombstone deletes its identity, anything else upserts it."""
    out = dict(table)
    for u in updates:
        if u.value is None:
            out.pop((u.key, u.start, u.end), None)
        else:
            out[(u.key, u.start, u.end)] = u.value
    return out


def net_change(before, after):
    """The reference net change between two tables: identities deleted (None) and
    identities whose value is new or different."""
    change = {ident: None for ident in before if ident not in after}
    missing = object()
    change.update({i: v for i, v in after.items() if before.get(i, missing) != v})
    return change


def run_net(
    make_store, batches, gap, grace, retention, track=False, aggs=AGGS, nudges=None,
    restart=False,
):  # fmt: skip
    """The record path's updates, applied to a table batch by batch, against
    ``process_rows(net=True)``: each batch's net updates are exactly the change of
    that table, one per identity, and the state is the record path's. ``nudges``
    moves both stores' stream time before a batch, as another writer would (the
    batch path then falls back to records). With ``restart`` the net path's
    aggregator is made anew for every batch: what it knows comes from the store."""
    one = make_store("one", retention)
    many = make_store("many", retention)
    windows = SessionWindows(gap, grace)
    rec = SessionWindowAggregator(one, windows, aggregations=aggs, track_offsets=track)
    net = SessionWindowAggregator(many, windows, aggregations=aggs, track_offsets=track)
    table: dict = {}
    for n, batch in enumerate(batches):
        if nudges and nudges[n % len(nudges)] and rec.stream_time is not None:
            for store in (one, many):
                store.advance_stream_time(rec.stream_time + nudges[n % len(nudges)])
        if restart:
            counters = net.dropped_records, net.replayed_records
            net = SessionWindowAggregator(many, windows, aggregations=aggs, track_offsets=track)
            net.dropped_records, net.replayed_records = counters
        offsets = [r[1] for r in batch] if track else None
        events = []
        for key, value, ts in batch:
            events.extend(rec.process(key, value, ts, value if track else None))
        after = applied(table, events)
        got = net.process_rows(
            [r[0] for r in batch], [r[2] for r in batch], [r[1] for r in batch], offsets, net=True
        )
        idents = [(u.key, u.start, u.end) for u in got]
        assert len(set(idents)) == len(idents)  # one row per session
        change = net_change(table, after)
        got_change = {(u.key, u.start, u.end): u.value for u in got}
        if nudges:
            # Another writer can hide a stored session from the aggregator before it
            # closes; the record path then re-creates it, and the net path cannot
            # see that it was emitted: it repeats it, a no-op for the table.
            got_change = {i: v for i, v in got_change.items() if i in change or table.get(i) != v}
        assert got_change == change
        assert all(u.timestamp == u.end for u in got)
        assert applied(table, got[::-1]) == after  # any order gives the same table
        assert snapshot(many, net) == snapshot(one, rec)
        assert net.replayed_records == rec.replayed_records
        table = after


@settings(max_examples=150, deadline=None)
@given(
    batches=st.one_of(IN_ORDER, BATCHES),
    gap=st.integers(0, 15),
    grace=st.integers(0, 20),
    extra_retention=st.sampled_from([0, 5, 100]),
    aggs=st.sampled_from([AGGS, FAST_AGGS]),
    nudges=st.one_of(st.none(), st.lists(st.integers(0, 30), min_size=1, max_size=3)),
)
def test_net_updates_are_the_change_of_the_record_paths_table(
    batches, gap, grace, extra_retention, aggs, nudges
):
    run_net(memory_store, batches, gap, grace, gap + grace + 1 + extra_retention, aggs=aggs,
            nudges=nudges)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(batches=BATCHES, gap=st.integers(0, 15), grace=st.integers(0, 20))
def test_net_updates_with_replayed_offsets(batches, gap, grace):
    run_net(memory_store, batches, gap, grace, gap + grace + 1 + 100, track=True)


@settings(max_examples=30, deadline=None)
@given(batches=st.one_of(IN_ORDER, BATCHES), gap=st.integers(0, 15), grace=st.integers(0, 20))
def test_net_updates_in_rocksdb(batches, gap, grace):
    with rocksdb_stores() as make:
        run_net(make, batches, gap, grace, gap + grace + 1, aggs=FAST_AGGS, restart=True)
