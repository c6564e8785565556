"""Columnar emit-on-close window aggregation: an Arrow batch in, an Arrow table out.

The window counterpart of :mod:`sessionstore.operators.sessions.columns`, for
:class:`~sessionstore.operators.windows.aggregator.WindowAggregator` with ``emit="final"``,
no early emission and built-in count/sum/min/max/first/last aggregates (the same
column rules). Every record is paired with each window that contains it; a pair
counts when the window is still open after the record moved stream time (``end +
grace > stream time``), as on the record path. Pairs are grouped by (key, window)
with numpy; each group's aggregates come from ``reduceat`` over its records sorted
by time (stably, so ``first`` and ``last`` break ties by arrival as the record path
does) and are merged into the window's stored value, if any. A window fires at the
first record whose stream time reaches ``end + grace``; emissions are ordered by
that record, then end, start and key, as the record path fires them.

The property test holds it equal to the record path: emissions, windows in the
store, pending windows, stream time and drop counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from sessionstore.operators.batch_paths.columnar import (
    GroupAggregates,
    Prepared,
    empty_result,
    group_key_values,
    rows_result,
    value_struct_type,
)
from sessionstore.operators.batch_paths.vectorised import FAR_PAST, merge_slot
from sessionstore.operators.windows.state import WindowState

__all__ = ["run_final"]


def run_final(state: WindowState, batch_in: Prepared, timestamp: str, value: Any) -> pa.Table:
    """Process a prepared batch inside the store's batch; return the windows it closes
    as a table (key columns, ``start``, exclusive ``end``, ``value`` struct,
    ``timestamp``, ``kind``) in the record path's order. (``timestamp`` and
    ``value`` name the batch's columns, which ``batch_in`` has already read.)"""
    table, key_names, slots = batch_in.table, batch_in.key_names, batch_in.slots
    ts, valid, codes = batch_in.ts, batch_in.valid, batch_in.codes
    store, pending, windows = state.store, state.pending, state.windows
    size, grace = windows.size_ms, windows.grace_ms
    n = table.num_rows
    out_type = value_struct_type(state.aggregation, slots)
    state.dropped_records += int(n - np.count_nonzero(valid))
    rows = np.flatnonzero(valid)
    if len(rows) == 0:
        return _with_kind(empty_result(table, key_names, out_type))
    # the time each row is judged by (see WindowState.judged_times)
    prefix, end_time = state.judged_times(np.where(valid, ts, FAR_PAST))

    pair_row, pair_start = _open_pairs(state, ts, rows, prefix)
    _, first_idx, inv = np.unique(codes[rows], return_index=True, return_inverse=True)
    key_values = group_key_values(table, key_names, rows[first_idx])
    groups, w_g, w_start = _window_groups(ts, rows, inv, pair_row, pair_start, slots)
    w_end = w_start + size

    encode = state.encode
    kbs = {g: encode(key_values[g]) for g in np.unique(w_g).tolist()}
    w_kb = [kbs[g] for g in w_g.tolist()]
    stored = store.fetch_encoded(
        list(zip(w_kb, w_start.tolist(), (w_end - 1).tolist(), strict=True))
    )
    open_entries = pending.all()  # (end, start, kb), read once for the whole batch
    was_pending = {(kb, start) for _, start, kb in open_entries}
    # a window fires at the first record whose stream time reaches end + grace
    w_fire = np.searchsorted(prefix, w_end + grace, side="left")

    # the batch's aggregates of each window, then merged into its stored value
    fns = [slot.fn for slot in slots]
    accs = groups.accs()
    for i, old in enumerate(stored):
        if old is not None:
            accs[i] = [merge_slot(fn, old[j], accs[i][j]) for j, fn in enumerate(fns)]

    # pending windows the batch did not touch that its stream time makes due, read
    # before the writes move the store's stream time (the record path fires them
    # before the puts of the record that makes them due)
    starts, ends, fires = w_start.tolist(), w_end.tolist(), w_fire.tolist()
    final_due = int(prefix[-1]) - grace + 1
    untouched = _untouched_due(state, open_entries, set(zip(w_kb, starts, strict=True)), final_due)
    values = store.fetch_encoded([(kb, start, end - 1) for kb, start, end in untouched])

    # writes: every touched window's value; the pending index as the record path leaves it
    store.put_many(
        zip(
            [key_values[g] for g in w_g.tolist()], starts, (w_end - 1).tolist(), accs, strict=True
        )  # fmt: skip
    )
    finish = state.aggregation.finish
    emitted: list[tuple[int, int, int, bytes, Any, Any]] = []  # j, end, start, kb, key, value
    for i, g in enumerate(w_g.tolist()):
        kb, start, end, j = w_kb[i], starts[i], ends[i], fires[i]
        in_pending = (kb, start) in was_pending or stored[i] is None
        if not in_pending:
            continue  # stored without a pending entry: never fires (as on the record path)
        if j < n:
            emitted.append((j, end, start, kb, key_values[g], finish(accs[i])))
            if (kb, start) in was_pending:
                pending.discard(kb, start, end)
        elif stored[i] is None:
            pending.add(kb, start, end)
    decode = state.decode
    for (kb, start, end), acc in zip(untouched, values, strict=True):
        pending.discard(kb, start, end)
        if acc is not None:
            j = int(np.searchsorted(prefix, end + grace, side="left"))
            emitted.append((j, end, start, kb, decode(kb), finish(acc)))
    state.advance(end_time)
    state.fired_due = final_due
    emitted.sort(key=lambda e: e[:4])
    return _with_kind(_emitted_table(table, key_names, emitted, out_type))


def _open_pairs(
    state: WindowState, ts: np.ndarray, rows: np.ndarray, prefix: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every (record, window start) pair whose window is still open at the time the
    record is judged by (record numbers index ``rows``); counts the records that
    land in no open window as dropped."""
    windows = state.windows
    size, advance, grace = windows.size_ms, windows.advance_ms, windows.grace_ms
    r_ts, r_st = ts[rows], prefix[rows]
    first = (r_ts - size) // advance * advance + advance
    per = -(-size // advance)  # windows a record can fall in
    pair_row = np.repeat(np.arange(len(rows)), per)
    pair_start = (first[:, None] + advance * np.arange(per)[None, :]).ravel()
    keep = (pair_start <= np.repeat(r_ts, per)) & (pair_start + size + grace > np.repeat(r_st, per))
    pair_row, pair_start = pair_row[keep], pair_start[keep]
    accepted = np.zeros(len(rows), dtype=bool)
    accepted[pair_row] = True
    state.dropped_records += int(len(rows) - np.count_nonzero(accepted))
    return pair_row, pair_start


def _window_groups(ts, rows, inv, pair_row, pair_start, slots):
    """The pairs grouped by (key group, window), records by time within (ties by
    arrival), with their aggregates; each group's key group and window start."""
    pair_g = inv[pair_row]
    pair_rows = rows[pair_row]
    order = np.lexsort((pair_rows, ts[pair_rows], pair_start, pair_g))
    pg, pstart, prow = pair_g[order], pair_start[order], pair_rows[order]
    brk = np.ones(len(order), dtype=bool)
    if len(order):
        brk[1:] = (pg[1:] != pg[:-1]) | (pstart[1:] != pstart[:-1])
    groups = GroupAggregates(prow, ts[prow], brk, slots)
    return groups, pg[groups.a], pstart[groups.a]


def _untouched_due(state: WindowState, open_entries, touched, final_due: int) -> list:
    """Pending windows the batch did not touch that its time makes due ``(kb, start,
    end)``, read before the writes move the store's stream time (the record path
    fires them before the puts of the record that makes them due)."""
    fired_due = FAR_PAST if state.fired_due is None else state.fired_due
    return [
        (kb, start, end)
        for end, start, kb in open_entries
        if fired_due <= end < final_due and (kb, start) not in touched
    ]


def _emitted_table(table, key_names, emitted, out_type) -> pa.Table:
    return rows_result(
        table, key_names, [e[4] for e in emitted], [e[2] for e in emitted],
        [e[1] for e in emitted], [e[5] for e in emitted], out_type,
    )  # fmt: skip


def _with_kind(table: pa.Table) -> pa.Table:
    return table.append_column("kind", pa.array(["final"] * table.num_rows, pa.string()))
