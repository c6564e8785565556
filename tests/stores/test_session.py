"""Session stores (KIP-94, KIP-445): exact values for every method and boundary,
run against the RocksDB store and the in-memory store alike."""

from __future__ import annotations

import pytest

from sessionstore import InMemorySessionStore, SessionWindow, StateDB
from sessionstore.encoding.serde import BytesSerde, StringSerde


@pytest.fixture(params=["rocksdb", "memory"])
def make_store(request, tmp_path):
    dbs = []

    def make(retention_ms=1_000_000, segment_interval_ms=None, **kw):
        if request.param == "memory":
            return InMemorySessionStore("s", retention_ms, segment_interval_ms, **kw)
        db = StateDB.open(tmp_path / f"db{len(dbs)}")
        dbs.append(db)
        return db.session_store("s", retention_ms, segment_interval_ms, **kw)

    yield make
    for db in dbs:
        db.close()


def windows(it):
    return [(w.key, w.start, w.end, v) for w, v in it]


def test_kip94_find_sessions_to_merge_example(make_store):
    store = make_store()
    for start, end in [(0, 99), (101, 200), (201, 300), (301, 400)]:
        store.put("k", start, end, f"{start}-{end}")
    got = windows(store.find_sessions("k", earliest_end=150, latest_start=300))
    assert got == [("k", 101, 200, "101-200"), ("k", 201, 300, "201-300")]


def test_find_sessions_bounds_are_inclusive(make_store):
    store = make_store()
    store.put("k", 10, 20, "a")
    assert windows(store.find_sessions("k", 20, 10)) == [("k", 10, 20, "a")]
    assert windows(store.find_sessions("k", 21, 10)) == []
    assert windows(store.find_sessions("k", 20, 9)) == []


def test_order_is_key_end_start_and_backward_is_its_reverse(make_store):
    store = make_store()
    rows = [("b", 5, 5), ("a", 3, 9), ("a", 1, 9), ("a", 0, 4), ("aa", 0, 1), ("a\x00", 2, 2)]
    for key, start, end in rows:
        store.put(key, start, end, start)
    forward = [(w.key, w.start, w.end) for w, _ in store.fetch_range(None, None)]
    assert forward == [
        ("a", 0, 4),
        ("a", 1, 9),
        ("a", 3, 9),
        ("a\x00", 2, 2),
        ("aa", 0, 1),
        ("b", 5, 5),
    ]
    backward = [(w.key, w.start, w.end) for w, _ in store.fetch_range(None, None, backward=True)]
    assert backward == forward[::-1]
    assert [(w.start, w.end) for w, _ in store.fetch("a", backward=True)] == [
        (3, 9),
        (1, 9),
        (0, 4),
    ]


def test_fetch_never_sees_a_key_with_the_same_prefix(make_store):
    store = make_store(key_serde=None)
    store.put("a", 0, 1, 1)
    store.put("aa", 0, 1, 2)
    store.put("a\x00", 0, 1, 3)
    store.put(b"a", 0, 1, 4)
    assert windows(store.fetch("a")) == [("a", 0, 1, 1)]
    assert windows(store.fetch(b"a")) == [(b"a", 0, 1, 4)]


def test_find_sessions_in_range(make_store):
    store = make_store()
    for key in ["a", "b", "c", "d"]:
        store.put(key, 1, 2, key)
    assert [w.key for w, _ in store.find_sessions_in_range("b", "c", 0, 10)] == ["b", "c"]
    assert [w.key for w, _ in store.find_sessions_in_range(None, "b", 0, 10)] == ["a", "b"]
    assert [w.key for w, _ in store.find_sessions_in_range("c", None, 0, 10)] == ["c", "d"]
    assert list(store.find_sessions_in_range("c", "b", 0, 10)) == []
    assert [w.key for w, _ in store.fetch_range("b", "b")] == ["b"]


def test_put_none_and_remove_delete(make_store):
    store = make_store()
    store.put("k", 1, 2, "x")
    store.put("k", 3, 4, "y")
    store.put("k", 1, 2, None)
    store.remove("k", 3, 4)
    store.remove("k", 7, 8)  # absent: a no-op
    assert list(store.fetch("k")) == []
    assert store.fetch_session("k", 1, 2) is None


def test_fetch_session_and_overwrite(make_store):
    store = make_store()
    store.put("k", 1, 2, [1, 2])
    store.put("k", 1, 2, {"n": 3})
    assert store.fetch_session("k", 1, 2) == {"n": 3}
    assert store.fetch_session("k", 1, 3) is None
    assert store.fetch_session("other", 1, 2) is None


def test_fetch_encoded_reads_many_sessions_as_fetch_session_does(make_store):
    from sessionstore.encoding.keys import encode_key

    store = make_store(retention_ms=100, segment_interval_ms=50)
    for key, start, end in [("a", 0, 10), ("a", 120, 150), ("b", 60, 160), ("b", 200, 210)]:
        store.put(key, start, end, [key, end])
    # stream time 210: sessions ending before 111 are no longer visible
    asked = [("b", 200, 210), ("a", 0, 10), ("a", 120, 150), ("a", 120, 151), ("c", 1, 2),
             ("b", 60, 160)]  # fmt: skip
    got = store.fetch_encoded([(encode_key(k), s, e) for k, s, e in asked])
    assert got == [store.fetch_session(k, s, e) for k, s, e in asked]
    assert got == [["b", 210], None, ["a", 150], None, None, ["b", 160]]


def test_empty_bytes_and_none_are_distinct(make_store):
    store = make_store(value_serde=BytesSerde())
    store.put("k", 1, 2, b"")
    assert store.fetch_session("k", 1, 2) == b""
    assert windows(store.fetch("k")) == [("k", 1, 2, b"")]
    store = make_store()
    store.put("k", 1, 2, b"")
    assert store.fetch_session("k", 1, 2) == b""


def test_retention_boundary_and_dropped_records(make_store):
    store = make_store(retention_ms=10, segment_interval_ms=3)
    store.put("k", 100, 100, "now")
    assert store.observed_stream_time == 100
    assert store.min_visible_end() == 91
    store.put("k", 91, 91, "oldest visible")
    store.put("k", 90, 90, "too old")
    assert store.dropped_records == 1
    assert store.fetch_session("k", 90, 90) is None
    assert [w.end for w, _ in store.fetch("k")] == [91, 100]
    store.put("j", 105, 105, "later")  # stream time 105: ends < 96 are gone
    assert [w.end for w, _ in store.fetch("k")] == [100]
    assert store.fetch_session("k", 91, 91) is None
    assert store.dropped_records == 1


def test_deletes_do_not_advance_stream_time(make_store):
    store = make_store(retention_ms=10)
    store.put("k", 0, 5, 1)
    store.remove("k", 0, 500)
    assert store.observed_stream_time == 5
    assert windows(store.fetch("k")) == [("k", 0, 5, 1)]


def test_default_segment_interval(make_store):
    assert make_store(retention_ms=10).segment_interval_ms == 60_000
    assert make_store(retention_ms=600_000).segment_interval_ms == 300_000


def test_negative_times_sort_first(make_store):
    store = make_store()
    for end in (5, -5, 0, -100):
        store.put("k", end, end, end)
    assert [w.end for w, _ in store.fetch("k")] == [-100, -5, 0, 5]


def test_tuple_int_and_custom_serde_keys(make_store):
    store = make_store()
    for key in [("u", 2), ("u", 10), ("u", -1), ("v", 0)]:
        store.put(key, 0, 1, 0)
    assert [w.key for w, _ in store.fetch_range(("u", 0), ("u", 99))] == [("u", 2), ("u", 10)]
    text = make_store(key_serde=StringSerde())
    text.put("b", 0, 1, 0)
    text.put("a", 0, 1, 0)
    assert [w.key for w, _ in text.fetch_range(None, None)] == ["a", "b"]


@pytest.mark.parametrize(
    "call,exc,words",
    [
        (lambda s: s.put(None, 1, 2, 3), TypeError, "None"),
        (lambda s: s.put(1.5, 1, 2, 3), TypeError, "float"),
        (lambda s: s.put("k", 5, 2, 3), ValueError, "start 5 is after its end 2"),
        (lambda s: s.put("k", 0, 2**63, 3), ValueError, "end=9223372036854775808"),
        (lambda s: s.put("k", 0.5, 2, 3), TypeError, "start must be an int"),
        (lambda s: s.fetch_session(None, 1, 2), TypeError, "None"),
        (lambda s: list(s.find_sessions(None, 1, 2)), TypeError, "None"),
        (lambda s: list(s.find_sessions("k", 1.0, 2)), TypeError, "earliest_end"),
        (lambda s: list(s.fetch([1])), TypeError, "list"),
        (lambda s: s.remove(None, 1, 2), TypeError, "None"),
    ],
)
def test_bad_input_is_a_clear_error_and_loses_nothing(make_store, call, exc, words):
    store = make_store()
    store.put("k", 1, 2, "kept")
    with pytest.raises(exc, match=words):
        call(store)
    assert windows(store.fetch("k")) == [("k", 1, 2, "kept")]


@pytest.mark.parametrize("retention", [0, -1, 1.5, None])
def test_bad_retention(make_store, retention):
    with pytest.raises(ValueError, match="retention_ms must be a positive int"):
        make_store(retention_ms=retention)


def test_results_are_session_windows(make_store):
    store = make_store()
    store.put("k", 1, 2, "v")
    ((window, value),) = store.fetch("k")
    assert isinstance(window, SessionWindow)
    assert window == SessionWindow("k", 1, 2)
    assert value == "v"


def test_rocksdb_stream_time_survives_reopen(tmp_path):
    with StateDB.open(tmp_path) as db:
        store = db.session_store("s", retention_ms=10)
        store.put("k", 100, 100, 1)
    with StateDB.open(tmp_path) as db:
        store = db.session_store("s", retention_ms=10)
        assert store.observed_stream_time == 100
        store.put("k", 90, 90, 2)
        assert store.dropped_records == 1


def test_stream_time_is_rolled_back_with_an_aborted_batch(tmp_path):
    with StateDB.open(tmp_path) as db:
        store = db.session_store("s", retention_ms=10)
        store.put("k", 100, 100, 1)
        with pytest.raises(RuntimeError):
            with db.batch():
                store.put("k", 500, 500, 2)
                assert store.observed_stream_time == 500
                raise RuntimeError("task failed")
        assert store.observed_stream_time == 100
        assert windows(store.fetch("k")) == [("k", 100, 100, 1)]
