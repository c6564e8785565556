"""Vectorised batch path of session aggregation for the common, in-order case.

:mod:`~sessionstore.operators.sessions.replay` replays each key's records in
memory, which is exact for any input but costs Python work per record. For a key whose records provably behave like a sorted stream, the result
is computed for all such keys at once with numpy instead: sort by key (records
keep arrival order within a key), split where the time difference exceeds the gap,
and aggregate each session with cumulative sums, per-session accumulates or
``reduceat``.

A key takes this path only when the outcome cannot differ from the replay:

* the aggregation is built-in and order-independent (count, sum, min, max, first,
  last; not collect), over int values, and offsets are not tracked;
* the key's records arrive in non-decreasing time order (in final mode, which
  emits only closures, they are sorted by time first: the sessions and these
  aggregates do not depend on arrival order), none before the end of its latest
  stored session (so only that session can be a merge candidate);
* no record is late (``ts >= close_time``), every session within gap of a record
  is visible in the store (``ts - gap >= visibility bound``), and, in final mode,
  still open (``ts - gap >= close_time``).

Everything else stays on the replay, and the property test holds both equal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sessionstore.operators.batch_paths.vectorised import (
    FAR_PAST,
    INT_LIMIT,
    SUM_LIMIT,
    built_in_functions,
    merge_slot,
)
from sessionstore.operators.sessions.model import SessionUpdate
from sessionstore.operators.sessions.rule import gap_breaks, within_gap
from sessionstore.operators.sessions.state import Session

__all__ = ["fast_path_columns", "run_fast_keys", "run_fast_final"]


def fast_path_columns(aggregation: Any, values: list[Any]) -> list[list[Any]] | None:
    """Per-slot value columns if the batch may use the fast path, else None."""
    functions = built_in_functions(aggregation)
    if functions is None:
        return None
    columns: list[list[Any]] = []
    for fn, column in zip(functions, aggregation.columns, strict=True):
        if fn == "count":
            columns.append([])
            continue
        try:
            col = values if column is None else [v[column] for v in values]
        except (TypeError, KeyError, IndexError):
            return None
        if fn in ("sum", "min", "max"):
            # exact int arithmetic only: floats sum differently in another order, and
            # a sum of the whole column must not overflow int64
            for v in col:
                if type(v) is not int or not -INT_LIMIT < v < INT_LIMIT:
                    return None
            if fn == "sum" and col and max(map(abs, col)) * len(col) >= SUM_LIMIT:
                return None
        columns.append(col)
    return columns


def run_fast_keys(
    fast_keys: list[tuple[Any, bytes, list[int], Session | None]],
    ts_l: list[int],
    columns: list[list[Any]],
    aggregation: Any,
    gap: int,
    emitted: list,
    tracked: list,
) -> None:
    """Update mode: aggregate the records of ``fast_keys`` (key, kb, record indices,
    latest stored session or None) and append every record's updates and the
    sessions as the replay would."""
    functions = aggregation.functions
    order = [i for _, _, idxs, _ in fast_keys for i in idxs]  # by key, then arrival
    counts = [len(idxs) for _, _, idxs, _ in fast_keys]
    n = len(order)
    ts = np.array([ts_l[i] for i in order], dtype=np.int64)
    group = np.repeat(np.arange(len(fast_keys)), counts)
    group_first = np.zeros(n, dtype=bool)
    group_first[np.cumsum([0, *counts[:-1]])] = True
    # a key's first record continues its latest stored session when within gap
    stored_end = np.array(
        [s.end if s is not None else FAR_PAST for *_, s in fast_keys], dtype=np.int64
    )
    continues = group_first & within_gap(stored_end[group], ts, gap)
    starts_new = gap_breaks(group, ts, gap)
    first_pos = np.flatnonzero(starts_new)
    sid = np.cumsum(starts_new) - 1
    last_pos = np.append(first_pos[1:] - 1, n - 1)
    position = np.arange(n)

    # running value of each slot at each record, within its session
    running: list[list[Any]] = []
    for fn, col in zip(functions, columns, strict=True):
        if fn == "count":
            running.append((position - first_pos[sid] + 1).tolist())
        elif fn == "sum":
            arr = np.array([col[i] for i in order], dtype=np.int64)
            cs = np.cumsum(arr)
            running.append((cs - (cs[first_pos] - arr[first_pos])[sid]).tolist())
        elif fn in ("min", "max"):
            arr = np.array([col[i] for i in order], dtype=np.int64)
            accumulate = np.minimum.accumulate if fn == "min" else np.maximum.accumulate
            out = np.empty(n, dtype=np.int64)
            for a, b in zip(first_pos.tolist(), (last_pos + 1).tolist(), strict=True):
                out[a:b] = accumulate(arr[a:b])
            running.append(out.tolist())
        else:  # first / last pick record values
            running.append([col[i] for i in order])

    ts_list = ts.tolist()
    group_list = group[first_pos].tolist()
    cont_list = continues[first_pos].tolist()
    finish = aggregation.finish
    width = range(len(functions))
    for a, b, g, cont in zip(
        first_pos.tolist(), last_pos.tolist(), group_list, cont_list, strict=True
    ):
        key, kb, _, stored = fast_keys[g]
        prior = stored.acc if cont else None
        start = stored.start if cont else ts_list[a]
        prev_end = stored.end if cont else None
        for p in range(a, b + 1):
            acc = [_slot(functions[j], running[j], ts_list, a, p, prior, j) for j in width]
            i, t = order[p], ts_list[p]
            if prev_end is not None and prev_end != t:  # a new window replaces it
                emitted.append(((i, 0), SessionUpdate(key, start, prev_end, None, prev_end)))
            emitted.append(((i, 1), SessionUpdate(key, start, t, finish(acc), t)))
            prev_end = t
        if cont:
            stored.removed_at = order[a]
        tracked.append((key, kb, Session(start, ts_list[b], acc, None, False)))


def _slot(fn: str, run: list, ts: list, a: int, p: int, prior: list | None, j: int) -> Any:
    """Slot ``j`` after the records ``a..p`` of a session, merged into ``prior``
    (the continued stored session's accumulator) the way the record path merges."""
    if fn == "first":
        mine = [ts[a], run[a]]
    elif fn == "last":
        mine = [ts[p], run[p]]
    else:
        mine = run[p]
    return mine if prior is None else merge_slot(fn, prior[j], mine)


def run_fast_final(
    fast_keys: list[tuple[Any, bytes, list[int], list[Session]]],
    ts_l: list[int],
    columns: list[list[Any]],
    aggregation: Any,
    gap: int,
    tracked: list,
) -> None:
    """Final mode: sessions of ``fast_keys`` (key, kb, record indices sorted by time,
    open stored sessions in (end, start) order) for keys whose records may arrive in
    any order. Only closures are emitted in this mode, and they are computed from
    ``tracked`` by the caller, so this only forms the sessions.

    With no late record and every candidate open and visible, a key's sessions are
    the components of its stored sessions and records under "within gap", whatever
    the arrival order; counts, sums, minima and maxima do not depend on it either.
    Ties follow the record path: a stored value keeps ``first`` on a tie, a record
    takes ``last`` on a tie, and among records the earliest arrival is first and the
    latest is last (the sort is stable).
    """
    order = [i for _, _, idxs, _ in fast_keys for i in idxs]
    if not order:
        return
    # components: (key index, first record position, end position, stored sessions,
    # start, end). Keys without stored sessions (most, in a stream) are split on
    # gaps with numpy; the others merge records and stored sessions one by one.
    comps = _record_components(fast_keys, ts_l, order, gap)
    _add_stored_components(fast_keys, ts_l, order, gap, comps)
    with_records = [c for c in comps if c[2] > c[1]]
    if not with_records:
        return
    with_records.sort(key=lambda c: c[1])  # reduceat needs them in record order
    functions = aggregation.functions
    reduced = _reduce_components(with_records, functions, columns, ts_l, order)
    width = range(len(functions))
    append = tracked.append
    all_slots = zip(*reduced, strict=True) if reduced else [()] * len(with_records)
    for (g, a, _b, stored, start, end), slots in zip(with_records, all_slots, strict=True):
        key, kb, _, _ = fast_keys[g]
        acc = list(slots)
        if stored:
            for s in sorted(stored, key=lambda s: (s.end, s.start)):
                acc = [merge_slot(functions[j], s.acc[j], acc[j]) for j in width]
                s.removed_at = order[a]
        append((key, kb, Session(start, end, acc, None, False)))


Component = tuple[int, int, int, list[Any], int, int]


def _add_stored_components(
    fast_keys: list[tuple[Any, bytes, list[int], list[Session]]],
    ts_l: list[int],
    order: list[int],
    gap: int,
    comps: list[Component],
) -> None:
    """Append the components of the keys with stored sessions: their records (in
    ``order``) and stored sessions swept by start, merged while within gap."""
    pos = 0
    for g, (_, _, idxs, stored) in enumerate(fast_keys):
        if not stored:
            pos += len(idxs)
            continue
        items_stored = sorted(stored, key=lambda s: s.start)
        si = 0
        a = pos
        b = pos + len(idxs)
        p = a
        while p < b or si < len(items_stored):
            # next item by start: a stored session or a record
            take_stored = si < len(items_stored) and (
                p >= b or items_stored[si].start <= ts_l[order[p]]
            )
            if take_stored:
                s = items_stored[si]
                item_start, item_end = s.start, s.end
            else:
                item_start = item_end = ts_l[order[p]]
            if comps and comps[-1][0] == g and within_gap(comps[-1][5], item_start, gap):
                kg, ca, cb, cst, cstart, cend = comps[-1]
                if take_stored:
                    cst = [*cst, s]
                    si += 1
                else:
                    cb = p + 1
                    p += 1
                comps[-1] = (kg, ca, cb, cst, min(cstart, item_start), max(cend, item_end))
            else:
                if take_stored:
                    comps.append((g, p, p, [s], item_start, item_end))
                    si += 1
                else:
                    comps.append((g, p, p + 1, [], item_start, item_end))
                    p += 1
        pos = b


def _reduce_components(
    with_records: list[Component],
    functions: list[str],
    columns: list[list[Any]],
    ts_l: list[int],
    order: list[int],
) -> list[list[Any]]:
    """Each slot's value over the records of each component (in record order)."""
    starts = np.array([c[1] for c in with_records], dtype=np.int64)
    reduced: list[list[Any]] = []
    for fn, col in zip(functions, columns, strict=True):
        if fn == "count":
            reduced.append([c[2] - c[1] for c in with_records])
        elif fn in ("sum", "min", "max"):
            arr = np.array([col[i] for i in order], dtype=np.int64)
            ufunc = {"sum": np.add, "min": np.minimum, "max": np.maximum}[fn]
            reduced.append(ufunc.reduceat(arr, starts).tolist())
        elif fn == "first":
            reduced.append([[ts_l[order[c[1]]], col[order[c[1]]]] for c in with_records])
        else:
            reduced.append([[ts_l[order[c[2] - 1]], col[order[c[2] - 1]]] for c in with_records])
    return reduced


def _record_components(
    fast_keys: list[tuple[Any, bytes, list[int], list[Any]]],
    ts_l: list[int],
    order: list[int],
    gap: int,
) -> list[tuple[int, int, int, list[Any], int, int]]:
    """Components of the keys with no stored session: their records, sorted by time
    per key in ``order``, split where the key changes or two records are more than
    ``gap`` apart."""
    lengths = np.array([len(idxs) for _, _, idxs, _ in fast_keys], dtype=np.int64)
    plain = np.array([not stored for _, _, _, stored in fast_keys], dtype=bool)
    gid = np.repeat(np.arange(len(fast_keys)), lengths)
    keep = plain[gid]
    if not keep.any():
        return []
    times = np.asarray(ts_l, dtype=np.int64)[np.asarray(order, dtype=np.int64)]
    positions = np.flatnonzero(keep)
    g, t = gid[keep], times[keep]
    new = gap_breaks(g, t, gap)
    new[1:] |= positions[1:] != positions[:-1] + 1
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(t)) - 1
    return [
        (kg, a, b + 1, [], start, end)
        for kg, a, b, start, end in zip(
            g[first].tolist(), positions[first].tolist(), positions[last].tolist(),
            t[first].tolist(), t[last].tolist(), strict=True,
        )
    ]  # fmt: skip
