"""Session stores (KIP-94): sessions keyed by (key, end, start), segmented by end.

:class:`SessionStoreBase` holds the semantics shared by the RocksDB store
(:class:`SessionStore`, here) and the in-memory one
(:class:`~sessionstore.memory_session_store.InMemorySessionStore`); each subclass only
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
from typing import TYPE_CHECKING, Any

from sessionstore.db_store import DBStoreMixin
from sessionstore.keys import TS_MAX, TS_MIN, check_timestamp, prefix_upper_bound
from sessionstore.records import SessionWindow
from sessionstore.segments import default_segment_interval
from sessionstore.serde import MsgpackSerde, key_codec, serde_name
from sessionstore.session_key import session_key, times_of

if TYPE_CHECKING:
    from sessionstore.db import StateDB

__all__ = ["SessionStoreBase", "SessionStore"]

#: A scanned row: (encoded key, start, end, value bytes).
Row = tuple[bytes, int, int, bytes]


def _check_retention(name: str, value: Any) -> int:
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be a positive int of milliseconds, got {value!r}")
    return value


class SessionStoreBase:
    """Session-store semantics over an abstract row storage."""

    kind = "session"

    def __init__(
        self,
        name: str,
        retention_ms: int,
        segment_interval_ms: int | None,
        key_serde: Any,
        value_serde: Any,
    ) -> None:
        self.name = name
        self.retention_ms = _check_retention("retention_ms", retention_ms)
        if segment_interval_ms is None:
            segment_interval_ms = default_segment_interval(retention_ms)
        self.segment_interval_ms = segment_interval_ms
        self.key_serde = key_serde
        self.value_serde = value_serde if value_serde is not None else MsgpackSerde()
        self._encode_key, self._decode_key = key_codec(key_serde)
        self._dumps = self.value_serde.dumps
        self._loads = self.value_serde.loads
        self._stream_time: int | None = None
        #: Puts dropped because their session was already outside retention.
        self.dropped_records = 0

    # ----------------------------------------------------------- row storage API
    def _write(self, kb: bytes, start: int, end: int, value: bytes | None) -> None:
        raise NotImplementedError

    def _read(self, kb: bytes, start: int, end: int) -> bytes | None:
        raise NotImplementedError

    def _rows(
        self,
        kb_lo: bytes | None,
        kb_hi: bytes | None,
        single: bool,
        min_end: int,
        latest_start: int,
        backward: bool,
    ) -> Iterator[Row]:
        """Rows with ``kb_lo <= kb < kb_hi`` (``kb == kb_lo`` when single), filtered."""
        raise NotImplementedError

    def _expire(self, min_visible_end: int) -> None:
        raise NotImplementedError

    def _stream_time_changed(self) -> None:
        """Hook: the stream time moved (persist it)."""

    # ----------------------------------------------------------------- properties
    @property
    def observed_stream_time(self) -> int | None:
        """Largest session end ever put, or None before the first put."""
        return self._stream_time

    def min_visible_end(self) -> int:
        """Smallest session end that is still visible and writable."""
        st = self._stream_time
        if st is None:
            return TS_MIN
        return max(TS_MIN, st - self.retention_ms + 1)

    def spec(self) -> dict[str, Any]:
        """The recorded description of this store."""
        return {
            "kind": self.kind,
            "retention_ms": self.retention_ms,
            "segment_interval_ms": self.segment_interval_ms,
            "key_serde": serde_name(self.key_serde) if self.key_serde else "keycodec",
            "value_serde": serde_name(self.value_serde),
        }

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
        kb = self._encode_key(key)
        start, end = self._window(start, end)
        if value is None:
            if end >= self.min_visible_end():
                self._write(kb, start, end, None)
            return
        vb = self._dumps(value)
        st = self._stream_time
        if st is None or end > st:
            self._stream_time = end
            self._stream_time_changed()
            self._expire(self.min_visible_end())
        elif end < st - self.retention_ms + 1:
            self.dropped_records += 1
            return
        self._write(kb, start, end, vb)

    def remove(self, key: Any, start: int, end: int) -> None:
        """Delete the session ``[start, end]`` of ``key`` (no-op if absent)."""
        self.put(key, start, end, None)

    # ---------------------------------------------------------------------- reads
    def fetch_session(self, key: Any, start: int, end: int) -> Any:
        """Value of exactly the session ``[start, end]`` of ``key``, or None."""
        kb = self._encode_key(key)
        start, end = self._window(start, end)
        if end < self.min_visible_end():
            return None
        raw = self._read(kb, start, end)
        return None if raw is None else self._loads(raw)

    def find_sessions(
        self, key: Any, earliest_end: int, latest_start: int, backward: bool = False
    ) -> Iterator[tuple[SessionWindow, Any]]:
        """Sessions of ``key`` with ``end >= earliest_end`` and ``start <= latest_start``."""
        kb = self._encode_key(key)
        earliest_end = check_timestamp("earliest_end", earliest_end)
        latest_start = check_timestamp("latest_start", latest_start)
        min_end = max(earliest_end, self.min_visible_end())
        rows = self._rows(kb, None, True, min_end, latest_start, backward)
        return self._single_key_results(key, rows)

    def _single_key_results(self, key: Any, rows: Iterable[Row]):
        loads = self._loads
        for _kb, start, end, vb in rows:
            yield SessionWindow(key, start, end), loads(vb)

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
        lo = None if key_from is None else self._encode_key(key_from)
        hi_key = None if key_to is None else self._encode_key(key_to)
        if lo is not None and hi_key is not None and lo > hi_key:
            return iter(())
        hi = None if hi_key is None else prefix_upper_bound(hi_key)
        min_end = max(earliest_end, self.min_visible_end())
        rows = self._rows(lo, hi, False, min_end, latest_start, backward)
        return self._range_results(rows)

    def _range_results(self, rows: Iterable[Row]):
        loads, decode = self._loads, self._decode_key
        last_kb, last_key = None, None
        for kb, start, end, vb in rows:
            if kb != last_kb:
                last_kb, last_key = kb, decode(kb)
            yield SessionWindow(last_key, start, end), loads(vb)

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


class SessionStore(DBStoreMixin, SessionStoreBase):
    """Session store in a :class:`~sessionstore.db.StateDB`; segments are column families.

    Create it with ``db.session_store(name, retention_ms, ...)``.
    """

    def __init__(
        self,
        db: StateDB,
        name: str,
        retention_ms: int,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> None:
        super().__init__(name, retention_ms, segment_interval_ms, key_serde, value_serde)
        self._attach(db, segment_interval_ms)
        if self._stream_time is not None:
            self._segments.expire_below(self.min_visible_end())

    def _set_retention(self, retention_ms: int) -> None:
        self.retention_ms = _check_retention("retention_ms", retention_ms)

    # ---------------------------------------------------------------- row storage
    def _expire(self, min_visible_end: int) -> None:
        self._segments.expire_below(min_visible_end)

    def _write(self, kb: bytes, start: int, end: int, value: bytes | None) -> None:
        segments = self._segments
        seg = end // segments.interval
        if value is None:
            cf = segments.name(seg)
            if cf is None:
                return
        else:
            cf = segments.get_or_create(seg)
        # Outside a batch db.put commits at once, stream time included.
        self._db.put(cf, session_key(kb, start, end), value)

    def _read(self, kb: bytes, start: int, end: int) -> bytes | None:
        cf = self._segments.name(end // self._segments.interval)
        if cf is None:
            return None
        return self._db.get(cf, session_key(kb, start, end))

    def _rows(
        self,
        kb_lo: bytes | None,
        kb_hi: bytes | None,
        single: bool,
        min_end: int,
        latest_start: int,
        backward: bool,
    ) -> Iterator[Row]:
        segments = list(
            self._segments.names_from(self._segments.segment_id(min_end), reverse=backward)
        )
        if single:
            lo = session_key(kb_lo, TS_MIN, min_end)
            hi = prefix_upper_bound(kb_lo)
            # Segments partition one key's rows by end, so concatenation keeps order.
            return self._single_rows(segments, lo, hi, min_end, latest_start, backward)
        streams = [
            self._filtered(cf, kb_lo, kb_hi, min_end, latest_start, backward) for _, cf in segments
        ]
        if len(streams) == 1:
            return streams[0]
        return heapq.merge(*streams, key=_ROW_KEY, reverse=backward)

    def _single_rows(self, segments, lo, hi, min_end, latest_start, backward) -> Iterator[Row]:
        scan = self._db.scan
        for _, cf in segments:
            for raw, vb in scan(cf, lo, hi, backward):
                start, end = times_of(raw)
                if start <= latest_start:
                    yield raw[:-16], start, end, vb

    def _filtered(self, cf, lo, hi, min_end, latest_start, backward) -> Iterator[Row]:
        for raw, vb in self._db.scan(cf, lo, hi, backward):
            start, end = times_of(raw)
            if end >= min_end and start <= latest_start:
                yield raw[:-16], start, end, vb


def _row_sort_key(row: Row) -> tuple[bytes, int, int]:
    return row[0], row[2], row[1]


_ROW_KEY = _row_sort_key
