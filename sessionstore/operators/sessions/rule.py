"""The session merge rule, in one place: every path of session aggregation calls it.

* Two events (or an event and a session, or two sessions) belong to one session
  when the later one starts at most ``gap`` after the earlier one ends
  (:func:`within_gap`: an inclusive gap, as Spark's ``session_window`` and KIP-94).
* The **merge candidates** of an event at ``ts`` are the sessions of its key with
  ``end >= ts - gap`` and ``start <= ts + gap`` (:func:`candidate_bounds`), and only
  those still visible and, in emit-on-close mode, open (the ``floor``).
* The merged session spans the event and its candidates (:func:`merged_window`); it
  is **late**, and the event dropped, when it ends before the close time
  (:func:`is_late`), which is the judged time minus gap and grace
  (:func:`close_time`).
* Accumulators fold older into newer, slot by slot
  (:func:`~sessionstore.operators.batch_paths.vectorised.merge_slot`, which windows share: the
  older keeps ``first`` on a tie, the newer takes ``last``).

The record path (:mod:`.aggregator`) and the record-exact replay (:mod:`.replay`)
apply it event by event. The vectorised (:mod:`.vectorised_keys`) and columnar
(:mod:`.columns`) paths apply it to whole sorted columns at once through
:func:`gap_breaks`, the vectorised form of :func:`within_gap`, and merge stored
sessions with :func:`components`; a property test holds the two forms equal.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "within_gap", "gap_breaks", "candidate_bounds", "merged_window", "close_time", "is_late",
    "components",
]  # fmt: skip


def within_gap(end: int, start: int, gap: int) -> bool:
    """Whether something starting at ``start`` joins a session ending at ``end``."""
    return start - end <= gap


def gap_breaks(groups: np.ndarray, times: np.ndarray, gap: int) -> np.ndarray:
    """The vectorised :func:`within_gap`: over rows sorted by group then time, True
    where a new session starts (a group's first row, or a row more than ``gap``
    after the one before it)."""
    new = np.ones(len(times), dtype=bool)
    if len(times):
        new[1:] = (groups[1:] != groups[:-1]) | (times[1:] - times[:-1] > gap)
    return new


def candidate_bounds(ts: int, gap: int, floor: int | None = None) -> tuple[int, int]:
    """``(lowest end, highest start)`` of an event's merge candidates; ``floor``: the
    lowest end still visible (and open, in emit-on-close mode)."""
    lo_end = ts - gap
    if floor is not None and floor > lo_end:
        lo_end = floor
    return lo_end, ts + gap


def merged_window(ts: int, candidates: Iterable[Any]) -> tuple[int, int]:
    """The session an event at ``ts`` and its candidates (with ``start`` and ``end``)
    form."""
    start = end = ts
    for c in candidates:
        if c.start < start:
            start = c.start
        if c.end > end:
            end = c.end
    return start, end


def close_time(judged: int, gap: int, grace: int) -> int:
    """Sessions ending before this are closed, at the judged time ``judged``."""
    return judged - gap - grace


def is_late(end: int, close: int) -> bool:
    """Whether a merged session ending at ``end`` is closed already (its event is
    dropped)."""
    return end < close


def components(
    items: Iterable[tuple[int, int, int, int]], gap: int
) -> list[tuple[int, int, list[int], list[int]]]:
    """Merge intervals ``(start, end, kind, number)`` (kind 0: a stored session, 1: a
    run of new events) into sessions under :func:`within_gap`: ``(start, end, numbers
    of the runs, numbers of the stored sessions)`` by start."""
    comps: list[tuple[int, int, list[int], list[int]]] = []
    for start, end, kind, k in sorted(items):
        if comps and within_gap(comps[-1][1], start, gap):
            c_start, c_end, runs, stored = comps[-1]
            comps[-1] = (c_start, max(c_end, end), runs, stored)
        else:
            runs, stored = [], []
            comps.append((start, end, runs, stored))
        (stored if kind == 0 else runs).append(k)
    return comps
