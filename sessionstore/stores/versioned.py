"""Versioned key-value store (KIP-889): several versions per key, ``get(key, as_of)``.

Layout (see :mod:`sessionstore.encoding.versioned_row`): the latest version of each key lives
in the ``<store>.latest`` family; older versions live in history segments chosen by
their ``valid_to``, one row per key and segment. Each row holds a contiguous run of
the key's versions, because ``valid_to`` grows with ``valid_from``.

Rules (see README "Versioned stores"):

* A version is valid from its timestamp (inclusive) to the next version's timestamp
  (exclusive). Tombstones (``None`` values) are versions: ``get`` never returns one,
  but they end the validity of the version before them.
* History retention doubles as the grace period: a put or delete with
  ``timestamp < stream_time - history_retention_ms`` is rejected and counted.
* ``get(key, as_of)`` is inclusive. When ``as_of < stream_time - history_retention_ms``
  only the latest version may answer (``grace_floor``). ``get_versions(key, a, b)``
  returns exactly the distinct versions ``get(key, t)`` returns for ``t`` in ``[a, b]``.
* :meth:`VersionedStore.stream_time_held` judges the writes and reads of a block
  against the stream time at its start, and moves it to the latest write at its
  end. The temporal join holds it for a micro-batch: writes in time order then
  meet the same rule as if each had moved it (a write at ``ts`` is refused when
  ``ts < held - history_retention_ms`` either way), and reads between them see the
  history the time order would have kept, whatever else the partition holds.

Two places where we deliberately do better than Kafka 3.x:

* ``get_versions`` reads every segment that may hold a version overlapping the
  query range, so a version whose ``valid_to`` lies in a later segment is found.
* A tombstone at exactly the latest version's timestamp is written to history as a
  zero-length version, so a later out-of-order put still sees that it is bounded.

A tombstone that becomes the newest version is stored the same way: as the top
entry of the history row of its own timestamp, with ``valid_to == valid_from``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sessionstore.encoding.keys import TS_MAX, TS_MIN, check_timestamp, key_range
from sessionstore.encoding.versioned_row import (
    LATEST_TS,
    VersionRow,
    decode_latest,
    encode_latest,
    lookup,
    push_newest,
)
from sessionstore.stores.base import SegmentedDBStore, describe_store
from sessionstore.stores.records import PUT_REJECTED, VALID_TO_UNDEFINED, VersionedRecord

if TYPE_CHECKING:
    from sessionstore.engine.db import Database

__all__ = ["VersionedStore"]


def _check_history(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(
            f"history_retention_ms must be a non-negative int of milliseconds, got {value!r}"
        )
    return value


class VersionedStore(SegmentedDBStore):
    """Versioned store in a :class:`~sessionstore.stores.state_db.StateDB`.

    Create it with ``db.versioned_store(name, history_retention_ms, ...)``.
    """

    kind = "versioned"
    #: Layout fields (fixed for the store's life) beyond the common arguments.
    layout: tuple[str, ...] = ()
    #: Time filters :meth:`read_rows` takes.
    row_filters: frozenset[str] = frozenset({"from_ts", "to_ts", "as_of"})
    #: Fields of :meth:`read_rows`' rows that are event times (epoch ms).
    time_columns: tuple[str, ...] = ("valid_from", "valid_to")

    def __init__(
        self,
        db: Database,
        name: str,
        history_retention_ms: int,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> None:
        self._init_timed(name, history_retention_ms, segment_interval_ms, key_serde, value_serde)
        self._attach(db, segment_interval_ms)
        self._latest = f"{name}.latest"
        db.create_column_family(self._latest)
        if self._stream_time is not None:
            self._segments.expire_below(self._min_live())
        #: while :meth:`stream_time_held`: the latest timestamp written (else None)
        self._holding = False
        self._held_to: int | None = None

    @classmethod
    def row_key(cls, family: str, raw: bytes) -> bytes:
        """The encoded user key of a raw row of this store's family (``latest`` or a
        history segment): the row key itself. What a repartition routes by."""
        return raw

    def spec(self) -> dict[str, Any]:
        return describe_store(
            self.kind,
            self.history_retention_ms,
            self.segment_interval_ms,
            self.key_serde,
            self.value_serde,
        )

    def _set_retention(self, retention_ms: int) -> None:
        self.history_retention_ms = _check_history(retention_ms)

    def grace_floor(self) -> int:
        """Oldest timestamp still accepted, and oldest ``as_of`` history can answer
        (older ones see only the latest version). The one rule ``get``,
        ``get_versions`` and the temporal join's drops share."""
        st = self._stream_time
        return TS_MIN if st is None else max(TS_MIN, st - self.history_retention_ms)

    def _min_live(self) -> int:
        # A history version with valid_to <= floor can never answer a valid query.
        return self.grace_floor() + 1

    def _live_from(self, stream_time: int) -> int:
        return max(TS_MIN, stream_time - self.history_retention_ms) + 1

    def _expire(self, min_live: int) -> None:
        self._segments.expire_below(min_live)

    @contextmanager
    def stream_time_held(self) -> Iterator[None]:
        """Writes and reads in the block are judged against the stream time at its
        start (nothing expires); at its end the time moves to the latest timestamp
        written, if later (see the module doc)."""
        self._holding, self._held_to = True, None
        try:
            yield
        finally:
            self._holding, latest = False, self._held_to
            self._held_to = None
            if latest is not None:
                self.advance_stream_time(latest)

    def _later(self, ts: int) -> None:
        """A write at ``ts``, later than the stream time: move it, or note it."""
        if self._holding:
            if self._held_to is None or ts > self._held_to:
                self._held_to = ts
        else:
            self._advance(ts)

    # --------------------------------------------------------------------- writes
    def put(self, key: Any, value: Any, timestamp: int) -> int:
        """Add a version; ``None`` is a tombstone.

        Returns the version's ``valid_to`` if it went to history,
        ``VALID_TO_UNDEFINED`` (-1) if it is the newest version, or ``PUT_REJECTED``
        if it is older than the grace period.
        """
        kb = self.encode_key(key)
        ts = check_timestamp("timestamp", timestamp)
        if ts < self.grace_floor():
            self.dropped_records += 1
            return PUT_REJECTED
        vb = None if value is None else self._dumps(value)
        st = self._stream_time
        if self._db.in_batch:  # skip the context manager on the hot path
            if st is None or ts > st:
                self._later(ts)
            return self._put(kb, vb, ts)
        with self._db.batch():
            if st is None or ts > st:
                self._later(ts)
            return self._put(kb, vb, ts)

    def delete(self, key: Any, timestamp: int) -> VersionedRecord | None:
        """Put a tombstone at ``timestamp``; return the version valid just before it."""
        kb = self.encode_key(key)
        ts = check_timestamp("timestamp", timestamp)
        if ts < self.grace_floor():
            self.dropped_records += 1
            return None
        with self._db.batch():
            prior = self.get(key, ts)
            if self._stream_time is None or ts > self._stream_time:
                self._later(ts)
            self._put(kb, None, ts)
        return prior

    def _put(self, kb: bytes, vb: bytes | None, ts: int) -> int:
        db, latest_cf = self._db, self._latest
        raw_latest = db.get(latest_cf, kb)
        latest_ts = None
        if raw_latest is not None:
            latest_ts, latest_value = decode_latest(raw_latest)
            if ts >= latest_ts:
                if ts > latest_ts:  # the old latest becomes history, valid until ts
                    self._push_top(kb, latest_ts, latest_value, valid_to=ts)
                # a latest value means no newest tombstone exists to replace
                self._set_newest(kb, vb, ts, had_latest=True)
                return VALID_TO_UNDEFINED
        found = self._row_valid_after(kb, ts)
        if found is None:
            if latest_ts is not None:  # only the latest version is after ts
                self._push_top(kb, ts, vb, valid_to=latest_ts)
                return latest_ts
            self._set_newest(kb, vb, ts)
            return VALID_TO_UNDEFINED
        seg, row = found
        i = row.first_valid_after(ts)
        from_ts = row.entries[i][0]
        valid_to = row.valid_to(i)
        if from_ts == ts:  # same timestamp: replace the version
            row.entries[i] = (ts, vb)
            self._write_row(seg, kb, row)
            return valid_to
        if from_ts < ts:  # split the version that covers ts
            row.entries.insert(i, (ts, vb))
            if i + 1 == len(row.entries) - 1 and self._segments.segment_id(ts) < seg:
                # the split version now ends at ts, which belongs to an earlier segment
                moved_ts, moved_value = row.entries.pop()
                self._push_top(kb, moved_ts, moved_value, valid_to=ts)
            self._write_row(seg, kb, row)
            return valid_to
        # ts precedes every version still known: it is valid until the oldest of them
        if self._segments.segment_id(from_ts) == seg:
            row.entries.append((ts, vb))
            self._write_row(seg, kb, row)
        else:
            self._push_top(kb, ts, vb, valid_to=from_ts)
        return from_ts

    def _set_newest(self, kb: bytes, vb: bytes | None, ts: int, had_latest: bool = False) -> None:
        """Make ``(ts, vb)`` the newest version, replacing one at the same ts."""
        if vb is not None:
            if not had_latest:
                self._drop_degenerate(kb, ts)
            self._db.put(self._latest, kb, encode_latest(ts, vb))
        else:
            self._db.delete(self._latest, kb)
            self._push_top(kb, ts, None, valid_to=ts)

    def _drop_degenerate(self, kb: bytes, ts: int) -> None:
        # A newest tombstone at exactly ts is replaced by the value put at ts.
        seg = self._segments.segment_id(ts)
        cf = self._segments.name(seg)
        if cf is None:
            return
        raw = self._db.get(cf, kb)
        if raw is None:
            return
        row = VersionRow.decode(raw)
        if row.next_ts == ts and row.entries[0] == (ts, None):
            del row.entries[0]
            self._write_row(seg, kb, row)

    def _push_top(self, kb: bytes, from_ts: int, vb: bytes | None, valid_to: int) -> None:
        """Add a version as the newest entry of the row of its ``valid_to`` segment."""
        if valid_to < self._min_live():
            return  # it could never answer a valid query; Kafka skips it too
        seg = valid_to // self.segment_interval_ms
        cf = self._segments.names.get(seg)
        if cf is None:
            cf = self._segments.get_or_create(seg)
        db = self._db
        db.put(cf, kb, push_newest(db.get(cf, kb), from_ts, vb, valid_to))

    def _write_row(self, seg: int, kb: bytes, row: VersionRow) -> None:
        cf = self._segments.get_or_create(seg)
        self._db.put(cf, kb, row.encode() if row.entries else None)

    def _row_valid_after(self, kb: bytes, ts: int) -> tuple[int, VersionRow] | None:
        """The first history row (by segment) holding a version valid after ``ts``."""
        get = self._db.get
        for seg, cf in self._segments.names_from(self._segments.segment_id(ts)):
            raw = get(cf, kb)
            if raw is not None:
                row = VersionRow.decode(raw)
                if row.next_ts > ts:
                    return seg, row
        return None

    # ---------------------------------------------------------------------- reads
    def get(self, key: Any, as_of: int | None = None) -> VersionedRecord | None:
        """The version valid at ``as_of`` (inclusive), the latest if None, or None."""
        # One function, its helpers inlined (but the retention rule, off the latest
        # path): this is the temporal join's lookup.
        # tuple.__new__ skips VersionedRecord's Python-level __new__.
        kb = self.encode_key(key)
        if as_of is not None and (type(as_of) is not int or not TS_MIN <= as_of <= TS_MAX):
            as_of = check_timestamp("as_of", as_of)
        raw = self._db.get(self._latest, kb)
        if raw is not None:
            ts = LATEST_TS.unpack_from(raw)[0]
            if as_of is None or ts <= as_of:
                value = self._loads(raw[LATEST_TS.size :])
                return tuple.__new__(VersionedRecord, (value, ts, None))
        if as_of is None:
            return None
        if as_of < self.grace_floor():
            return None  # outside history retention only the latest may answer
        get = self._db.get
        for cf in self._segments.live_names_from(as_of // self.segment_interval_ms):
            row = get(cf, kb)
            if row is None:
                continue
            found = lookup(row, as_of)
            if found is None:
                continue
            from_ts, valid_to, vb = found
            if from_ts > as_of or vb is None:
                return None
            return tuple.__new__(VersionedRecord, (self._loads(vb), from_ts, valid_to))
        return None

    def get_versions(
        self,
        key: Any,
        from_ts: int | None = None,
        to_ts: int | None = None,
        ascending: bool = False,
    ) -> list[VersionedRecord]:
        """The distinct versions ``get(key, as_of=t)`` returns for some ``t`` in
        ``[from_ts, to_ts]`` (None is open): every non-tombstone version whose
        validity overlaps the range, except that history answers no ``as_of`` older
        than ``stream_time - history_retention_ms`` (the latest always may).
        Newest first unless ``ascending``.
        """
        kb = self.encode_key(key)
        lo = TS_MIN if from_ts is None else check_timestamp("from_ts", from_ts)
        hi = TS_MAX if to_ts is None else check_timestamp("to_ts", to_ts)
        out: list[VersionedRecord] = []
        if lo > hi:
            return out
        loads = self._loads
        # the part of the range history may answer, by get's rule
        history_lo = max(lo, self.grace_floor())
        get = self._db.get
        segments = self._segments
        names = (
            segments.live_names_from(segments.segment_id(history_lo)) if history_lo <= hi else ()
        )
        for cf in names:
            raw = get(cf, kb)
            if raw is None:
                continue
            row = VersionRow.decode(raw)
            for i, (ts, vb) in enumerate(row.entries):
                if vb is not None and ts <= hi and row.valid_to(i) > history_lo:
                    out.append(VersionedRecord(loads(vb), ts, row.valid_to(i)))
            if row.min_ts > hi:
                break  # every later row only holds newer versions
        raw = get(self._latest, kb)
        if raw is not None:
            ts, vb = decode_latest(raw)
            if ts <= hi:
                out.append(VersionedRecord(loads(vb), ts, None))
        out.sort(key=lambda r: r.timestamp, reverse=not ascending)
        return out

    def iter_keys(self, key_from: Any = None, key_to: Any = None) -> Iterator[Any]:
        """Keys in ``[key_from, key_to]`` (None is open) with a latest version or a
        history row, in key order. Streams: one merged pass over the families."""
        bounds = key_range(self.encode_key, key_from, key_to)
        if bounds is None:
            return
        families = [self._latest] + [self._segments.name(s) for s in self._segments.ids()]
        scans = [(kb for kb, _ in self._db.scan(cf, *bounds)) for cf in families]
        last = None
        for kb in heapq.merge(*scans):
            if kb != last:
                last = kb
                yield self.decode_key(kb)

    def read_rows(
        self,
        key: Any = None,
        key_from: Any = None,
        key_to: Any = None,
        from_ts: int | None = None,
        to_ts: int | None = None,
        as_of: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Rows as the reader shows them, ``{key, value, valid_from, valid_to}``: the
        version valid at ``as_of``, or every version overlapping ``[from_ts, to_ts]``
        (newest first), of ``key`` or of the keys in ``[key_from, key_to]``."""
        keys = [key] if key is not None else self.iter_keys(key_from, key_to)
        for k in keys:
            if as_of is not None:
                records = [self.get(k, as_of)]
            else:
                records = self.get_versions(k, from_ts, to_ts)
            for r in records:
                if r is not None:
                    yield {"key": k, "value": r.value, "valid_from": r.timestamp,
                           "valid_to": r.valid_to}  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"VersionedStore({self.name!r}, history_retention_ms={self.history_retention_ms}, "
            f"segment_interval_ms={self.segment_interval_ms})"
        )
