"""Message store: the messages of a keyed stream, by key, event time and offset.

Row key ``enc(key) ‖ timestamp ‖ offset`` (8-byte big-endian each, sign flipped),
as the Samza design keys its join buffers (``<join key>_<timestamp>_<offset>``).
It is the session-row layout with ``end = timestamp`` and ``start = offset``, so it
inherits the segments (by timestamp), retention, stream time and batching of
:mod:`sessionstore.stores.session`. A message is stored once per (key, timestamp,
offset): a replayed message finds itself and is not stored or joined twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sessionstore.encoding.keys import TS_MAX, check_timestamp
from sessionstore.stores.session import SessionStore

__all__ = ["MessageStore"]


class MessageStore(SessionStore):
    """Buffered messages per key. Create with ``db.message_store(name, retention_ms)``."""

    kind = "messages"
    #: Fields of :meth:`read_rows`' rows that are event times (``offset`` is not).
    time_columns: tuple[str, ...] = ("timestamp",)

    def _window(self, start: Any, end: Any) -> tuple[int, int]:
        # start is the offset here, not a time: no start <= end rule
        return check_timestamp("offset", start), check_timestamp("timestamp", end)

    def put(self, key: Any, start: int, end: int, value: Any) -> None:
        """Store a message with offset ``start`` and timestamp ``end``; None deletes."""
        kb = self.encode_key(key)
        start, end = self._window(start, end)
        self._put_checked(kb, start, end, value)

    def put_message(self, key: Any, timestamp: int, offset: int, value: Any) -> None:
        """Buffer the message at ``offset`` with event time ``timestamp``."""
        if value is None:
            raise ValueError("a message value must not be None (None deletes in this store)")
        self.put(key, offset, timestamp, value)

    def has_message(self, key: Any, timestamp: int, offset: int) -> bool:
        return self.fetch_session(key, offset, timestamp) is not None

    # Rows of read_rows: {key, timestamp, offset, value}. end is the timestamp and
    # start the offset, so every start qualifies and the time is filtered by hand.
    def _latest_start(self, to_ts: int) -> int:
        return TS_MAX

    def _row(self, window: Any, value: Any, to_ts: int) -> dict[str, Any] | None:
        if window.end > to_ts:
            return None
        return {"key": window.key, "timestamp": window.end, "offset": window.start, "value": value}

    def _columns(
        self, keys: list, starts: list[int], ends: list[int], values: list, to_ts: int
    ) -> dict[str, list[Any]]:
        if ends and max(ends) > to_ts:
            kept = [i for i, end in enumerate(ends) if end <= to_ts]
            keys, starts, ends, values = (
                [c[i] for i in kept] for c in (keys, starts, ends, values)
            )
        return {"key": keys, "timestamp": ends, "offset": starts, "value": values}

    def messages(self, key: Any, from_ts: int, to_ts: int) -> Iterator[tuple[int, int, Any]]:
        """``(timestamp, offset, value)`` of ``key`` with ``from_ts <= timestamp <= to_ts``."""
        for window, value in self.find_sessions(key, from_ts, TS_MAX):
            if window.end > to_ts:
                return
            yield window.end, window.start, value
