"""Random operation sequences: RocksDB store, in-memory store and a naive model agree,
including across reopen, inside batches (read-your-writes) and after aborted batches."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sessionstore import InMemorySessionStore, StateDB
from tests.models import SessionModel

# Keys chosen to trip prefix bugs: "a" vs "aa" vs "a\x00", and non-ASCII order.
KEYS = st.sampled_from(["", "a", "aa", "a\x00", "a\x00b", "b", "é", "\x00"])
OPT_KEYS = st.one_of(st.none(), KEYS)
TIMES = st.integers(min_value=-40, max_value=80)
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.binary(max_size=2))


class _Abort(Exception):
    pass


class SessionStoreMachine(RuleBasedStateMachine):
    @initialize(retention=st.sampled_from([1, 5, 20, 200]), interval=st.sampled_from([4, 9, 50]))
    def setup(self, retention, interval):
        self.dir = tempfile.mkdtemp()
        self.retention, self.interval = retention, interval
        self.db = StateDB.open(self.dir)
        self.rocks = self.db.session_store("s", retention, segment_interval_ms=interval)
        self.mem = InMemorySessionStore("s", retention, segment_interval_ms=interval)
        self.model = SessionModel(retention)
        self.dropped_before_open = 0  # dropped_records is a per-handle metric

    def teardown(self):
        if hasattr(self, "db"):
            self.db.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _put_all(self, key, start, end, value):
        self.rocks.put(key, start, end, value)
        self.mem.put(key, start, end, value)
        self.model.put(key, start, end, value)

    @rule(key=KEYS, start=TIMES, length=st.integers(0, 15), value=VALUES)
    def put(self, key, start, length, value):
        self._put_all(key, start, start + length, value)

    @rule(key=KEYS, start=TIMES, length=st.integers(0, 15))
    def remove(self, key, start, length):
        self.rocks.remove(key, start, start + length)
        self.mem.remove(key, start, start + length)
        self.model.put(key, start, start + length, None)

    @rule(key=KEYS, start=TIMES, length=st.integers(0, 15))
    def fetch_session(self, key, start, length):
        want = self.model.fetch_session(key, start, start + length)
        assert self.rocks.fetch_session(key, start, start + length) == want
        assert self.mem.fetch_session(key, start, start + length) == want

    @rule(key=KEYS, earliest_end=TIMES, latest_start=TIMES, backward=st.booleans())
    def find_sessions(self, key, earliest_end, latest_start, backward):
        want = self.model.find(key, key, earliest_end, latest_start, backward)
        assert list(self.rocks.find_sessions(key, earliest_end, latest_start, backward)) == want
        assert list(self.mem.find_sessions(key, earliest_end, latest_start, backward)) == want

    @rule(lo=OPT_KEYS, hi=OPT_KEYS, earliest_end=TIMES, latest_start=TIMES, backward=st.booleans())
    def find_in_range(self, lo, hi, earliest_end, latest_start, backward):
        want = self.model.find(lo, hi, earliest_end, latest_start, backward)
        got = list(self.rocks.find_sessions_in_range(lo, hi, earliest_end, latest_start, backward))
        assert got == want
        got = list(self.mem.find_sessions_in_range(lo, hi, earliest_end, latest_start, backward))
        assert got == want

    @rule(lo=OPT_KEYS, hi=OPT_KEYS, backward=st.booleans())
    def fetch_range(self, lo, hi, backward):
        want = self.model.find(lo, hi, -(2**63), 2**63 - 1, backward)
        assert list(self.rocks.fetch_range(lo, hi, backward)) == want
        assert list(self.mem.fetch_range(lo, hi, backward)) == want

    @precondition(lambda self: bool(self.model.rows))
    @rule(data=st.data(), backward=st.booleans(), ranged=st.booleans())
    def find_at_boundaries(self, data, backward, ranged):
        # Query exactly at an existing session's end and start: the inclusive bounds.
        key, start, end = data.draw(st.sampled_from(sorted(self.model.rows)))
        earliest_end = end + data.draw(st.integers(-1, 1))
        latest_start = start + data.draw(st.integers(-1, 1))
        if ranged:
            want = self.model.find(None, key, earliest_end, latest_start, backward)
            for store in (self.rocks, self.mem):
                got = store.find_sessions_in_range(None, key, earliest_end, latest_start, backward)
                assert list(got) == want
        else:
            want = self.model.find(key, key, earliest_end, latest_start, backward)
            for store in (self.rocks, self.mem):
                got = store.find_sessions(key, earliest_end, latest_start, backward)
                assert list(got) == want

    @rule()
    def reopen(self):
        self.db.close()
        self.db = StateDB.open(self.dir)
        self.rocks = self.db.session_store("s", self.retention)
        self.dropped_before_open = self.model.dropped

    @rule(
        ops=st.lists(st.tuples(KEYS, TIMES, st.integers(0, 15), VALUES), min_size=1, max_size=6),
        probe=KEYS,
    )
    def committed_batch(self, ops, probe):
        with self.db.batch():
            for key, start, length, value in ops:
                self._put_all(key, start, start + length, value)
                # reads inside the batch see its pending writes
                want = self.model.find(probe, probe, -(2**63), 2**63 - 1)
                assert list(self.rocks.fetch(probe)) == want
            want = self.model.find(None, None, -(2**63), 2**63 - 1, True)
            assert list(self.rocks.fetch_range(None, None, backward=True)) == want

    @rule(
        ops=st.lists(
            st.tuples(KEYS, TIMES, st.integers(0, 15), st.one_of(st.none(), VALUES)),
            min_size=1,
            max_size=8,
        )
    )
    def put_many(self, ops):
        rows = [(key, start, start + length, value) for key, start, length, value in ops]
        self.rocks.put_many(rows)
        self.mem.put_many(rows)
        for row in rows:
            self.model.put(*row)

    @rule(ops=st.lists(st.tuples(KEYS, TIMES, st.integers(0, 15), VALUES), min_size=1, max_size=6))
    def aborted_batch(self, ops):
        dropped_before = self.rocks.dropped_records
        try:
            with self.db.batch():
                for key, start, length, value in ops:
                    self.rocks.put(key, start, start + length, value)
                raise _Abort()
        except _Abort:
            pass
        # the drop counter is a metric of attempts; everything else is rolled back
        self.model.dropped += self.rocks.dropped_records - dropped_before
        self.mem.dropped_records += self.rocks.dropped_records - dropped_before

    @precondition(lambda self: hasattr(self, "db"))
    @invariant()
    def agree(self):
        assert self.rocks.observed_stream_time == self.model.stream_time
        assert self.mem.observed_stream_time == self.model.stream_time
        assert self.rocks.dropped_records == self.model.dropped - self.dropped_before_open
        assert self.mem.dropped_records == self.model.dropped
        # expired segments are really dropped: none lies wholly out of retention
        if self.model.stream_time is not None:
            first_live = self.model.min_visible() // self.interval
            assert all(seg >= first_live for seg in self.rocks.segment_ids())


SessionStoreMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
# a long property run: `make test` runs it, the fast suite leaves it out
TestSessionStores = pytest.mark.slow(SessionStoreMachine.TestCase)
