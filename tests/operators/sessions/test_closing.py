"""Sessions kept apart to close at the next advance (stores/closing.py).

A RocksDB session store keeps the sessions a batch passes that are certain to
close at the next advance in ``<store>.closing``, in blocks of sessions, instead
of a segment row and an end-index entry each. The model is the per-session path itself: an
in-memory store keeps none apart. The property test runs a stream through
partitioned RocksDB stores behind the checkpoint provider (a commit per batch, as
Spark's tasks do), with a restore from checkpoint and changelog and a repartition
between batches, and holds every batch's output, and every stored session the
reader shows, equal to one in-memory aggregator's.
"""

from __future__ import annotations

import re
from collections import Counter

import msgpack
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, StateDB, StateStoreProvider, StoreSpec
from sessionstore.checkpoint.offline.repartition import repartition_checkpoint
from sessionstore.encoding.session_key import encode_times
from sessionstore.encoding.spark_hash import partition_ids
from sessionstore.errors import SessionStoreError
from sessionstore.operators import SessionWindowAggregator, SessionWindows
from sessionstore.stores import closing as closing_module
from sessionstore.stores.session import SessionStore
from sessionstore.tools.reader import CheckpointSource, store_rows
from tests.operators.sessions.records import kv_table

KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f"])
ROW = st.tuples(KEYS, st.integers(0, 80), st.integers(0, 9))
STREAM = st.lists(st.lists(ROW, max_size=25), min_size=2, max_size=7)
AGGS = {"n": "count", "total": ("sum", "v"), "avg": ("avg", "v"), "last": ("last", "v")}
OP = "op"


def _value(value):
    return None if value is None else tuple(sorted((k, repr(v)) for k, v in value.items()))


def _aggregator(store, windows, emit):
    return SessionWindowAggregator(
        store, windows, aggregations=AGGS, emit=emit, closes_on="advance"
    )


def _batch_out(agg, shared, rows, emit, path):
    """What one partition emits in a micro-batch, as the Spark task runs it."""
    out = []
    if shared is not None:
        closed = agg.advance_to(shared)
        # in the end index's order, as the per-session path emits them
        order = [(u.end, u.start, agg.store.encode_key(u.key)) for u in closed]
        assert order == sorted(order)
        out += [(u.key, u.start, u.end, _value(u.value)) for u in closed]
    if rows:
        rows = sorted(rows, key=lambda r: r[1])
        if path == "rows":
            ups = agg.process_rows(
                [r[0] for r in rows], [r[1] for r in rows], [{"v": r[2]} for r in rows],
                net=emit == "update",
            )  # fmt: skip
            out += [(u.key, u.start, u.end, _value(u.value)) for u in ups]
        else:
            table = agg.process_batch(kv_table(rows), "key", "ts", ["v"], net=emit == "update")
            out += [(r["key"], r["start"], r["end"], _value(r["value"])) for r in table.to_pylist()]
    return out


def _visible(rows):
    return sorted((r["key"], r["start"], r["end"], repr(r["value"])) for r in rows)


def run_model(stream, windows, emit, skip=()):
    """Every batch's output and stored sessions from one in-memory aggregator (no
    sessions kept apart: the per-session path). Batches numbered in ``skip`` start
    without an advance."""
    agg = _aggregator(InMemorySessionStore("m", windows.retention_ms), windows, emit)
    outs, states = [], []
    for n, rows in enumerate(stream):
        shared = None if n in skip else agg.stream_time
        outs.append(Counter(_batch_out(agg, shared, rows, emit, "rows")))
        states.append(_visible(agg.store.read_rows()))
    return outs, states


class Partitioned:
    """The stream's keys over partitions, each a provider-backed RocksDB store."""

    def __init__(self, tmp, windows, emit, parts):
        self.tmp, self.windows, self.emit = tmp, windows, emit
        self.uri, self.parts, self.opened = f"file://{tmp}/ck0", parts, 0
        self.spec = StoreSpec("sessions", "session", windows.retention_ms)
        self.kept = 0  # sessions found kept apart after a batch
        self._open()

    def _open(self):
        self.opened += 1
        self.providers = [
            StateStoreProvider(
                self.uri,
                OP,
                p,
                [self.spec],
                str(self.tmp / f"local{self.opened}"),
                num_partitions=self.parts,
                key_types=["string"],
            )  # fmt: skip
            for p in range(self.parts)
        ]

    def close(self):
        for provider in self.providers:
            provider.close()

    def restore(self):
        """New providers on a new local folder: every partition loads its version
        from the checkpoint (snapshot and changelogs)."""
        self.close()
        self._open()

    def repartition(self, version, parts):
        self.close()
        target = f"file://{self.tmp}/ck{self.opened}"
        repartition_checkpoint(self.uri, OP, parts, target, version)
        self.uri, self.parts = target, parts
        self._open()

    def batch(self, version, shared, rows, path):
        owner = partition_ids([[r[0] for r in rows]], ["string"], self.parts).tolist()
        out, visible, times = [], [], []
        for p, provider in enumerate(self.providers):
            handle = provider.get_store(version)
            agg = _aggregator(handle["sessions"], self.windows, self.emit)
            mine = [r for r, o in zip(rows, owner, strict=True) if o == p]
            out += _batch_out(agg, shared, mine, self.emit, path)
            visible += handle["sessions"].read_rows()
            if agg.state.closing is not None:
                self.kept += len(agg.state.closing.all())
            if agg.stream_time is not None:
                handle.note_event_time(agg.stream_time)
                times.append(agg.stream_time)
            handle.commit()
        return (
            Counter(out),
            _visible(visible),
            max([*times, shared or times[0]]) if times else shared,
        )


def run_partitioned(tmp, stream, windows, emit, path, restore_at, rescale_at, skip=()):
    system = Partitioned(tmp, windows, emit, 2)
    outs, states, shared = [], [], None
    try:
        for version, rows in enumerate(stream):
            if version == restore_at:
                system.restore()
            if version == rescale_at:
                system.repartition(version, 3)
            advance = None if version in skip else shared
            out, visible, noted = system.batch(version, advance, rows, path)
            # the shared event time never goes back: a rescale carries it to the new
            # partitions (event_time.py), whose stores' times are their sources' least
            known = [t for t in (shared, noted) if t is not None]
            shared = max(known) if known else None
            outs.append(out)
            states.append(visible)
    finally:
        system.close()
    return outs, states, system.kept


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    stream=STREAM,
    gap=st.integers(0, 12),
    grace=st.integers(0, 8),
    emit=st.sampled_from(["final", "update"]),
    path=st.sampled_from(["rows", "table"]),
    restore_at=st.integers(1, 6),
    rescale_at=st.integers(1, 6),
    skip=st.sets(st.integers(1, 6), max_size=2),
)
# a rescale in a batch without an advance: the next advance is to the carried time
@example(stream=[[("a", 0, 0), ("b", 1, 0)], [], []], gap=0, grace=0, emit="final",
         path="rows", restore_at=1, rescale_at=1, skip={1})  # fmt: skip
def test_kept_apart_sessions_equal_the_per_session_path(
    tmp_path_factory, stream, gap, grace, emit, path, restore_at, rescale_at, skip
):
    """Batch by batch, the output and the stored sessions (as the reader shows them)
    equal the model's, through a restore and a repartition between batches, and
    with batches that start without an advance (their rows meet the kept sessions)."""
    windows = SessionWindows(gap, grace)
    # later batches mostly later, as a stream's are (rows may still be late)
    stream = [[(k, t + 40 * n, v) for k, t, v in rows] for n, rows in enumerate(stream)]
    tmp = tmp_path_factory.mktemp("closing")
    outs, states, _ = run_partitioned(
        tmp, stream, windows, emit, path, restore_at, rescale_at, skip
    )
    assert (outs, states) == run_model(stream, windows, emit, skip)


#: two sessions per key and batch: the first ends well before the batch's own close
STEADY = [[(k, 100 * n + t, t) for t in (0, 7, 14, 60, 67, 74) for k in "abcdef"] for n in range(6)]


@pytest.mark.parametrize("path", ["rows", "table"])
def test_a_steady_stream_keeps_its_passed_sessions_apart_and_emits_them_the_same(tmp_path, path):
    """Sessions a batch passes are kept apart (not in the segments and end index),
    through a restore and a repartition, and the output stays the model's."""
    windows = SessionWindows(10, 5)
    outs, states, kept = run_partitioned(tmp_path, STEADY, windows, "final", path, 2, 4)
    assert kept > 0
    assert (outs, states) == run_model(STEADY, windows, "final")


def test_the_reader_shows_kept_sessions_and_rows_before_an_advance_merge_them(tmp_path):
    """A committed version holding kept-apart sessions: ``dump`` shows each as the
    stored session it is; rows processed without an advance first put them back
    into the segments and the end index, and merge with them as before."""
    windows = SessionWindows(10, 0)
    spec = StoreSpec("sessions", "session", windows.retention_ms)
    uri = f"file://{tmp_path}/ck"
    provider = StateStoreProvider(uri, OP, 0, [spec], str(tmp_path / "l"), key_types=["string"])
    handle = provider.get_store(0)
    agg = _aggregator(handle["sessions"], windows, "final")
    agg.advance_to(0)
    agg.process_rows(["a", "a", "b"], [1, 3, 100], [{"v": 1}, {"v": 2}, {"v": 3}])
    assert [e[:3] for e in agg.state.closing.all()] == [(3, 1, handle["sessions"].encode_key("a"))]
    handle.note_event_time(agg.stream_time)
    handle.commit()
    provider.close()
    shown = [
        (r["key"], r["start"], r["end"], r["value"])
        for r in store_rows(CheckpointSource(uri), OP, "sessions")
    ]
    assert shown == [
        ("a", 1, 3, {"n": 2, "total": 3, "avg": 1.5, "last": 2}),
        ("b", 100, 100, {"n": 1, "total": 3, "avg": 3.0, "last": 3}),
    ]
    provider = StateStoreProvider(uri, OP, 0, [spec], str(tmp_path / "l2"), key_types=["string"])
    handle = provider.get_store(1)
    agg = _aggregator(handle["sessions"], windows, "final")
    # no advance: the judged time is still 0, so a row at 12 merges with [1, 3]
    assert agg.process_rows(["a"], [12], [{"v": 5}]) == []
    store = handle["sessions"]
    # the merged session is itself certain to close (12 < 100 - 10): kept apart
    assert [e[:3] for e in agg.state.closing.all()] == [(12, 1, store.encode_key("a"))]
    assert [(r["start"], r["end"]) for r in store.read_rows(key="a")] == [(1, 12)]
    ups = agg.advance_to(200)
    assert [(u.key, u.start, u.end, u.value["n"]) for u in ups] == [
        ("a", 1, 12, 3),
        ("b", 100, 100, 1),
    ]
    handle.abort()
    provider.close()


def test_a_checkpoint_written_without_kept_sessions_loads_and_continues(tmp_path, monkeypatch):
    """State as the per-session path leaves it (every passed session a segment row
    and an end-index entry, no ``closing`` family), loaded by this code: it
    continues exactly as the model, and keeps sessions apart from then on."""
    windows = SessionWindows(10, 5)
    with monkeypatch.context() as m:  # the per-session layout, as written before
        m.setattr(SessionStore, "closing_sessions", lambda self, create=True: None)
        first = run_partitioned(tmp_path / "a", STEADY[:3], windows, "final", "table", 99, 99)
    assert first[2] == 0
    system = Partitioned(tmp_path / "a", windows, "final", 2)
    outs, states = list(first[0]), list(first[1])
    shared = 100 * 2 + 74
    try:
        for version in range(3, 6):
            out, visible, shared = system.batch(version, shared, STEADY[version], "table")
            outs.append(out)
            states.append(visible)
    finally:
        system.close()
    assert system.kept > 0
    assert (outs, states) == run_model(STEADY, windows, "final")


@pytest.mark.parametrize("emit, closes_on", [("update", "advance"), ("final", "record")])
def test_an_aggregator_that_keeps_none_apart_puts_kept_sessions_back(tmp_path, emit, closes_on):
    """The same store opened in a mode that keeps nothing apart (update mode, or
    closing on each record) finds the kept sessions where the per-session path
    leaves them: in the segments (and the end index, in final mode)."""
    windows = SessionWindows(10, 0)
    spec = StoreSpec("sessions", "session", windows.retention_ms)
    provider = StateStoreProvider(f"file://{tmp_path}/ck", OP, 0, [spec], str(tmp_path / "l"))
    handle = provider.get_store(0)
    agg = _aggregator(handle["sessions"], windows, "final")
    agg.advance_to(0)
    agg.process_batch(kv_table([("a", 1, 1), ("a", 3, 2), ("b", 100, 3)]), "key", "ts", ["v"])
    handle.commit()
    handle = provider.get_store(1)
    store = handle["sessions"]
    other = SessionWindowAggregator(
        store, windows, aggregations=AGGS, emit=emit, closes_on=closes_on
    )
    assert other.state.closing.all() == []
    assert [(w.start, w.end) for w, _ in store.find_sessions("a", 0, 100)] == [(1, 3)]
    if emit == "final":
        kb = store.encode_key("a")
        assert (3, 1, kb) in other.state.index.all()
    handle.abort()
    provider.close()


def test_the_closing_block_format_is_the_documented_one(tmp_path):
    """A keep writes one block row (stores/closing.py's example, byte for byte);
    a repartition splits it into the documented session rows; both read back in
    (end, start, key) order, negative times included."""
    with StateDB.open(str(tmp_path / "db")) as db:
        store = db.session_store("s", 100)
        closing = store.closing_sessions()
        a = store.encode_key("a")
        with db.batch():
            closing.add_many([a], [1000], [5000], [b"\x91\x02"])
        doc = "95 01 c4 08 88 13 00 00 00 00 00 00 c4 08 e8 03 00 00 00 00 00 00 91 c4 04"
        doc += " 02 61 00 01 91 c4 02 91 02"
        assert db.scan_list("s.closing") == [(bytes(16), bytes.fromhex(doc.replace(" ", "")))]
        assert SessionStore.row_splitter("closing")(
            bytes(16), bytes.fromhex(doc.replace(" ", ""))
        ) == [
            (
                bytes.fromhex("8000000000001388 80000000000003e8 02610001".replace(" ", "")),
                b"\x91\x02",
            )
        ]
        with db.batch():
            assert closing.take_all() == [(5000, 1000, a, b"\x91\x02")]
        assert db.scan_list("s.closing") == [] and not closing.any()
        kbs = [store.encode_key(k) for k in ("a", "b", "a")]
        with db.batch():
            closing.add_many(kbs, [1000, -7, -9], [5000, -3, -3], [b"\x91\x02", b"x", b"y"])
        b = kbs[1]
        expected = [(-3, -9, a, b"y"), (-3, -7, b, b"x"), (5000, 1000, a, b"\x91\x02")]
        assert closing.all() == expected
        rows = db.scan_list("s.closing")
        assert len(rows) == 1
        split = SessionStore.row_splitter("closing")(*rows[0])
        assert [(raw[16:], value) for raw, value in split] == [
            (a, b"y"),
            (b, b"x"),
            (a, b"\x91\x02"),
        ]
        with db.batch():
            assert closing.take_all() == expected
        assert closing.all() == [] and not closing.any()


def test_blocks_and_session_rows_read_as_one_list_and_a_second_keep_adds_blocks(
    tmp_path, monkeypatch
):
    """Session rows (a repartition's), several blocks (a keep larger than a block,
    and a second keep before a take) read as one list in (end, start, key) order;
    no keep overwrites a block, and a take forgets every row."""
    monkeypatch.setattr(closing_module, "BLOCK_SESSIONS", 2)
    with StateDB.open(str(tmp_path / "db")) as db:
        store = db.session_store("s", 100)
        closing = store.closing_sessions()
        a, b, c = (store.encode_key(k) for k in "abc")
        with db.batch():
            closing.add_many([c, a, b], [5, 1, 1], [9, 4, 4], [b"c1", b"a1", b"b1"])
            closing.add_many([a, c], [20, 0], [30, 2], [b"a2", b"c0"])
            # as a repartition writes them: one row per session
            for kb, start, end, vb in [(b, 10, 12, b"b2"), (c, 40, 41, b"c3")]:
                db.put("s.closing", encode_times(start, end) + kb, vb)
        rows = db.scan_list("s.closing")
        assert [raw for raw, _ in rows if len(raw) == 16] == [
            bytes(15) + bytes([i]) for i in range(3)
        ]
        expected = [
            (2, 0, c, b"c0"), (4, 1, a, b"a1"), (4, 1, b, b"b1"), (9, 5, c, b"c1"),
            (12, 10, b, b"b2"), (30, 20, a, b"a2"), (41, 40, c, b"c3"),
        ]  # fmt: skip
        assert closing.all() == expected
        with db.batch():
            assert closing.take_all() == expected
        assert db.scan_list("s.closing") == [] and not closing.any()


def _block(entries):
    """A block's value holding ``(end, start, encoded key)`` entries as given."""
    ends = np.array([e[0] for e in entries], "<i8").tobytes()
    starts = np.array([e[1] for e in entries], "<i8").tobytes()
    return msgpack.packb([1, ends, starts, [e[2] for e in entries], [b"v"] * len(entries)])


@pytest.mark.parametrize(
    "value, why",
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb([2, b"", b"", [], []]), "expected [1, ends, starts, keys, values]"),
        (msgpack.packb({"a": 1}), "expected [1, ends, starts, keys, values]"),
        (msgpack.packb([1, bytes(8), bytes(16), [b"k"], [b"v"]]), "differ in length or type"),
        (msgpack.packb([1, bytes(8), bytes(8), [b""], [b"v"]]), "a key or value is not bytes"),
        (msgpack.packb([1, bytes(8), bytes(8), [b"k"], ["v"]]), "a key or value is not bytes"),
        (msgpack.packb([True, b"", b"", [], []]), "expected [1, ends, starts, keys, values]"),
        (b"\x81\x91\x01\x01", "not msgpack"),  # a map keyed by a list
        # out of (end, start, key) order, and a session twice: never emitted so
        (_block([(5, 1, b"\x02a\x00\x01"), (4, 1, b"\x02b\x00\x01")]), "session 1 does not follow"),
        (_block([(4, 2, b"\x02a\x00\x01"), (4, 1, b"\x02b\x00\x01")]), "session 1 does not follow"),
        (_block([(4, 1, b"\x02b\x00\x01"), (4, 1, b"\x02a\x00\x01")]), "session 1 does not follow"),
        (_block([(4, 1, b"\x02a\x00\x01")] * 2), "session 1 does not follow"),
    ],
)
def test_a_damaged_or_foreign_block_is_refused_by_name(tmp_path, value, why):
    """A block row this code did not write fails every reader and a repartition
    with an error naming the family, the row and what is wrong; nothing committed
    changes."""
    with StateDB.open(str(tmp_path / "db")) as db:
        store = db.session_store("s", 100)
        closing = store.closing_sessions()
        db.put("s.closing", bytes(16), value)
        for read in (closing.all, closing.take_all):
            with pytest.raises(
                SessionStoreError, match=rf"s\.closing: the closing block 0+ .*{re.escape(why)}"
            ):
                with db.batch():
                    read()
        with pytest.raises(SessionStoreError, match=re.escape(why)):
            SessionStore.row_splitter("closing")(bytes(16), value)
        assert db.scan_list("s.closing") == [(bytes(16), value)]


def test_a_row_of_neither_kind_and_a_session_kept_twice_are_refused_by_name(tmp_path):
    """A 16-byte key without the block tag, a key too short for a session, and one
    session in a block and in a session row: every reader stops, naming the row."""
    block = _block([(4, 1, b"\x02a\x00\x01")])
    for raw, value, message in [
        (b"\x01" * 16, block, "the row (?:01)+ is neither a closing block"),
        (b"\x80" * 9, b"v", "the row (?:80)+ is neither a closing block"),
    ]:
        with StateDB.open(str(tmp_path / f"db{len(raw)}")) as db:
            store = db.session_store("s", 100)
            closing = store.closing_sessions()
            db.put("s.closing", raw, value)
            for read in (closing.all, closing.take_all):
                with pytest.raises(SessionStoreError, match=rf"s\.closing: {message}"):
                    with db.batch():
                        read()
            with pytest.raises(SessionStoreError, match="is neither a closing block"):
                SessionStore.row_splitter("closing")(raw, value)
    with StateDB.open(str(tmp_path / "twice")) as db:
        store = db.session_store("s", 100)
        closing = store.closing_sessions()
        db.put("s.closing", bytes(16), block)
        db.put("s.closing", encode_times(1, 4) + b"\x02a\x00\x01", b"v")
        with pytest.raises(
            SessionStoreError, match=r"s\.closing: the session \(4, 1, .*kept twice"
        ):
            closing.all()


def test_a_value_that_is_not_bytes_is_refused_before_anything_is_written(tmp_path):
    """A value serde that gives no bytes fails the keep, naming the value; the batch
    holds nothing of it."""
    with StateDB.open(str(tmp_path / "db")) as db:
        store = db.session_store("s", 100)
        closing = store.closing_sessions()
        a = store.encode_key("a")
        for values in (["text"], [bytearray(b"v")], [b"v", b"w"]):
            with pytest.raises(
                TypeError, match=r"s\.closing: a kept session's value must be bytes"
            ):
                with db.batch():
                    closing.add_many([a], [1], [2], values)
            assert closing.all() == [] and not closing.any()


def test_a_take_then_a_keep_in_one_batch_write_the_new_block_alone(tmp_path):
    """As a batch does: the advance takes the kept sessions (deleting their block),
    the rows keep new ones under the same block key; what commits is the new block."""
    with StateDB.open(str(tmp_path / "db")) as db:
        store = db.session_store("s", 100)
        closing = store.closing_sessions()
        a, b = store.encode_key("a"), store.encode_key("b")
        with db.batch():
            closing.add_many([a], [1], [2], [b"old"])
        with db.batch():
            assert closing.take_all() == [(2, 1, a, b"old")]
            closing.add_many([b], [5], [9], [b"new"])
        assert [raw for raw, _ in db.scan_list("s.closing")] == [bytes(16)]
        assert closing.all() == [(9, 5, b, b"new")]
        try:
            with db.batch():  # a failing batch after a take and a keep leaves both out
                closing.take_all()
                closing.add_many([a], [20], [30], [b"newer"])
                raise RuntimeError("the task fails")
        except RuntimeError:
            pass
        assert closing.all() == [(9, 5, b, b"new")]
