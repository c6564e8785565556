"""Naive reference models of the stores, written from the rules alone (no segments,
no encodings). Property tests require the real stores to agree with them."""

from __future__ import annotations

from typing import Any

from sessionstore.stores.records import (
    PUT_REJECTED,
    VALID_TO_UNDEFINED,
    SessionWindow,
    VersionedRecord,
)


class SessionModel:
    """Sessions in a dict; keys must be str so that Python order is the spec order."""

    def __init__(self, retention_ms: int) -> None:
        self.retention_ms = retention_ms
        self.rows: dict[tuple[str, int, int], Any] = {}
        self.stream_time: int | None = None
        self.dropped = 0

    def min_visible(self) -> int:
        return -(2**63) if self.stream_time is None else self.stream_time - self.retention_ms + 1

    def put(self, key: str, start: int, end: int, value: Any) -> None:
        if value is None:
            if end >= self.min_visible():
                self.rows.pop((key, start, end), None)
            return
        if self.stream_time is None or end > self.stream_time:
            self.stream_time = end
        elif end < self.min_visible():
            self.dropped += 1
            return
        self.rows[(key, start, end)] = value

    def fetch_session(self, key: str, start: int, end: int) -> Any:
        if end < self.min_visible():
            return None
        return self.rows.get((key, start, end))

    def find(
        self,
        key_from: str | None,
        key_to: str | None,
        earliest_end: int,
        latest_start: int,
        backward: bool = False,
    ) -> list[tuple[SessionWindow, Any]]:
        out = [
            (k, s, e, v)
            for (k, s, e), v in self.rows.items()
            if (key_from is None or k >= key_from)
            and (key_to is None or k <= key_to)
            and e >= earliest_end
            and s <= latest_start
            and e >= self.min_visible()
        ]
        out.sort(key=lambda r: (r[0], r[2], r[1]), reverse=backward)
        return [(SessionWindow(k, s, e), v) for k, s, e, v in out]


class VersionedModel:
    """Every version ever accepted, per key, in a dict from timestamp to value."""

    def __init__(self, history_retention_ms: int) -> None:
        self.retention = history_retention_ms
        self.versions: dict[Any, dict[int, Any]] = {}
        self.stream_time: int | None = None
        self.dropped = 0

    def floor(self) -> int:
        return -(2**63) if self.stream_time is None else self.stream_time - self.retention

    def _next_after(self, key: Any, ts: int) -> int | None:
        later = [t for t in self.versions.get(key, {}) if t > ts]
        return min(later) if later else None

    def put(self, key: Any, value: Any, ts: int) -> int:
        if ts < self.floor():
            self.dropped += 1
            return PUT_REJECTED
        self.stream_time = ts if self.stream_time is None else max(self.stream_time, ts)
        self.versions.setdefault(key, {})[ts] = value
        nxt = self._next_after(key, ts)
        return VALID_TO_UNDEFINED if nxt is None else nxt

    def get(self, key: Any, as_of: int | None = None) -> VersionedRecord | None:
        timeline = self.versions.get(key, {})
        if not timeline:
            return None
        if as_of is None:
            ts = max(timeline)
            value = timeline[ts]
            return None if value is None else VersionedRecord(value, ts, None)
        earlier = [t for t in timeline if t <= as_of]
        if not earlier:
            return None
        ts = max(earlier)
        value = timeline[ts]
        nxt = self._next_after(key, ts)
        if value is None:
            return None
        if as_of < self.floor() and nxt is not None:
            return None  # outside history retention only the latest answers
        return VersionedRecord(value, ts, nxt)

    def delete(self, key: Any, ts: int) -> VersionedRecord | None:
        if ts < self.floor():
            self.dropped += 1
            return None
        prior = self.get(key, ts)
        self.put(key, None, ts)
        return prior

    def get_versions(
        self, key: Any, from_ts: int | None, to_ts: int | None, ascending: bool = False
    ) -> list[VersionedRecord]:
        lo = -(2**63) if from_ts is None else from_ts
        hi = 2**63 - 1 if to_ts is None else to_ts
        if lo > hi:
            return []
        after = max(lo, self.floor())  # history answers no as_of before the floor
        out = []
        for ts, value in self.versions.get(key, {}).items():
            nxt = self._next_after(key, ts)
            if value is not None and ts <= hi and (nxt is None or after < nxt and after <= hi):
                out.append(VersionedRecord(value, ts, nxt))
        out.sort(key=lambda r: r.timestamp, reverse=not ascending)
        return out


def offline_sessions(records, gap: int) -> list[tuple]:
    """Sessionize ``(key, value, ts)`` records offline: sort each key's times and
    start a new session where the gap is exceeded (the gap is inclusive).
    Returns sorted ``(key, start, end, count)``."""
    by_key: dict = {}
    for key, _, ts in records:
        by_key.setdefault(key, []).append(ts)
    out = []
    for key, times in by_key.items():
        times.sort()
        start = end = times[0]
        count = 1
        for ts in times[1:]:
            if ts - end <= gap:
                end, count = ts, count + 1
            else:
                out.append((key, start, end, count))
                start = end = ts
                count = 1
        out.append((key, start, end, count))
    return sorted(out)


def plan_at(changes, user: str, ts: int) -> str | None:
    """The plan of ``user`` valid at ``ts``: the latest of ``changes`` (``(user,
    since, plan)``, as the demo's ``plan_changes`` gives them) at or before ``ts``,
    None before the first (an as-of lookup, as ``temporal_join`` makes)."""
    valid = [c for c in changes if c[0] == user and c[1] <= ts]
    return max(valid, key=lambda c: c[1])[2] if valid else None
