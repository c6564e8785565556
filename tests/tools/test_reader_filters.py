"""Row filters of the inspect layer (CLI dump, data source) against brute force: the
rows a filter returns are exactly those of a full read that satisfy it."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sessionstore import StateDB
from sessionstore.encoding.keys import encode_key
from sessionstore.tools.reader import RowFilter

KEYS = st.sampled_from(["a", "b", "aa", "b\x00", "c"])
BOUND = st.one_of(st.none(), KEYS)
TIME = st.one_of(st.none(), st.integers(0, 60))


def _in_key_range(key, lo, hi):
    k = encode_key(key)
    return (lo is None or encode_key(lo) <= k) and (hi is None or k <= encode_key(hi))


@settings(max_examples=120, deadline=None)
@given(
    sessions=st.lists(st.tuples(KEYS, st.integers(0, 50), st.integers(0, 10)), max_size=30),
    key_from=BOUND,
    key_to=BOUND,
    from_ts=TIME,
    to_ts=TIME,
    kind=st.sampled_from(["session", "window"]),
)
def test_session_and_window_filters(tmp_path_factory, sessions, key_from, key_to, from_ts, to_ts,
                                    kind):  # fmt: skip
    assume(from_ts is None or to_ts is None or from_ts <= to_ts)  # refused: see test_cli
    with StateDB.open(tmp_path_factory.mktemp("db") / "db") as db:
        if kind == "session":
            store = db.session_store("s", 10**9)
            for key, start, length in sessions:
                store.put(key, start, start + length, [key, start])
        else:
            store = db.window_store("s", 10**9, 5)
            for key, start, _ in sessions:
                store.put_window(key, start, [key, start])
        everything = list(RowFilter().rows(store))
        got = list(RowFilter(key_from=key_from, key_to=key_to,
                             from_ts=from_ts, to_ts=to_ts).rows(store))  # fmt: skip
    last = (lambda r: r["end"] - 1) if kind == "window" else (lambda r: r["end"])
    want = [
        r
        for r in everything
        if _in_key_range(r["key"], key_from, key_to)
        and (from_ts is None or last(r) >= from_ts)
        and (to_ts is None or r["start"] <= to_ts)
    ]
    assert got == want


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(
    puts=st.lists(
        st.tuples(KEYS, st.one_of(st.none(), st.integers(0, 9)), st.integers(0, 60)), max_size=30
    ),
    key_from=BOUND,
    key_to=BOUND,
    from_ts=TIME,
    to_ts=TIME,
)
def test_versioned_filters(tmp_path_factory, puts, key_from, key_to, from_ts, to_ts):
    assume(from_ts is None or to_ts is None or from_ts <= to_ts)
    with StateDB.open(tmp_path_factory.mktemp("db") / "db") as db:
        store = db.versioned_store("v", 10**9)
        for key, value, ts in puts:
            store.put(key, value, ts)
        everything = list(RowFilter().rows(store))
        got = list(RowFilter(key_from=key_from, key_to=key_to,
                             from_ts=from_ts, to_ts=to_ts).rows(store))  # fmt: skip
    # a version [valid_from, valid_to) overlaps [from_ts, to_ts]
    want = [
        r
        for r in everything
        if _in_key_range(r["key"], key_from, key_to)
        and (from_ts is None or r["valid_to"] is None or r["valid_to"] > from_ts)
        and (to_ts is None or r["valid_from"] <= to_ts)
    ]
    assert got == want
    assert len(everything) == len({(r["key"], r["valid_from"]) for r in everything})


def test_versioned_rows_follow_the_history_retention_rule(tmp_path):
    # dump/get (and the DataSource, through the same rows) answer a time range with
    # what get(as_of) answers in it: as_of 0..11 is older than 300_012 - 300_000.
    with StateDB.open(tmp_path / "db") as db:
        store = db.versioned_store("v", 300_000)
        store.put("ko", "vo_old", 1)
        store.put("ko", "vo_new", 300_012)

        def rows(**kw):
            return [(r["value"], r["valid_from"]) for r in RowFilter(**kw).rows(store)]

        assert rows(from_ts=0, to_ts=11) == []
        assert rows(as_of=5) == []
        assert rows(from_ts=0, to_ts=12) == [("vo_old", 1)]
        assert rows(as_of=12) == [("vo_old", 1)]
        assert rows() == [("vo_new", 300_012), ("vo_old", 1)]


@settings(max_examples=120, deadline=None)
@given(
    puts=st.dictionaries(KEYS, st.integers(0, 9), max_size=5),
    key=st.one_of(st.none(), KEYS),
    key_from=BOUND,
    key_to=BOUND,
)
def test_key_value_filters(tmp_path_factory, puts, key, key_from, key_to):
    assume(key is None or (key_from is None and key_to is None))  # refused: see test_cli
    with StateDB.open(tmp_path_factory.mktemp("db") / "db") as db:
        store = db.kv_store("k")
        for k, value in puts.items():
            store.put(k, value)
        got = list(RowFilter(key=key, key_from=key_from, key_to=key_to).rows(store))
    want = [
        {"key": k, "value": puts[k]}
        for k in sorted(puts, key=encode_key)
        if (k == key if key is not None else _in_key_range(k, key_from, key_to))
    ]
    assert got == want


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(
    writes=st.dictionaries(
        st.tuples(KEYS, st.one_of(st.just(0), st.sampled_from(["n", "m", "n\x00"]))),
        st.integers(0, 9),
        max_size=12,
    ),
    key=st.one_of(st.none(), KEYS),
    key_from=BOUND,
    key_to=BOUND,
)
def test_processor_filters(tmp_path_factory, writes, key, key_from, key_to):
    # variable 0 is a key's timer list; a key is a tuple of its grouping columns
    assume(key is None or (key_from is None and key_to is None))
    with StateDB.open(tmp_path_factory.mktemp("db") / "db") as db:
        store = db.processor_store("p")
        with db.batch():
            for (k, variable), n in writes.items():
                payload = [n] if variable == 0 else ((n,), None)
                store.write(store.encode_key((k,)), encode_key(variable), payload)
        got = list(
            RowFilter(
                key=None if key is None else (key,),
                key_from=None if key_from is None else (key_from,),
                key_to=None if key_to is None else (key_to,),
            ).rows(store)
        )
    order = sorted(writes, key=lambda kv: (encode_key((kv[0],)), encode_key(kv[1])))
    want = [
        {
            "key": (k,),
            "state": None if variable == 0 else variable,
            "value": [n] if variable == 0 else {"value": [n], "expires_ms": None},
        }
        for k, variable in order
        for n in [writes[(k, variable)]]
        if (k == key if key is not None else _in_key_range(k, key_from, key_to))
    ]
    assert got == want
