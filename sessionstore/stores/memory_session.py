"""In-memory session store (KIP-445) with the RocksDB store's interface and order.

Rows are kept per encoded key (the same prefix-free bytes the RocksDB store uses),
each key holding its sessions sorted by (end, start). Iterating keys in byte order
and sessions in (end, start) order is therefore exactly the RocksDB byte order of
``enc(key) ‖ end ‖ start``. Values are kept serialised, so both stores return the
same objects (msgpack returns tuples as lists in both).

Range reads are materialised at call time, like the snapshot a RocksDB iterator
reads. Expiry uses the same segment arithmetic as the RocksDB store: a segment's rows are
forgotten once all of them are out of retention. Stream time lives in memory only.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import Any

from sessionstore.encoding.keys import TS_MIN
from sessionstore.stores.session import Row, SessionStoreBase

__all__ = ["InMemorySessionStore"]


class _KeySessions:
    __slots__ = ("order", "values")

    def __init__(self) -> None:
        self.order: list[tuple[int, int]] = []  # (end, start), sorted
        self.values: dict[tuple[int, int], bytes] = {}


class InMemorySessionStore(SessionStoreBase):
    """A session store held in Python memory; nothing survives the process."""

    def __init__(
        self,
        name: str,
        retention_ms: int,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> None:
        super().__init__(name, retention_ms, segment_interval_ms, key_serde, value_serde)
        if type(self.segment_interval_ms) is not int or self.segment_interval_ms <= 0:
            raise ValueError(
                f"segment_interval_ms must be a positive int, got {self.segment_interval_ms!r}"
            )
        self._keys: list[bytes] = []
        self._sessions: dict[bytes, _KeySessions] = {}
        self._segments: dict[int, set[tuple[bytes, int, int]]] = {}

    def __len__(self) -> int:
        """Number of stored rows (expired-but-not-yet-forgotten ones included)."""
        return sum(len(s.values) for s in self._sessions.values())

    # ---------------------------------------------------------------- row storage
    def _write(self, kb: bytes, start: int, end: int, value: bytes | None) -> None:
        seg = end // self.segment_interval_ms
        if value is None:
            if self._delete(kb, end, start):
                bucket = self._segments.get(seg)
                if bucket is not None:
                    bucket.discard((kb, end, start))
            return
        sessions = self._sessions.get(kb)
        if sessions is None:
            sessions = self._sessions[kb] = _KeySessions()
            insort(self._keys, kb)
        when = (end, start)
        if when not in sessions.values:
            insort(sessions.order, when)
        sessions.values[when] = value
        self._segments.setdefault(seg, set()).add((kb, end, start))

    def _delete(self, kb: bytes, end: int, start: int) -> bool:
        sessions = self._sessions.get(kb)
        if sessions is None or sessions.values.pop((end, start), None) is None:
            return False
        order = sessions.order
        del order[bisect_left(order, (end, start))]
        if not order:
            del self._sessions[kb]
            del self._keys[bisect_left(self._keys, kb)]
        return True

    def _read(self, kb: bytes, start: int, end: int) -> bytes | None:
        sessions = self._sessions.get(kb)
        return None if sessions is None else sessions.values.get((end, start))

    def _expire(self, min_visible_end: int) -> None:
        first_live = min_visible_end // self.segment_interval_ms
        for seg in [s for s in self._segments if s < first_live]:
            for kb, end, start in self._segments.pop(seg):
                self._delete(kb, end, start)

    def _key_rows(
        self, kb: bytes, min_end: int, latest_start: int, backward: bool
    ) -> list[tuple[int, int, bytes]]:
        sessions = self._sessions.get(kb)
        if sessions is None:
            return []
        order, values = sessions.order, sessions.values
        lo = bisect_left(order, (min_end, TS_MIN))
        out = [(s, e, values[(e, s)]) for e, s in order[lo:] if s <= latest_start]
        if backward:
            out.reverse()
        return out

    def _range_rows(
        self,
        kb_lo: bytes | None,
        kb_hi: bytes | None,
        min_end: int,
        latest_start: int,
        backward: bool,
    ) -> Iterator[Row]:
        i = 0 if kb_lo is None else bisect_left(self._keys, kb_lo)
        j = len(self._keys) if kb_hi is None else bisect_left(self._keys, kb_hi)
        rows: list[Row] = []
        for kb in self._keys[i:j]:
            for start, end, value in self._key_rows(kb, min_end, latest_start, False):
                rows.append((kb, start, end, value))
        if backward:
            rows.reverse()
        return iter(rows)
