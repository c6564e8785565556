"""The value objects of time-window aggregation: its windows and what it emits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["TimeWindows", "WindowUpdate"]


@dataclass(frozen=True)
class TimeWindows:
    """Tumbling (``advance_ms`` None or equal to the size) or hopping windows."""

    size_ms: int
    advance_ms: int | None = None
    grace_ms: int = 0

    def __post_init__(self) -> None:
        if type(self.size_ms) is not int or self.size_ms <= 0:
            raise ValueError(f"size_ms must be a positive int, got {self.size_ms!r}")
        advance = self.size_ms if self.advance_ms is None else self.advance_ms
        if type(advance) is not int or not 0 < advance <= self.size_ms:
            raise ValueError(
                f"advance_ms must be a positive int no larger than size_ms={self.size_ms}, "
                f"got {self.advance_ms!r}"
            )
        object.__setattr__(self, "advance_ms", advance)
        if type(self.grace_ms) is not int or self.grace_ms < 0:
            raise ValueError(f"grace_ms must be a non-negative int, got {self.grace_ms!r}")

    @property
    def retention_ms(self) -> int:
        """The store retention that keeps a window visible until it closes."""
        return self.size_ms + self.grace_ms

    def starts_for(self, ts: int) -> range:
        """Starts of every window containing ``ts``, ascending."""
        advance = self.advance_ms
        first = (ts - self.size_ms) // advance * advance + advance
        return range(first, ts // advance * advance + 1, advance)


class WindowUpdate(NamedTuple):
    """An emitted window value; ``end`` is exclusive."""

    key: Any
    start: int
    end: int
    value: Any
    timestamp: int
    kind: str
