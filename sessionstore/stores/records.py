"""Immutable value objects that cross module boundaries."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["SessionWindow", "VersionedRecord", "VALID_TO_UNDEFINED", "PUT_REJECTED"]

#: ``VersionedStore.put`` result: the record became the latest version.
VALID_TO_UNDEFINED = -1
#: ``VersionedStore.put`` result: the record was older than the grace period.
PUT_REJECTED = -(2**63)


class SessionWindow(NamedTuple):
    """A session of ``key`` covering ``[start, end]`` (both inclusive, epoch ms)."""

    key: Any
    start: int
    end: int


class VersionedRecord(NamedTuple):
    """One version of a key: valid from ``timestamp`` (inclusive) to ``valid_to``
    (exclusive). ``valid_to`` is None for the latest version."""

    value: Any
    timestamp: int
    valid_to: int | None = None
