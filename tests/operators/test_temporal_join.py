"""Temporal join: the KIP-889 example, inner and left, retention drops, batches."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import StateDB
from sessionstore.operators.temporal_join import STREAM, TABLE, JoinedRecord, TemporalJoin

J = JoinedRecord


@pytest.fixture
def table(db):
    return db.versioned_store("rates", history_retention_ms=100, segment_interval_ms=10)


def test_kip889_example_joins_out_of_order_record_with_the_right_version(table):
    join = TemporalJoin(table)
    join.process_table("k", "b0", 0)
    assert join.process_stream("k", "a1", 1) == J("k", 1, ("a1", "b0"))
    join.process_table("k", "b3", 3)
    assert join.process_stream("k", "a4", 4) == J("k", 4, ("a4", "b3"))
    assert join.process_stream("k", "a2", 2) == J("k", 2, ("a2", "b0"))


def test_inner_and_left(table):
    inner = TemporalJoin(table)
    left = TemporalJoin(table, joiner=lambda s, t: f"{s}+{t}", how="left")
    inner.process_table("k", "v", 10)
    assert inner.process_stream("k", "early", 5) is None
    assert left.process_stream("k", "early", 5) == J("k", 5, "early+None")
    assert left.process_stream("k", "late", 15) == J("k", 15, "late+v")
    inner.process_table("k", None, 20)  # a delete ends the version
    assert inner.process_stream("k", "after", 25) is None
    assert left.process_stream("k", "after", 25) == J("k", 25, "after+None")
    assert inner.process_stream("k", "before", 19) == J("k", 19, ("before", "v"))


def test_stream_records_older_than_history_retention_are_dropped(table):
    join = TemporalJoin(table, how="left")
    join.process_table("k", "old", 0)
    join.process_table("k", "new", 500)
    assert join.process_stream("k", "s", 399) is None  # 399 < 500 - 100
    assert join.dropped_records == 1
    assert join.process_stream("k", "s", 400) == J("k", 400, ("s", "old"))
    assert join.process_stream(None, "s", 450) is None
    assert join.process_stream("k", "s", None) is None
    assert join.dropped_records == 3


def test_bad_configuration(table):
    with pytest.raises(ValueError, match="how must be 'inner' or 'left'"):
        TemporalJoin(table, how="outer")
    with pytest.raises(TypeError, match="VersionedStore"):
        TemporalJoin(object())
    with pytest.raises(ValueError, match="side must be"):
        TemporalJoin(table).process_rows(["both"], ["k"], [1], ["v"])


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from([STREAM, TABLE]),
            st.sampled_from(["x", "y"]),
            st.integers(0, 50),
            st.one_of(st.none(), st.integers(0, 9)),
        ),
        max_size=40,
    )
)
def test_equals_a_brute_force_as_of_join_with_pandas(tmp_path_factory, events):
    """With retention covering everything, each stream record meets the latest table
    version at or before its time among the table records that arrived before it."""
    with StateDB.open(tmp_path_factory.mktemp("db")) as db:
        join = TemporalJoin(db.versioned_store("t", 10**6), how="left")
        sides, keys, times, values = (
            (list(col) for col in zip(*events, strict=True)) if events else ([], [], [], [])
        )
        got = join.process_rows(sides, keys, times, values)
    expected = []
    seen = []
    for n, (side, key, ts, value) in enumerate(events):
        if side == TABLE:
            seen.append({"key": key, "ts": ts, "value": value, "n": n})
            continue
        table = pd.DataFrame(seen, columns=["key", "ts", "value", "n"])
        match = table[(table.key == key) & (table.ts <= ts)].sort_values(["ts", "n"])
        table_value = None if match.empty else match.iloc[-1]["value"]
        table_value = None if pd.isna(table_value) else int(table_value)
        expected.append(J(key, ts, (value, table_value)))
    assert got == expected


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    table_rows=st.lists(
        st.tuples(
            st.sampled_from(["x", "y"]), st.integers(0, 12), st.one_of(st.none(), st.integers(0, 9))
        ),
        max_size=20,
    ),  # fmt: skip
    stream_rows=st.lists(
        st.tuples(st.sampled_from(["x", "y", "z", None]), st.one_of(st.none(), st.integers(0, 14))),
        max_size=20,
    ),
    retention=st.sampled_from([5, 20, 10**6]),
    how=st.sampled_from(["inner", "left"]),
)
def test_stream_batches_read_per_key_but_equal_record_by_record(
    tmp_path_factory, table_rows, stream_rows, retention, how
):
    results, dropped = [], []
    for batched in (False, True):
        with StateDB.open(tmp_path_factory.mktemp("db")) as db:
            join = TemporalJoin(db.versioned_store("t", retention), how=how)
            for key, ts, value in table_rows:
                join.process_table(key, value, ts)
            keys = [k for k, _ in stream_rows]
            times = [t for _, t in stream_rows]
            values = list(range(len(stream_rows)))
            if batched:
                results.append(join.process_streams(keys, values, times))
            else:
                results.append(
                    [
                        join.process_stream(k, v, t)
                        for k, v, t in zip(keys, values, times, strict=True)
                    ]
                )
            dropped.append(join.dropped_records)
    assert results[0] == results[1]
    assert dropped[0] == dropped[1]


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    earlier=st.lists(st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 30)), max_size=6),
    start=st.one_of(st.none(), st.integers(0, 40)),
    rows=st.lists(
        st.tuples(
            st.sampled_from([TABLE, STREAM]),
            st.sampled_from(["x", "y", "z"]),
            st.integers(0, 60),
            st.one_of(st.none(), st.integers(0, 9)),
        ),
        max_size=25,
    ),
    retention=st.sampled_from([3, 10, 10**6]),
)
def test_a_held_batch_equals_its_rows_in_time_order(
    tmp_path_factory, earlier, start, rows, retention
):
    """What the Spark operator does with a micro-batch (its table rows, then its
    stream rows, with the stream time held at the operator's event time ``start``)
    equals taking every row in time order, each moving the time: so a row's fate
    depends on ``start`` and its key's rows only, never on the partition's other
    keys (which is what makes the output independent of the partition count)."""
    rows = sorted(rows, key=lambda r: (r[2], r[0] != TABLE))  # ties: the table first
    results = []
    for held in (True, False):
        with StateDB.open(tmp_path_factory.mktemp("db")) as db:
            store = db.versioned_store("t", retention)
            join = TemporalJoin(store, how="left")
            for key, ts in earlier:
                join.process_table(key, ts, ts)
            if start is not None:
                store.advance_stream_time(start)
            if held:
                with store.stream_time_held():
                    for side, key, ts, value in rows:
                        if side == TABLE:
                            join.process_table(key, value, ts)
                    stream = [(k, v, t) for side, k, t, v in rows if side == STREAM]
                    got = (
                        join.process_streams(*map(list, zip(*stream, strict=True)))
                        if stream
                        else []
                    )
                out = [r for r in got if r is not None]
            else:
                out = (
                    [r for r in join.process_rows(*map(list, zip(*rows, strict=True))) if r]
                    if rows
                    else []
                )
            results.append(
                (out, join.dropped_records, store.dropped_records, store.observed_stream_time)
            )
    assert results[0] == results[1]
