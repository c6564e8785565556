"""Versioned store (KIP-889): exact values for every method and boundary."""

from __future__ import annotations

import pytest

from sessionstore import PUT_REJECTED, VALID_TO_UNDEFINED, StateDB, VersionedRecord
from sessionstore.encoding.keys import encode_key
from sessionstore.encoding.serde import BytesSerde
from sessionstore.encoding.versioned_row import VersionRow

R = VersionedRecord


@pytest.fixture
def store(db):
    return db.versioned_store("v", history_retention_ms=1_000, segment_interval_ms=10)


def test_kip889_out_of_order_join_example(store):
    # B: b0 @0, b3 @3. A: a1 @1 -> b0, a4 @4 -> b3, a2 @2 (out of order) -> b0.
    assert store.put("k", "b0", 0) == VALID_TO_UNDEFINED
    assert store.put("k", "b3", 3) == VALID_TO_UNDEFINED
    assert store.get("k", 1) == R("b0", 0, 3)
    assert store.get("k", 4) == R("b3", 3, None)
    assert store.get("k", 2) == R("b0", 0, 3)


def test_put_returns_valid_to_of_history_versions(store):
    store.put("k", "a", 10)
    store.put("k", "c", 30)
    assert store.put("k", "b", 20) == 30
    assert store.put("k", "z", 5) == 10
    assert store.put("k", "b2", 20) == 30  # same timestamp replaces
    assert store.get_versions("k", ascending=True) == [
        R("z", 5, 10),
        R("a", 10, 20),
        R("b2", 20, 30),
        R("c", 30, None),
    ]


def test_get_as_of_is_inclusive_and_valid_to_exclusive(store):
    store.put("k", "a", 10)
    store.put("k", "b", 20)
    assert store.get("k", 9) is None
    assert store.get("k", 10) == R("a", 10, 20)
    assert store.get("k", 19) == R("a", 10, 20)
    assert store.get("k", 20) == R("b", 20, None)
    assert store.get("k") == R("b", 20, None)
    assert store.get("other") is None


def test_grace_period_is_history_retention(db):
    store = db.versioned_store("v", history_retention_ms=10, segment_interval_ms=5)
    store.put("k", "now", 100)
    assert store.put("k", "edge", 90) == 100  # 90 is not < 100 - 10
    assert store.put("k", "late", 89) == PUT_REJECTED
    assert store.dropped_records == 1
    assert store.delete("k", 50) is None
    assert store.dropped_records == 2
    assert store.get("k", 95) == R("edge", 90, 100)


def test_as_of_older_than_retention_only_latest_answers(db):
    store = db.versioned_store("v", history_retention_ms=10, segment_interval_ms=5)
    store.put("b", "only", 0)
    store.put("a", "v0", 0)
    store.put("a", "v50", 50)
    store.put("a", "v100", 100)
    assert store.get("a", 60) is None  # 60 < 100 - 10 and v50 is not the latest
    assert store.get("a", 95) == R("v50", 50, 100)
    assert store.get("a", 90) == R("v50", 50, 100)
    assert store.get("a", 89) is None
    assert store.get("b", 5) == R("only", 0, None)  # the latest may always answer
    assert store.get_versions("a") == [R("v100", 100, None), R("v50", 50, 100)]


def test_get_versions_returns_no_history_that_get_refuses(db):
    # issue 14: as_of in [0, 10] is older than 300_012 - 300_000, so get answers None
    # there; get_versions over the same range must not return vo_old either.
    store = db.versioned_store("v", history_retention_ms=300_000)
    store.put("ko", "vo_old", 1)
    store.put("ko", "vo_new", 300_012)
    assert store.get("ko", 5) is None
    assert store.get_versions("ko", 0, 10) == []
    assert store.get_versions("ko", 0, 11) == []
    assert store.get("ko", 12) == R("vo_old", 1, 300_012)  # the floor itself answers
    assert store.get_versions("ko", 0, 12) == [R("vo_old", 1, 300_012)]
    assert store.get_versions("ko", 0, 300_012) == [
        R("vo_new", 300_012, None),
        R("vo_old", 1, 300_012),
    ]
    assert store.get_versions("ko", 0, 300_011) == [R("vo_old", 1, 300_012)]


def test_tombstones_bound_validity_but_are_never_returned(store):
    store.put("k", "a", 0)
    assert store.put("k", None, 5) == VALID_TO_UNDEFINED
    assert store.get("k") is None
    assert store.get("k", 3) == R("a", 0, 5)
    assert store.get("k", 6) is None
    store.put("k", "b", 8)
    assert store.get("k", 6) is None
    assert store.get("k", 9) == R("b", 8, None)
    assert store.get_versions("k") == [R("b", 8, None), R("a", 0, 5)]
    assert store.put("k", "mid", 6) == 8  # overwrites nothing, fills the deleted gap
    assert store.get("k", 5) is None
    assert store.get("k", 6) == R("mid", 6, 8)


def test_delete_returns_the_version_valid_just_before(store):
    store.put("k", "a", 10)
    store.put("k", "b", 20)
    assert store.delete("k", 15) == R("a", 10, 20)
    assert store.get("k", 16) is None
    assert store.get("k", 12) == R("a", 10, 15)
    assert store.delete("k", 30) == R("b", 20, None)
    assert store.get("k") is None
    assert store.delete("nobody", 30) is None


def test_get_versions_finds_versions_whose_valid_to_is_in_a_later_segment(store):
    # Kafka 3.x stops at the segment of to_ts and misses "b", valid [3, 25).
    store.put("k", "a", 1)
    store.put("k", "b", 3)
    store.put("k", "c", 25)
    assert store.segment_ids() == [0, 2]  # a ends at 3 (segment 0), b at 25 (segment 2)
    assert store.get_versions("k", 0, 5) == [R("b", 3, 25), R("a", 1, 3)]
    assert store.get_versions("k", 4, 4) == [R("b", 3, 25)]
    assert store.get_versions("k", 26, 40) == [R("c", 25, None)]
    assert store.get_versions("k", 5, 4) == []


def test_tombstone_at_the_latest_timestamp_is_remembered(store):
    # Kafka forgets this tombstone, so "b" @5 would wrongly become the latest.
    store.put("k", "a", 10)
    assert store.put("k", None, 10) == VALID_TO_UNDEFINED
    assert store.get("k") is None
    assert store.put("k", "b", 5) == 10
    assert store.get("k") is None
    assert store.get("k", 7) == R("b", 5, 10)
    assert store.get("k", 10) is None
    assert store.get_versions("k") == [R("b", 5, 10)]
    assert store.put("k", "c", 10) == VALID_TO_UNDEFINED  # a value replaces the tombstone
    assert store.get("k") == R("c", 10, None)
    assert store.get("k", 7) == R("b", 5, 10)


def _row(db, segment, key):
    raw = db.get(f"v.{segment}", encode_key(key))
    return None if raw is None else VersionRow.decode(raw)


def test_history_rows_live_in_the_segment_of_their_valid_to(db, store):
    store.put("k", "a", 1)
    store.put("k", "c", 25)
    assert _row(db, 2, "k") == VersionRow(25, [(1, store.value_serde.dumps("a"))])
    store.put("k", "b", 5)  # "a" now ends at 5: it moves to segment 0
    assert _row(db, 0, "k") == VersionRow(5, [(1, store.value_serde.dumps("a"))])
    assert _row(db, 2, "k") == VersionRow(25, [(5, store.value_serde.dumps("b"))])
    assert store.get_versions("k", ascending=True) == [
        R("a", 1, 5),
        R("b", 5, 25),
        R("c", 25, None),
    ]


def test_row_format_worked_example():
    row = VersionRow(20, [(15, None), (10, b"x")])
    raw = row.encode()
    assert raw.hex(" ") == (
        "00 00 00 00 00 00 00 14 "  # next_ts 20
        "00 00 00 00 00 00 00 0a "  # min_ts 10
        "00 00 00 02 "  # count
        "00 00 00 00 00 00 00 0f ff ff ff ff "  # (15, tombstone)
        "00 00 00 00 00 00 00 0a 00 00 00 01 "  # (10, 1 byte)
        "78"
    )
    assert VersionRow.decode(raw) == row
    with pytest.raises(ValueError, match="corrupt versioned row"):
        VersionRow.decode(raw[:-1])


def test_expired_history_segments_are_dropped(db):
    store = db.versioned_store("v", history_retention_ms=20, segment_interval_ms=10)
    for ts in range(0, 60, 5):
        store.put("k", ts, ts)
    assert store.segment_ids() == [3, 4, 5]  # valid_to <= 55 - 20 can never be asked for
    store.put("k", "far", 200)
    assert store.segment_ids() == [20]
    assert [f for f in db.column_families() if f.startswith("v.")] == ["v.20", "v.latest"]
    assert store.get("k", 180) == R(55, 55, 200)  # 180 = 200 - 20: still answerable
    assert store.get("k", 179) is None  # older than retention: only the latest answers


def test_empty_value_is_not_a_tombstone(db):
    store = db.versioned_store("v", 100, value_serde=BytesSerde())
    store.put("k", b"", 1)
    store.put("k", b"x", 2)
    assert store.get("k", 1) == R(b"", 1, 2)
    store.put("k", b"", 3)
    assert store.get("k") == R(b"", 3, None)


def test_stream_time_and_versions_survive_reopen(tmp_path):
    with StateDB.open(tmp_path) as db:
        store = db.versioned_store("v", 10, segment_interval_ms=5)
        store.put("k", "a", 0)
        store.put("k", "b", 12)
    with StateDB.open(tmp_path) as db:
        store = db.versioned_store("v", 10)
        assert store.observed_stream_time == 12
        assert store.put("k", "late", 1) == PUT_REJECTED
        assert store.get("k", 5) == R("a", 0, 12)


@pytest.mark.parametrize(
    "call,exc,words",
    [
        (lambda s: s.put(None, 1, 2), TypeError, "None"),
        (lambda s: s.put(2.5, 1, 2), TypeError, "float"),
        (lambda s: s.put("k", 1, 2**63), ValueError, "timestamp=9223372036854775808"),
        (lambda s: s.put("k", 1, 1.5), TypeError, "timestamp must be an int"),
        (lambda s: s.get("k", 1.5), TypeError, "as_of"),
        (lambda s: s.get(None), TypeError, "None"),
        (lambda s: s.delete(None, 1), TypeError, "None"),
        (lambda s: s.get_versions("k", "x", 2), TypeError, "from_ts"),
    ],
)
def test_bad_input_is_a_clear_error_and_loses_nothing(store, call, exc, words):
    store.put("k", "kept", 1)
    with pytest.raises(exc, match=words):
        call(store)
    assert store.get_versions("k") == [R("kept", 1, None)]


@pytest.mark.parametrize("retention", [-1, 1.5, None])
def test_bad_history_retention(db, retention):
    with pytest.raises(ValueError, match="history_retention_ms must be a non-negative int"):
        db.versioned_store("v", retention)


def test_row_lookup_agrees_with_the_decoded_row():
    from sessionstore.encoding.versioned_row import lookup

    row = VersionRow(40, [(30, b"c"), (20, None), (10, b""), (5, b"aa")])
    raw = row.encode()
    assert lookup(raw, 40) is None
    assert lookup(raw, 35) == (30, 40, b"c")
    assert lookup(raw, 30) == (30, 40, b"c")
    assert lookup(raw, 29) == (20, 30, None)
    assert lookup(raw, 12) == (10, 20, b"")
    assert lookup(raw, 9) == (5, 10, b"aa")
    assert lookup(raw, 0) == (5, 10, b"aa")  # the caller checks valid_from <= ts


def test_push_newest_matches_decode_insert_encode():
    from sessionstore.encoding.versioned_row import push_newest

    assert push_newest(None, 5, b"ab", 9) == VersionRow(9, [(5, b"ab")]).encode()
    base = VersionRow(10, [(7, b"x"), (3, None), (1, b"")])
    want = VersionRow(12, [(10, b"yz"), (7, b"x"), (3, None), (1, b"")]).encode()
    assert push_newest(base.encode(), 10, b"yz", 12) == want
    # a zero-length tombstone at the same timestamp is replaced, not stacked
    tomb = VersionRow(10, [(10, None), (4, b"a")])
    assert (
        push_newest(tomb.encode(), 10, b"v", 15) == VersionRow(15, [(10, b"v"), (4, b"a")]).encode()
    )
