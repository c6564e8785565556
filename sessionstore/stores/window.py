"""Window store: fixed-size time windows per key, in the session-store layout.

A window ``[start, start + size)`` is the row ``(key, end=start + size - 1, start)``
of a session store, so it shares the byte layout, the segments (column families
chosen by end), retention and stream-time rules of
:mod:`sessionstore.stores.session`, and its recorded kind is ``"window"``.
Results carry the exclusive end, as windows usually do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from sessionstore.encoding.keys import TS_MAX, TS_MIN, check_timestamp
from sessionstore.stores.base import describe_store
from sessionstore.stores.session import SessionStore

if TYPE_CHECKING:
    from sessionstore.engine.db import Database

__all__ = ["WindowStore", "TimeWindow"]


class TimeWindow(NamedTuple):
    """The window ``[start, end)`` of ``key``."""

    key: Any
    start: int
    end: int


class WindowStore(SessionStore):
    """Per-key values of fixed-size windows. Create with ``db.window_store(...)``."""

    kind = "window"
    layout = ("window_size_ms",)

    def __init__(
        self,
        db: Database,
        name: str,
        retention_ms: int,
        window_size_ms: int,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> None:
        if type(window_size_ms) is not int or window_size_ms <= 0:
            raise ValueError(f"window_size_ms must be a positive int, got {window_size_ms!r}")
        self.window_size_ms = window_size_ms
        super().__init__(db, name, retention_ms, segment_interval_ms, key_serde, value_serde)

    def spec(self) -> dict[str, Any]:
        return describe_store(
            self.kind,
            self.retention_ms,
            self.segment_interval_ms,
            self.key_serde,
            self.value_serde,
            self.window_size_ms,
        )

    def _last(self, start: int) -> int:
        start = check_timestamp("window_start", start)
        if start > TS_MAX - self.window_size_ms + 1:
            raise ValueError(
                f"window_start={start} is too late for a {self.window_size_ms} ms window"
            )
        return start + self.window_size_ms - 1

    def put_window(self, key: Any, start: int, value: Any) -> None:
        """Store the value of ``key``'s window starting at ``start``; None deletes."""
        self.put(key, start, self._last(start), value)

    def fetch_window(self, key: Any, start: int) -> Any:
        """The value of ``key``'s window starting at ``start``, or None."""
        return self.fetch_session(key, start, self._last(start))

    def fetch_windows(
        self, key: Any, from_start: int = TS_MIN, to_start: int = TS_MAX, backward: bool = False
    ) -> Iterator[tuple[TimeWindow, Any]]:
        """Windows of ``key`` with ``from_start <= start <= to_start``, by start."""
        return self._windows(self.find_sessions(key, from_start, to_start, backward), from_start)

    def fetch_all(
        self, from_start: int = TS_MIN, to_start: int = TS_MAX, backward: bool = False
    ) -> Iterator[tuple[TimeWindow, Any]]:
        """Windows of every key with ``from_start <= start <= to_start``."""
        rows = self.find_sessions_in_range(None, None, from_start, to_start, backward)
        return self._windows(rows, from_start)

    def _row(self, window: Any, value: Any, to_ts: int) -> dict[str, Any] | None:
        # windows show their exclusive end
        return {"key": window.key, "start": window.start, "end": window.end + 1, "value": value}

    def _columns(
        self, keys: list, starts: list[int], ends: list[int], values: list, to_ts: int
    ) -> dict[str, list[Any]]:
        return {"key": keys, "start": starts, "end": [end + 1 for end in ends], "value": values}

    def _windows(self, rows, from_start: int):
        # find_sessions also returns windows that start earlier but end after from_start
        for window, value in rows:
            if window.start >= from_start:
                yield TimeWindow(window.key, window.start, window.end + 1), value
