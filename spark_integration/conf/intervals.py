"""Spark-style interval strings ("10 minutes", "1 hour 30 minutes") to milliseconds."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["interval_ms"]

_UNITS = {
    "ms": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
    "w": 604_800_000, "week": 604_800_000, "weeks": 604_800_000,
}  # fmt: skip
_PART = re.compile(r"\s*(\d+)\s*([a-zA-Z]+)\s*")


def interval_ms(value: Any, name: str = "interval") -> int:
    """Milliseconds of an int (already ms) or an interval string such as
    ``"30 minutes"``, ``"1 hour 30 minutes"`` or ``"500 ms"``."""
    if type(value) is int:
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be an interval string like '10 minutes', got {value!r}")
    text = value.strip().lower()
    if text.startswith("interval "):
        text = text[len("interval ") :]
    total, pos = 0, 0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        unit = _UNITS.get(match.group(2))
        if unit is None:
            raise ValueError(f"{name}: unknown unit {match.group(2)!r} in {value!r}")
        total += int(match.group(1)) * unit
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"{name} must be an interval string like '10 minutes', got {value!r}")
    return total
