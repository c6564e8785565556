"""The value objects of session aggregation: its settings and what it emits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["SessionWindows", "SessionUpdate", "ClosedSessions"]


@dataclass(frozen=True)
class SessionWindows:
    """Gap-based sessions: records at most ``gap_ms`` apart share a session; late
    records are accepted for ``grace_ms`` after a session's end."""

    gap_ms: int
    grace_ms: int = 0

    @property
    def retention_ms(self) -> int:
        """The store retention that keeps every open session visible (Kafka's default,
        gap + grace, would hide one that can still be merged into)."""
        return self.gap_ms + self.grace_ms + 1

    def __post_init__(self) -> None:
        for name in ("gap_ms", "grace_ms"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(
                    f"{name} must be a non-negative int of milliseconds, got {value!r}"
                )


class SessionUpdate(NamedTuple):
    """One emitted change. ``value`` is None for a tombstone (a merged-away session)."""

    key: Any
    start: int
    end: int
    value: Any
    timestamp: int


@dataclass(frozen=True)
class ClosedSessions:
    """Sessions a close emitted, as columns, in the order of the
    :class:`SessionUpdate` objects of the same close: ``keys``, ``starts``,
    ``ends`` (each session's timestamp is its end), and ``values``, each
    aggregate's results by name (a list, or an Arrow array of the same values; see
    ``Aggregations.finish_columns``)."""

    keys: list[Any]
    starts: list[int]
    ends: list[int]
    values: dict[str, Any]

    @property
    def count(self) -> int:
        """How many sessions closed."""
        return len(self.keys)
