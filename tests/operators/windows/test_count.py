"""Count-based tumbling windows: membership by offset, replays ignored."""

from __future__ import annotations

import pytest

from sessionstore import StateDB
from sessionstore.operators.windows.count import CountWindowAggregator, CountWindowUpdate

C = CountWindowUpdate


def test_windows_of_n_messages_per_key(db):
    agg = CountWindowAggregator(db.kv_store("c"), 3, aggregations={"sum": ("sum", None)})
    out = agg.process_rows(["a", "b", "a", "a", "a", "b"], [1, 2, 3, 4, 5, 6], [1, 10, 2, 3, 4, 20])
    assert out == [C("a", 0, 3, {"sum": 6}, "final")]
    out = agg.process_rows(["a", "a", "b"], [7, 8, 9], [5, 6, 30])
    assert out == [C("a", 1, 3, {"sum": 15}, "final"), C("b", 0, 3, {"sum": 60}, "final")]


def test_replays_cannot_double_count(tmp_path):
    with StateDB.open(tmp_path) as db:
        agg = CountWindowAggregator(db.kv_store("c"), 2, aggregations={"n": "count"}, emit="update")
        assert agg.process("a", "x", 10) == [C("a", 0, 1, {"n": 1}, "update")]
    with StateDB.open(tmp_path) as db:  # e.g. a restarted task re-reads offset 10
        agg = CountWindowAggregator(db.kv_store("c"), 2, aggregations={"n": "count"}, emit="update")
        assert agg.process("a", "x", 10) == []
        assert agg.replayed_records == 1
        assert agg.process("a", "y", 11) == [C("a", 0, 2, {"n": 2}, "final")]
        assert agg.process("a", "y", 11) == []


def test_bad_input(db):
    store = db.kv_store("c")
    with pytest.raises(ValueError, match="size must be a positive int"):
        CountWindowAggregator(store, 0, aggregations={"n": "count"})
    agg = CountWindowAggregator(store, 2, aggregations={"n": "count"})
    with pytest.raises(ValueError, match="need an int offset"):
        agg.process("a", 1, None)
    assert agg.process(None, 1, 1) == []
    assert agg.dropped_records == 1
    with pytest.raises(TypeError, match="KeyValueStore"):
        CountWindowAggregator(db.session_store("s", 10), 2, aggregations={"n": "count"})


def test_kv_store(db):
    kv = db.kv_store("kv")
    kv.put(("u", 2), {"a": 1})
    kv.put(("u", 1), [1])
    assert kv.get(("u", 2)) == {"a": 1}
    assert list(kv.items()) == [(("u", 1), [1]), (("u", 2), {"a": 1})]
    kv.delete(("u", 1))
    assert kv.get(("u", 1)) is None
    assert db.store_specs()["kv"]["kind"] == "kv"
