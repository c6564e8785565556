"""Random operation sequences: the RocksDB versioned store agrees with a naive model
(every version in a dict), including across reopen and after aborted batches; and
``get_versions`` agrees with ``get`` by brute force over small ranges."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sessionstore import StateDB
from tests.models import VersionedModel

KEYS = st.sampled_from(["k", "kk", ("k", 1)])
TIMES = st.integers(min_value=-10, max_value=40)
VALUES = st.one_of(st.none(), st.integers(0, 9), st.just(b""), st.just(""))


class _Abort(Exception):
    pass


class VersionedStoreMachine(RuleBasedStateMachine):
    @initialize(
        retention=st.sampled_from([0, 3, 10, 100]), interval=st.sampled_from([2, 5, 11, 1000])
    )
    def setup(self, retention, interval):
        self.dir = tempfile.mkdtemp()
        self.retention, self.interval = retention, interval
        self.db = StateDB.open(self.dir)
        self.store = self.db.versioned_store("v", retention, segment_interval_ms=interval)
        self.model = VersionedModel(retention)
        self.dropped_base = 0

    def teardown(self):
        if hasattr(self, "db"):
            self.db.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _times(self, data):
        # Mostly near existing versions, so that equal timestamps and bounds are hit.
        known = sorted({t for tl in self.model.versions.values() for t in tl})
        if known and data.draw(st.booleans()):
            return data.draw(st.sampled_from(known)) + data.draw(st.integers(-1, 1))
        return data.draw(TIMES)

    @rule(key=KEYS, value=VALUES, data=st.data())
    def put(self, key, value, data):
        ts = self._times(data)
        assert self.store.put(key, value, ts) == self.model.put(key, value, ts)

    @rule(key=KEYS, data=st.data())
    def delete(self, key, data):
        ts = self._times(data)
        assert self.store.delete(key, ts) == self.model.delete(key, ts)

    @rule(key=KEYS, data=st.data(), latest=st.booleans())
    def get(self, key, data, latest):
        as_of = None if latest else self._times(data)
        assert self.store.get(key, as_of) == self.model.get(key, as_of)

    @rule(
        key=KEYS,
        data=st.data(),
        ascending=st.booleans(),
        open_lo=st.booleans(),
        open_hi=st.booleans(),
    )
    def get_versions(self, key, data, ascending, open_lo, open_hi):
        lo = None if open_lo else self._times(data)
        hi = None if open_hi else self._times(data)
        want = self.model.get_versions(key, lo, hi, ascending)
        assert self.store.get_versions(key, lo, hi, ascending) == want

    @rule()
    def reopen(self):
        self.db.close()
        self.db = StateDB.open(self.dir)
        self.store = self.db.versioned_store("v", self.retention)
        self.dropped_base = self.model.dropped

    @rule(ops=st.lists(st.tuples(KEYS, VALUES, TIMES), min_size=1, max_size=5))
    def aborted_batch(self, ops):
        before = self.store.dropped_records
        try:
            with self.db.batch():
                for key, value, ts in ops:
                    self.store.put(key, value, ts)
                raise _Abort()
        except _Abort:
            pass
        self.model.dropped += self.store.dropped_records - before

    @rule(ops=st.lists(st.tuples(KEYS, VALUES, TIMES), min_size=1, max_size=5))
    def committed_batch(self, ops):
        with self.db.batch():
            for key, value, ts in ops:
                assert self.store.put(key, value, ts) == self.model.put(key, value, ts)
                assert self.store.get(key) == self.model.get(key)

    @precondition(lambda self: hasattr(self, "store"))
    @invariant()
    def agree(self):
        assert self.store.observed_stream_time == self.model.stream_time
        assert self.store.dropped_records == self.model.dropped - self.dropped_base
        if self.model.stream_time is not None:
            first_live = (self.model.floor() + 1) // self.interval
            assert all(seg >= first_live for seg in self.store.segment_ids())


VersionedStoreMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=35, deadline=None
)
# a long property run: `make test` runs it, the fast suite leaves it out
TestVersionedStore = pytest.mark.slow(VersionedStoreMachine.TestCase)


# Few keys and a narrow span of times, so that versions often straddle the retention
# floor. Below LOW every get answers None; from HIGH on, the latest version or None.
NEAR_KEY_LIST = ["k", ("k", 1)]
NEAR_KEYS = st.sampled_from(NEAR_KEY_LIST)
LOW, HIGH = -3, 20
NEAR_TIMES = st.integers(LOW, HIGH)


class VersionsAgreeWithGet(RuleBasedStateMachine):
    """``get_versions(key, a, b)`` is exactly the distinct versions ``get(key, t)``
    returns for some t in ``[a, b]`` (issue 14), whatever writes and reopens came
    before. Checked by brute force: ``get`` at every t of the range."""

    @initialize(retention=st.sampled_from([1, 3, 8]), interval=st.sampled_from([2, 5, 1000]))
    def setup(self, retention, interval):
        self.dir = tempfile.mkdtemp()
        self.retention = retention
        self.db = StateDB.open(self.dir)
        self.store = self.db.versioned_store("v", retention, segment_interval_ms=interval)

    def teardown(self):
        if hasattr(self, "db"):
            self.db.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(key=NEAR_KEYS, value=VALUES, ts=NEAR_TIMES)
    def put(self, key, value, ts):
        self.store.put(key, value, ts)

    @rule(key=NEAR_KEYS, ts=NEAR_TIMES)
    def delete(self, key, ts):
        self.store.delete(key, ts)

    @rule()
    def reopen(self):
        self.db.close()
        self.db = StateDB.open(self.dir)
        self.store = self.db.versioned_store("v", self.retention)

    @rule(ascending=st.booleans())
    def get_versions(self, ascending):
        for key in NEAR_KEY_LIST:
            self._check_ranges(key, ascending)

    def _check_ranges(self, key, ascending):
        store = self.store
        at = {t: store.get(key, t) for t in range(LOW - 1, HIGH + 1)}
        # every range [lo, hi] inside [LOW - 1, HIGH], and each end left open
        ends = [None, *range(LOW - 1, HIGH + 1)]
        for lo in ends:
            found: dict = {}
            t = LOW - 1 if lo is None else lo
            for hi in [*ends[1:], None]:
                if lo is not None and hi is not None and hi < lo:
                    continue
                while t <= (HIGH if hi is None else hi):
                    if at[t] is not None:  # one version per timestamp
                        assert found.setdefault(at[t].timestamp, at[t]) == at[t]
                    t += 1
                want = sorted(found.values(), key=lambda r: r.timestamp, reverse=not ascending)
                assert store.get_versions(key, lo, hi, ascending) == want, (key, lo, hi)


VersionsAgreeWithGet.TestCase.settings = settings(
    max_examples=100, stateful_step_count=25, deadline=None
)
# a long property run: `make test` runs it, the fast suite leaves it out
TestVersionsAgreeWithGet = pytest.mark.slow(VersionsAgreeWithGet.TestCase)
