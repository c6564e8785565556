"""Session stores (KIP-94): sessions keyed by (key, end, start), segmented by end.

:class:`SessionStoreBase` holds the semantics shared by the RocksDB store
(:class:`SessionStore`, here) and the in-memory one
(:class:`~sessionstore.stores.memory_session.InMemorySessionStore`); each subclass only
stores and scans rows. Both therefore return identical results in identical order.

Rules (see README "Session stores"):

* Observed stream time is the largest ``end`` ever put with a value. It is persisted
  in the same write batch as the data.
* A session is visible and writable while ``end >= stream_time - retention_ms + 1``.
  A put outside that range is dropped and counted in ``dropped_records``.
* ``find_sessions(key, earliest_end, latest_start)`` returns the sessions with
  ``end >= earliest_end`` and ``start <= latest_start`` (both inclusive), forward in
  (key, end, start) order; ``backward=True`` gives the exact reverse.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from itertools import chain, islice
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from sessionstore.encoding.keys import (
    TS_MAX,
    TS_MIN,
    check_timestamp,
    decode_key,
    decode_keys,
    key_range,
    prefix_upper_bound,
)
from sessionstore.encoding.session_key import (
    TIME_SIGN,
    TIMES,
    TIMES_LEN,
    session_key,
    times_of,
    times_of_many,
)
from sessionstore.stores.base import SegmentedDBStore, TimedStore, describe_store
from sessionstore.stores.closing import ClosingSessions, session_rows
from sessionstore.stores.records import SessionWindow

if TYPE_CHECKING:
    from sessionstore.engine.db import Database

__all__ = ["SessionStoreBase", "SessionStore"]

#: A scanned row: (encoded key, start, end, value bytes).
Row = tuple[bytes, int, int, bytes]


def _check_retention(name: str, value: Any) -> int:
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be a positive int of milliseconds, got {value!r}")
    return value


class SessionStoreBase(TimedStore):
    """Session-store semantics over an abstract row storage."""

    kind = "session"
    #: Layout fields (fixed for the store's life) beyond the common arguments.
    layout: tuple[str, ...] = ()
    #: Time filters :meth:`read_rows` takes.
    row_filters: frozenset[str] = frozenset({"from_ts", "to_ts"})
    #: Fields of :meth:`read_rows`' rows that are event times (epoch ms).
    time_columns: tuple[str, ...] = ("start", "end")

    def __init__(
        self,
        name: str,
        retention_ms: int,
        segment_interval_ms: int | None,
        key_serde: Any,
        value_serde: Any,
    ) -> None:
        self._init_timed(name, retention_ms, segment_interval_ms, key_serde, value_serde)
        self._aux: dict[str, bytes] = {}
        self._end_index = None
        #: False once :meth:`hold_stream_time` is called: writes leave the time alone.
        self.writes_move_time = True

    # ----------------------------------------------------------- row storage API
    def _write(self, kb: bytes, start: int, end: int, value: bytes | None) -> None:
        raise NotImplementedError

    def _read(self, kb: bytes, start: int, end: int) -> bytes | None:
        raise NotImplementedError

    def _key_rows(
        self, kb: bytes, min_end: int, latest_start: int, backward: bool
    ) -> list[tuple[int, int, bytes]]:
        """``(start, end, value)`` of one key with ``end >= min_end``, ``start <=
        latest_start``, in (end, start) order (reversed when ``backward``)."""
        raise NotImplementedError

    def _range_rows(
        self,
        kb_lo: bytes | None,
        kb_hi: bytes | None,
        min_end: int,
        latest_start: int,
        backward: bool,
    ) -> Iterator[Row]:
        """Rows with ``kb_lo <= kb < kb_hi`` (None is open), filtered likewise."""
        raise NotImplementedError

    # ----------------------------------------------------------------- properties
    def _live_from(self, stream_time: int) -> int:
        return stream_time - self.retention_ms + 1

    def min_visible_end(self) -> int:
        """Smallest session end that is still visible and writable."""
        st = self._stream_time
        if st is None:
            return TS_MIN
        return max(TS_MIN, st - self.retention_ms + 1)

    def spec(self) -> dict[str, Any]:
        """The recorded description of this store."""
        return describe_store(
            self.kind, self.retention_ms, self.segment_interval_ms, self.key_serde, self.value_serde
        )

    # --------------------------------------------------------------------- writes
    def _window(self, start: Any, end: Any) -> tuple[int, int]:
        if type(start) is not int or type(end) is not int:
            start = check_timestamp("start", start)
            end = check_timestamp("end", end)
        elif not (TS_MIN <= start <= TS_MAX and TS_MIN <= end <= TS_MAX):
            check_timestamp("start", start)
            check_timestamp("end", end)
        if start > end:
            raise ValueError(f"session start {start} is after its end {end}")
        return start, end

    def put(self, key: Any, start: int, end: int, value: Any) -> None:
        """Store ``value`` for the session ``[start, end]`` of ``key``; None deletes."""
        kb = self.encode_key(key)
        if not (type(start) is int and type(end) is int and TS_MIN <= start <= end <= TS_MAX):
            start, end = self._window(start, end)
        return self._put_checked(kb, start, end, value)

    def hold_stream_time(self) -> None:
        """From now on (for this object's life) writes never move the stream time;
        only :meth:`advance_stream_time` does. For an operator that judges a whole
        micro-batch by the time it advanced to before it (Spark's watermark), so
        that what it has not emitted yet stays visible until its next advance."""
        self.writes_move_time = False

    def _put_checked(self, kb: bytes, start: int, end: int, value: Any) -> None:
        if value is None:
            if end >= self.min_visible_end():
                self._write(kb, start, end, None)
            return
        self.put_encoded(kb, start, end, self._dumps(value))

    def put_encoded(self, kb: bytes, start: int, end: int, vb: bytes) -> None:
        """:meth:`put` of a session given as its encoded key and its value as the
        value serde stored it (a valid window: ``start <= end``)."""
        st = self._stream_time
        if st is None or end > st:
            if self.writes_move_time:
                self._advance(end)
        elif end <= st - self.retention_ms:
            self.dropped_records += 1
            return
        self._write(kb, start, end, vb)

    def put_many(self, rows: Iterable[tuple[Any, int, int, Any]]) -> None:
        """``put`` each ``(key, start, end, value)`` in order, as one atomic batch."""
        put = self.put
        with self.batch():
            for key, start, end, value in rows:
                put(key, start, end, value)

    def batch(self) -> AbstractContextManager[Any]:
        """Group writes into one atomic unit (the database's batch in RocksDB, a
        no-op in memory)."""
        return nullcontext()

    def _set_retention(self, retention_ms: int) -> None:
        self.retention_ms = _check_retention("retention_ms", retention_ms)

    def set_min_retention(self, retention_ms: int) -> None:
        """Raise retention to at least ``retention_ms``."""
        if retention_ms > self.retention_ms:
            self._set_retention(retention_ms)

    # Operators keep a little state of their own next to the store (stream time,
    # emitted close time); it is written atomically with the store's rows.
    def read_aux(self, name: str) -> bytes | None:
        """Operator metadata saved with :meth:`write_aux`, or None."""
        return self._aux.get(name)

    def write_aux(self, name: str, value: bytes) -> None:
        self._aux[name] = value

    def end_index(self):
        """The end-ordered index of open sessions used by emit-on-close."""
        from sessionstore.stores.end_index import MemoryEndIndex

        if self._end_index is None:
            self._end_index = MemoryEndIndex()
        return self._end_index

    def closing_sessions(self, create: bool = True) -> Any:
        """The sessions kept to close at the next advance
        (:class:`~sessionstore.stores.closing.ClosingSessions`), or None where the
        store keeps none (in memory; with ``create=False``, a store that never did)."""
        return None

    def _closing_entries(self) -> list[tuple[int, int, bytes, bytes]]:
        """What :meth:`closing_sessions` keeps, read without creating anything
        (readers open checkpoints they must not change)."""
        return []

    def remove(self, key: Any, start: int, end: int) -> None:
        """Delete the session ``[start, end]`` of ``key`` (no-op if absent)."""
        self.put(key, start, end, None)

    # ---------------------------------------------------------------------- reads
    def fetch_session(self, key: Any, start: int, end: int) -> Any:
        """Value of exactly the session ``[start, end]`` of ``key``, or None."""
        kb = self.encode_key(key)
        start, end = self._window(start, end)
        if end < self.min_visible_end():
            return None
        raw = self._read(kb, start, end)
        return None if raw is None else self._loads(raw)

    def fetch_encoded(self, sessions: list[tuple[bytes, int, int]]) -> list[Any]:
        """Values of the sessions ``(encoded key, start, end)`` (None where absent or
        no longer visible), as :meth:`fetch_session` gives them; operators use it to
        read many sessions they know from an index in one pass."""
        min_visible, read, loads = self.min_visible_end(), self._read, self._loads
        out = []
        for kb, start, end in sessions:
            raw = read(kb, start, end) if end >= min_visible else None
            out.append(None if raw is None else loads(raw))
        return out

    def find_sessions(
        self, key: Any, earliest_end: int, latest_start: int, backward: bool = False
    ) -> Iterator[tuple[SessionWindow, Any]]:
        """Sessions of ``key`` with ``end >= earliest_end`` and ``start <= latest_start``."""
        kb = self.encode_key(key)
        if not (type(earliest_end) is int and type(latest_start) is int):
            earliest_end = check_timestamp("earliest_end", earliest_end)
            latest_start = check_timestamp("latest_start", latest_start)
        min_end = self.min_visible_end()
        if earliest_end > min_end:
            min_end = earliest_end
        return iter(self._key_results(key, kb, min_end, latest_start, backward))

    def _key_results(
        self, key: Any, kb: bytes, min_end: int, latest_start: int, backward: bool
    ) -> list[tuple[SessionWindow, Any]]:
        """``find_sessions`` results; backends may build them in one pass."""
        loads, new, window = self._loads, tuple.__new__, SessionWindow
        rows = self._key_rows(kb, min_end, latest_start, backward)
        # tuple.__new__ skips the NamedTuple's Python-level __new__
        return [(new(window, (key, s, e)), loads(v)) for s, e, v in rows]

    def find_sessions_in_range(
        self,
        key_from: Any,
        key_to: Any,
        earliest_end: int,
        latest_start: int,
        backward: bool = False,
    ) -> Iterator[tuple[SessionWindow, Any]]:
        """Like :meth:`find_sessions` for keys in ``[key_from, key_to]``; None is open."""
        earliest_end = check_timestamp("earliest_end", earliest_end)
        latest_start = check_timestamp("latest_start", latest_start)
        bounds = key_range(self.encode_key, key_from, key_to)
        if bounds is None:
            return iter(())
        lo, hi = bounds
        min_end = max(earliest_end, self.min_visible_end())
        rows = self._range_rows(lo, hi, min_end, latest_start, backward)
        return self._range_results(rows)

    def _range_results(self, rows: Iterable[Row]):
        loads, decode = self._loads, self.decode_key
        last_kb, last_key = None, None
        for kb, start, end, vb in rows:
            if kb != last_kb:
                last_kb, last_key = kb, decode(kb)
            yield SessionWindow(last_key, start, end), loads(vb)

    def read_rows(
        self,
        key: Any = None,
        key_from: Any = None,
        key_to: Any = None,
        from_ts: int | None = None,
        to_ts: int | None = None,
        as_of: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Rows as the reader shows them (:meth:`_row`), ``{key, start, end, value}``
        for sessions: those of ``key`` (or of the keys in ``[key_from, key_to]``, None
        is open) that overlap ``[from_ts, to_ts]``. ``as_of`` does not apply here."""
        lo = TS_MIN if from_ts is None else from_ts
        hi = TS_MAX if to_ts is None else to_ts
        latest_start = self._latest_start(hi)
        if key is not None:
            found = self.find_sessions(key, lo, latest_start)
        else:
            found = self.find_sessions_in_range(key_from, key_to, lo, latest_start)
        closing = self._closing_entries()
        if closing:  # stored sessions too, until the advance that emits them
            found = self._with_closing(found, closing, key, key_from, key_to, lo, latest_start)
        for window, value in found:
            row = self._row(window, value, hi)
            if row is not None:
                yield row

    def _with_closing(self, found, closing, key, key_from, key_to, lo, latest_start) -> list:
        """``found`` and the kept closing sessions in the same key and time bounds,
        in (encoded key, end, start) order, as the segments give them."""
        if key is not None:  # [kb, kb + 00) holds kb alone
            kb = self.encode_key(key)
            bounds: tuple[bytes | None, bytes | None] | None = (kb, kb + b"\x00")
        else:
            bounds = key_range(self.encode_key, key_from, key_to)
        if bounds is None:
            return list(found)
        kb_lo, kb_hi = bounds
        encode, decode, loads = self.encode_key, self.decode_key, self._loads
        rows = [(encode(w.key), w.end, w.start, w, v) for w, v in found]
        for end, start, kb, vb in closing:
            if (
                end >= lo
                and start <= latest_start
                and (kb_lo is None or kb >= kb_lo)
                and (kb_hi is None or kb < kb_hi)
            ):
                window = SessionWindow(decode(kb), start, end)
                rows.append((kb, end, start, window, loads(vb)))
        rows.sort(key=lambda r: r[:3])
        return [(w, v) for *_, w, v in rows]

    def _latest_start(self, to_ts: int) -> int:
        """The latest row start a read up to ``to_ts`` may meet."""
        return to_ts

    def _row(self, window: SessionWindow, value: Any, to_ts: int) -> dict[str, Any] | None:
        """A row of :meth:`read_rows` (None skips it)."""
        return {"key": window.key, "start": window.start, "end": window.end, "value": value}

    def _columns(
        self, keys: list, starts: list[int], ends: list[int], values: list, to_ts: int
    ) -> dict[str, list[Any]]:
        """:meth:`_row` of many sessions at once, as columns (``read_columns``)."""
        return {"key": keys, "start": starts, "end": ends, "value": values}

    def fetch(self, key: Any, backward: bool = False) -> Iterator[tuple[SessionWindow, Any]]:
        """Every visible session of ``key``."""
        return self.find_sessions(key, TS_MIN, TS_MAX, backward)

    def fetch_range(
        self, key_from: Any, key_to: Any, backward: bool = False
    ) -> Iterator[tuple[SessionWindow, Any]]:
        """Every visible session of the keys in ``[key_from, key_to]``."""
        return self.find_sessions_in_range(key_from, key_to, TS_MIN, TS_MAX, backward)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, retention_ms={self.retention_ms}, "
            f"segment_interval_ms={self.segment_interval_ms})"
        )


class SessionStore(SegmentedDBStore, SessionStoreBase):
    """Session store in a :class:`~sessionstore.stores.state_db.StateDB`; segments are
    column families.

    Create it with ``db.session_store(name, retention_ms, ...)``.
    """

    def __init__(
        self,
        db: Database,
        name: str,
        retention_ms: int,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> None:
        super().__init__(name, retention_ms, segment_interval_ms, key_serde, value_serde)
        self._closing = None
        self._attach(db, segment_interval_ms)
        if self._stream_time is not None:
            self._segments.expire_below(self.min_visible_end())

    @classmethod
    def row_key(cls, family: str, raw: bytes) -> bytes:
        """The encoded user key of the raw row ``raw`` of this store's family
        ``<store>.<family>``: a segment row is ``enc(key) ‖ end ‖ start``, an end-index
        (``open``) or closing (``closing``) row ``end ‖ start ‖ enc(key)``. What a
        repartition routes by."""
        return raw[TIMES.size :] if family in ("open", "closing") else raw[: -TIMES.size]

    @classmethod
    def row_splitter(cls, family: str) -> Any:
        """``split(raw, value) -> [(raw, value), ...]`` for the rows of this store's
        family ``<store>.<family>`` that may hold several keys' data (a block of
        closing sessions splits into a row per session:
        :func:`~sessionstore.stores.closing.session_rows`); None for a family whose
        every row is one key's."""
        if family != "closing":
            return None
        return partial(session_rows, family)

    # ---------------------------------------------------------------- row storage
    def _expire(self, min_visible_end: int) -> None:
        self._segments.expire_below(min_visible_end)

    def _write(self, kb: bytes, start: int, end: int, value: bytes | None) -> None:
        seg = end // self.segment_interval_ms
        cf = self._segments.names.get(seg)
        if cf is None:
            if value is None:
                return
            cf = self._segments.get_or_create(seg)
        # Outside a batch db.put commits at once, stream time included.
        self._db.put(cf, session_key(kb, start, end), value)

    def end_index(self):
        from sessionstore.stores.end_index import RocksDBEndIndex

        if self._end_index is None:
            self._end_index = RocksDBEndIndex(self._db, self.name)
        return self._end_index

    def closing_sessions(self, create: bool = True):
        if self._closing is None:
            if not create and f"{self.name}.closing" not in self._db.column_families():
                return None
            self._closing = ClosingSessions(self._db, self.name)
        return self._closing

    def _closing_entries(self) -> list[tuple[int, int, bytes, bytes]]:
        closing = self.closing_sessions(create=False)
        return [] if closing is None else closing.all()

    def set_min_retention(self, retention_ms: int) -> None:
        """Raise retention to at least ``retention_ms`` (recorded in the spec)."""
        if retention_ms > self.retention_ms:
            self.reconfigure(retention_ms, None)

    def put_many(self, rows: Iterable[tuple[Any, int, int, Any]]) -> None:
        """``put`` each ``(key, start, end, value)`` in order, as one atomic batch.

        Same rules as :meth:`put` (the property tests hold them equal), with the
        per-row work inlined: this is the path micro-batch operators use.
        """
        encode, dumps, pack = self.encode_key, self._dumps, TIMES.pack
        cached_key = getattr(encode, "cache", {}).get  # encoded str keys, if cached
        names, interval, db = self._segments.names, self.segment_interval_ms, self._db
        retention, sign = self.retention_ms, TIME_SIGN
        ts_min, ts_max, str_, int_ = TS_MIN, TS_MAX, str, int  # locals: this loop is hot
        with db.batch():
            # The last segment's time range and pending-write dict, kept across rows
            # (the rows of a micro-batch mostly share one segment). Expiry cannot
            # stale them: a dropped segment lies wholly below stream time - retention,
            # so a row that would land there is late and skipped first. The slow
            # path may create or drop families, so it resets the range.
            seg_lo = seg_hi = 0
            entries: dict[bytes, bytes | None] = {}
            # below every valid end, so that a new store's first row sets the time
            st = ts_min - 1 if self._stream_time is None else self._stream_time
            late_below = st - retention
            for key, start, end, value in rows:
                if value is None or not (
                    type(start) is int_ and type(end) is int_ and ts_min <= start <= end <= ts_max
                ):
                    self.put(key, start, end, value)  # deletes and odd input: the slow path
                    st = ts_min - 1 if self._stream_time is None else self._stream_time
                    late_below = st - retention
                    seg_lo = seg_hi = 0
                    continue
                kb = cached_key(key) if type(key) is str_ else None
                if kb is None:
                    kb = encode(key)
                vb = dumps(value)
                if end > st:
                    if self.writes_move_time:
                        self._advance(end)
                        st, late_below = end, end - retention
                elif end <= late_below:
                    self.dropped_records += 1
                    continue
                if not seg_lo <= end < seg_hi:
                    seg = end // interval
                    cf = names.get(seg)
                    if cf is None:
                        cf = self._segments.get_or_create(seg)
                    entries = db.bulk_writer(cf)
                    seg_lo, seg_hi = seg * interval, seg * interval + interval
                entries[kb + pack(end + sign, start + sign)] = vb

    def _read(self, kb: bytes, start: int, end: int) -> bytes | None:
        cf = self._segments.name(end // self._segments.interval)
        if cf is None:
            return None
        return self._db.get(cf, session_key(kb, start, end))

    def fetch_encoded(self, sessions: list[tuple[bytes, int, int]]) -> list[Any]:
        # one multi-get per segment instead of a get per session
        min_visible, loads = self.min_visible_end(), self._loads
        segment_of, interval = self._segments.name, self._segments.interval
        out: list[Any] = [None] * len(sessions)
        by_family: dict[str, tuple[list[int], list[bytes]]] = {}
        for i, (kb, start, end) in enumerate(sessions):
            if end < min_visible:
                continue
            cf = segment_of(end // interval)
            if cf is not None:
                at, keys = by_family.setdefault(cf, ([], []))
                at.append(i)
                keys.append(session_key(kb, start, end))
        for cf, (at, keys) in by_family.items():
            for i, raw in zip(at, self._db.get_many(cf, keys), strict=True):
                if raw is not None:
                    out[i] = loads(raw)
        return out

    def _key_results(
        self, key: Any, kb: bytes, min_end: int, latest_start: int, backward: bool
    ) -> list[tuple[SessionWindow, Any]]:
        # _key_rows and the result tuples in one pass: this is the hottest read
        segments = self._segments
        lo = session_key(kb, TS_MIN, min_end)
        hi = prefix_upper_bound(kb)
        scan_list, loads = self._db.scan_list, self._loads
        unpack, sign, times_len = TIMES.unpack_from, TIME_SIGN, TIMES.size
        new, window = tuple.__new__, SessionWindow
        out: list[tuple[SessionWindow, Any]] = []
        for cf in segments.live_names_from(segments.segment_id(min_end), backward):
            for raw, vb in scan_list(cf, lo, hi, backward):
                end, start = unpack(raw, len(raw) - times_len)
                start -= sign
                if start <= latest_start:
                    out.append((new(window, (key, start, end - sign)), loads(vb)))
        return out

    def _range_rows(
        self,
        kb_lo: bytes | None,
        kb_hi: bytes | None,
        min_end: int,
        latest_start: int,
        backward: bool,
    ) -> Iterator[Row]:
        segments = self._segments
        streams = [
            self._filtered(cf, kb_lo, kb_hi, min_end, latest_start, backward)
            for cf in segments.live_names_from(segments.segment_id(min_end), backward)
        ]
        if len(streams) == 1:
            return streams[0]
        return heapq.merge(*streams, key=_row_sort_key, reverse=backward)

    def _filtered(self, cf, lo, hi, min_end, latest_start, backward) -> Iterator[Row]:
        for raw, vb in self._db.scan(cf, lo, hi, backward):
            start, end = times_of(raw)
            if end >= min_end and start <= latest_start:
                yield raw[: -TIMES.size], start, end, vb

    # ------------------------------------------------------------ columnar reads
    def read_columns(
        self,
        key: Any = None,
        key_from: Any = None,
        key_to: Any = None,
        from_ts: int | None = None,
        to_ts: int | None = None,
        as_of: int | None = None,
        size: int = 4096,
    ) -> Iterator[dict[str, list[Any]]] | None:
        """The rows of :meth:`read_rows` (the same arguments; the same rows, in the
        same order) as columns: chunks of at most ``size`` rows, each ``{field:
        [its value in each row]}`` with the fields in a row's order. The keys, times
        and values of a chunk are decoded together, which costs a fraction of a row
        at a time (a dump reads millions). None where it does not apply: one key (a
        few rows), or a subclass that reads or shapes its rows its own way; read
        :meth:`read_rows` then."""
        if key is not None or not _columns_shape_rows(type(self)):
            return None
        return self._column_chunks(key_from, key_to, from_ts, to_ts, size)

    def _column_chunks(
        self, key_from: Any, key_to: Any, from_ts: int | None, to_ts: int | None, size: int
    ) -> Iterator[dict[str, list[Any]]]:
        # read_rows' checks and reads, in its order, so that it fails as that does
        lo = TS_MIN if from_ts is None else from_ts
        hi = TS_MAX if to_ts is None else to_ts
        latest_start = self._latest_start(hi)
        lo = check_timestamp("earliest_end", lo)
        latest_start = check_timestamp("latest_start", latest_start)
        bounds = key_range(self.encode_key, key_from, key_to)
        closing = self._closing_entries()
        if bounds is None:
            return
        kb_lo, kb_hi = bounds
        min_end = max(lo, self.min_visible_end())
        segments = self._segments
        streams = [
            self._passing(cf, kb_lo, kb_hi, min_end, latest_start, size)
            for cf in segments.live_names_from(segments.segment_id(min_end))
        ]
        kept = _closing_rows(closing, lo, latest_start, kb_lo, kb_hi)
        if len(streams) == 1 and not kept:
            chunks = streams[0]
        else:  # rows by (key, end, start), which is their bytes' order (enc is prefix-free)
            merged = heapq.merge(
                *(chain.from_iterable(chunk[0] for chunk in s) for s in streams), kept,
                key=itemgetter(0),
            )  # fmt: skip
            chunks = _timed(merged, size)
        for chunk in chunks:
            yield from self._decoded(*chunk, hi)

    def _passing(
        self, cf: str, lo: bytes | None, hi: bytes | None, min_end: int, latest_start: int,
        size: int,
    ) -> Iterator[_RawChunk]:  # fmt: skip
        """:meth:`_filtered` of the segment ``cf`` a chunk at a time: the raw rows
        that pass, with their times."""
        scan = self._db.scan(cf, lo, hi)
        while pairs := list(islice(scan, size)):
            raws = _row_keys(pairs)
            try:
                starts, ends = times_of_many(raws)
            except ValueError:  # a key too short for its times: the rows before it first
                yield from _passing_one_by_one(pairs, min_end, latest_start)
                continue
            passing = (ends >= min_end) & (starts <= latest_start)
            if not passing.all():
                at = np.flatnonzero(passing)
                pairs = [pairs[i] for i in at.tolist()]
                raws, starts, ends = _row_keys(pairs), starts[at], ends[at]
            if pairs:
                yield pairs, raws, starts, ends

    def _decoded(
        self, pairs: list[tuple[bytes, bytes]], raws: Any, starts: np.ndarray, ends: np.ndarray,
        to_ts: int,
    ) -> Iterator[dict[str, list[Any]]]:  # fmt: skip
        """The columns of the passing raw rows ``pairs`` (also ``raws``, their row
        keys: :func:`_row_keys`; times ``starts``, ``ends``), shaped by
        :meth:`_columns`. Where a key or value does not decode, the rows before it
        are given, then the error :meth:`read_rows` raises there."""
        decode = self.decode_key
        try:
            if isinstance(raws, list):
                encoded: Any = [raw[:-TIMES_LEN] for raw in raws]
            else:
                import pyarrow.compute as pc  # where rows are many: a read of a few never needs it

                encoded = pc.binary_slice(raws, 0, -TIMES_LEN)
            if decode is decode_key:
                keys = decode_keys(encoded)
            else:
                keys = list(map(decode, _as_list(encoded)))
            stored = [vb for _, vb in pairs]
            many = getattr(self.value_serde, "loads_many", None)  # a serde's own batch decode
            values = list(map(self._loads, stored)) if many is None else many(stored)
            columns = self._columns(keys, starts.tolist(), ends.tolist(), values, to_ts)
        except Exception:
            yield from self._decoded_one_by_one(pairs, to_ts)
            return
        if columns[next(iter(columns))]:
            yield columns

    def _decoded_one_by_one(
        self, pairs: list[tuple[bytes, bytes]], to_ts: int
    ) -> Iterator[dict[str, list[Any]]]:
        """:meth:`_decoded` as :meth:`read_rows` decodes, row by row: the rows up to
        the first that fails, as columns, then its error."""
        decode, loads, rows, error = self.decode_key, self._loads, [], None
        try:
            for raw, vb in pairs:
                start, end = times_of(raw)
                window = SessionWindow(decode(raw[:-TIMES_LEN]), start, end)
                row = self._row(window, loads(vb), to_ts)
                if row is not None:
                    rows.append(row)
        except Exception as exc:
            error = exc
        if rows:
            yield {name: [row[name] for row in rows] for name in rows[0]}
        if error is not None:
            raise error from None


#: Raw rows of a segment, read a chunk at a time: ``(row key, value bytes)`` pairs,
#: their row keys (:func:`_row_keys`), and their starts and ends.
_RawChunk = tuple[list[tuple[bytes, bytes]], Any, np.ndarray, np.ndarray]

#: Rows from which a chunk's keys and times are decoded in Arrow: fewer cost more
#: in Arrow's calls than one by one.
_ARROW_ROWS = 64


def _row_keys(pairs: list[tuple[bytes, bytes]]) -> Any:
    """The row keys of ``pairs``: a pyarrow binary array (decoded together), or
    for a few rows a list."""
    raws = [raw for raw, _ in pairs]
    return pa.array(raws, pa.binary()) if len(raws) >= _ARROW_ROWS else raws


def _as_list(raws: Any) -> list[bytes]:
    """``raws`` (a list, or a pyarrow binary array) as a list of bytes."""
    return raws if isinstance(raws, list) else raws.to_pylist()


def _passing_one_by_one(
    pairs: list[tuple[bytes, bytes]], min_end: int, latest_start: int
) -> Iterator[_RawChunk]:
    """The rows of ``pairs`` that pass :meth:`SessionStore._filtered`'s test, one
    by one as that tests them: those before a key it cannot read, then its error."""
    kept, error = [], None
    try:
        for raw, vb in pairs:
            start, end = times_of(raw)
            if end >= min_end and start <= latest_start:
                kept.append((raw, vb))
    except Exception as exc:
        error = exc
    if kept:
        raws = _row_keys(kept)
        yield kept, raws, *times_of_many(raws)
    if error is not None:
        raise error from None


#: The methods :meth:`SessionStoreBase.read_rows` reads rows through: a class that
#: takes them all from this module, and has a ``_columns`` beside its ``_row``, gets
#: the same rows from :meth:`SessionStore.read_columns`.
_ROW_PATH = ("read_rows", "find_sessions_in_range", "_range_rows", "_filtered", "_range_results")


def _columns_shape_rows(cls: type) -> bool:
    """Whether ``read_columns`` gives ``cls``'s rows: it reads them as this module
    does and shapes them with a ``_columns`` written beside its ``_row``."""

    def owner(name: str) -> type:
        return next(c for c in cls.__mro__ if name in vars(c))

    ours = (SessionStoreBase, SessionStore)
    return all(owner(n) in ours for n in _ROW_PATH) and owner("_row") is owner("_columns")


def _closing_rows(
    closing: list[tuple[int, int, bytes, bytes]], lo: int, latest_start: int,
    kb_lo: bytes | None, kb_hi: bytes | None,
) -> list[tuple[bytes, bytes]]:  # fmt: skip
    """The closing sessions a read shows (:meth:`SessionStoreBase._with_closing`'s
    test) as raw segment rows ``(enc(key) ‖ end ‖ start, value)``, in their order."""
    rows = [
        (session_key(kb, start, end), vb)
        for end, start, kb, vb in closing
        if end >= lo
        and start <= latest_start
        and (kb_lo is None or kb >= kb_lo)
        and (kb_hi is None or kb < kb_hi)
    ]
    rows.sort(key=itemgetter(0))
    return rows


def _timed(rows: Iterator[tuple[bytes, bytes]], size: int) -> Iterator[_RawChunk]:
    """``rows`` in chunks of ``size``, each with its row keys (:func:`_row_keys`) and
    their starts and ends."""
    while pairs := list(islice(rows, size)):
        raws = _row_keys(pairs)
        yield pairs, raws, *times_of_many(raws)


def _row_sort_key(row: Row) -> tuple[bytes, int, int]:
    return row[0], row[2], row[1]
