"""Tumbling and hopping windows with the SAMZA-552 emission policies."""

from __future__ import annotations

import pytest

from sessionstore import StateDB
from sessionstore.errors import StoreSpecMismatchError
from sessionstore.operators.windows.aggregator import TimeWindows, WindowAggregator, WindowUpdate
from sessionstore.stores.window import TimeWindow

W = WindowUpdate


@pytest.fixture
def make(db):
    def build(size, advance=None, grace=0, emit="update", early=None, name="w"):
        store = db.window_store(name, retention_ms=1, window_size_ms=size)
        return WindowAggregator(
            store,
            TimeWindows(size, advance, grace),
            aggregations={"n": "count"},
            emit=emit,
            early_every_ms=early,
        )

    return build


def feed(agg, records, batch=False):
    if batch:
        return agg.process_rows(
            [k for k, _ in records], [t for _, t in records], [None] * len(records)
        )
    out = []
    for key, ts in records:
        out.extend(agg.process(key, None, ts))
    return out


def test_window_starts():
    assert list(TimeWindows(10).starts_for(25)) == [20]
    assert list(TimeWindows(10).starts_for(-1)) == [-10]
    assert list(TimeWindows(10, 5).starts_for(25)) == [20, 25]
    assert list(TimeWindows(10, 3).starts_for(10)) == [3, 6, 9]
    with pytest.raises(ValueError, match="advance_ms must be a positive int no larger"):
        TimeWindows(10, 20)


@pytest.mark.parametrize("batch", [False, True])
def test_tumbling_update_mode(make, batch):
    agg = make(10)
    out = feed(agg, [("a", 1), ("a", 9), ("b", 10), ("a", 12)], batch)
    assert out == [
        W("a", 0, 10, {"n": 1}, 1, "update"),
        W("a", 0, 10, {"n": 2}, 9, "update"),
        W("b", 10, 20, {"n": 1}, 10, "update"),
        W("a", 10, 20, {"n": 1}, 12, "update"),
    ]


def test_hopping_counts_a_record_in_every_window(make):
    agg = make(10, advance=5)
    out = feed(agg, [("a", 7)])
    assert [(u.start, u.end, u.value) for u in out] == [(0, 10, {"n": 1}), (5, 15, {"n": 1})]
    feed(agg, [("a", 12)])
    stored = list(agg.store.fetch_windows("a"))
    # [0, 10) closed at stream time 12 and is past the store's minimum retention
    assert stored == [(TimeWindow("a", 5, 15), [2]), (TimeWindow("a", 10, 20), [1])]


def test_late_records_within_grace_update_and_after_grace_are_dropped(make):
    agg = make(10, grace=5)
    feed(agg, [("a", 12)])  # stream time 12: window [0, 10) open until 15
    assert feed(agg, [("a", 3)]) == [W("a", 0, 10, {"n": 1}, 3, "update")]
    feed(agg, [("a", 15)])  # [0, 10) closes
    assert feed(agg, [("a", 4)]) == []
    assert agg.dropped_records == 1


def test_final_mode_emits_each_window_once_when_it_closes(make):
    agg = make(10, grace=5, emit="final")
    assert feed(agg, [("b", 2), ("a", 1), ("a", 11), ("a", 8)]) == []
    out = feed(agg, [("c", 15)])  # 10 + 5 <= 15: the [0, 10) windows close, by key
    assert out == [W("a", 0, 10, {"n": 2}, 10, "final"), W("b", 0, 10, {"n": 1}, 10, "final")]
    assert feed(agg, [("c", 16)]) == []
    assert feed(agg, [("c", 100)]) == [
        W("a", 10, 20, {"n": 1}, 20, "final"),
        W("c", 10, 20, {"n": 2}, 20, "final"),
    ]


def test_on_time_then_late_updates(make):
    agg = make(10, grace=5, emit="on_time")
    feed(agg, [("a", 1), ("a", 2)])
    assert feed(agg, [("a", 10)]) == [W("a", 0, 10, {"n": 2}, 10, "on_time")]
    assert feed(agg, [("a", 9)]) == [W("a", 0, 10, {"n": 3}, 9, "late")]
    assert feed(agg, [("a", 15), ("a", 8)]) == []  # closed after grace
    assert agg.dropped_records == 1


def test_early_emission_every_n_ms_of_stream_time(make):
    agg = make(100, emit="final", early=30)
    assert feed(agg, [("a", 5), ("b", 20)]) == []  # the first record starts the clock
    out = feed(agg, [("a", 31)])  # crossed 30: current windows, before a@31 is added
    assert out == [W("a", 0, 100, {"n": 1}, 31, "early"), W("b", 0, 100, {"n": 1}, 31, "early")]
    assert feed(agg, [("a", 50)]) == []
    assert feed(agg, [("b", 61)]) == [
        W("a", 0, 100, {"n": 3}, 61, "early"),
        W("b", 0, 100, {"n": 1}, 61, "early"),
    ]
    assert feed(agg, [("z", 100)]) == [
        W("a", 0, 100, {"n": 3}, 100, "final"),
        W("b", 0, 100, {"n": 2}, 100, "final"),
    ]


def test_state_survives_reopen_and_replay_is_identical(tmp_path):
    def run(path):
        with StateDB.open(path) as db:
            store = db.window_store("w", 1, window_size_ms=10)
            agg = WindowAggregator(
                store, TimeWindows(10, grace_ms=5), aggregations={"n": "count"}, emit="final"
            )
            first = feed(agg, [("a", 1), ("b", 4)])
        with StateDB.open(path) as db:
            store = db.window_store("w", 1, window_size_ms=10)
            agg = WindowAggregator(
                store, TimeWindows(10, grace_ms=5), aggregations={"n": "count"}, emit="final"
            )
            assert agg.stream_time == 4
            return first + feed(agg, [("a", 16)]), sorted(db.scan("meta"))

    one, two = run(tmp_path / "one"), run(tmp_path / "two")
    assert one == two
    assert one[0] == [W("a", 0, 10, {"n": 1}, 10, "final"), W("b", 0, 10, {"n": 1}, 10, "final")]


def test_window_store_api_and_spec(db):
    store = db.window_store("w", 1000, window_size_ms=10)
    store.put_window("k", 20, "x")
    store.put_window("k", 0, "y")
    assert store.fetch_window("k", 20) == "x"
    assert list(store.fetch_windows("k", 5, 30)) == [(TimeWindow("k", 20, 30), "x")]
    assert list(store.fetch_all()) == [
        (TimeWindow("k", 0, 10), "y"),
        (TimeWindow("k", 20, 30), "x"),
    ]
    store.put_window("k", 20, None)
    assert store.fetch_window("k", 20) is None
    assert db.store_specs()["w"]["kind"] == "window"
    with pytest.raises(StoreSpecMismatchError, match="window_size_ms"):
        db.window_store("w", 1000, window_size_ms=20)
    with pytest.raises(ValueError, match="window_size_ms must be a positive int"):
        db.window_store("v", 1000, window_size_ms=0)


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"emit": "never"}, "emit must be"),
        ({"early_every_ms": 10}, "early_every_ms needs emit"),
        ({"emit": "final", "early_every_ms": 0}, "early_every_ms must be a positive int"),
    ],
)
def test_bad_configuration(db, kwargs, error):
    store = db.window_store("w", 100, window_size_ms=10)
    with pytest.raises(ValueError, match=error):
        WindowAggregator(store, TimeWindows(10), aggregations={"n": "count"}, **kwargs)
    with pytest.raises(ValueError, match="holds 10 ms windows"):
        WindowAggregator(store, TimeWindows(20), aggregations={"n": "count"})


def test_advance_to_fires_windows_without_records(make):
    agg = make(10, grace=5, emit="final")
    feed(agg, [("a", 1), ("b", 12)])
    assert agg.advance_to(14) == []
    assert agg.advance_to(15) == [W("a", 0, 10, {"n": 1}, 10, "final")]
    assert agg.advance_to(3) == []
    assert agg.advance_to(40) == [W("b", 10, 20, {"n": 1}, 20, "final")]
    assert agg.stream_time == 40
