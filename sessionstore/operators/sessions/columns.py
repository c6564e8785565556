"""Columnar emit-on-close session aggregation: an Arrow batch in, an Arrow table out.

The batch path of :class:`~sessionstore.operators.sessions.aggregator.SessionWindowAggregator`
turns every row into Python objects before grouping them by key. In emit-on-close
mode most of that work is not needed: most keys of a micro-batch have no open
session, their records form sessions by time alone, and most of those sessions
close within the same batch and never reach the store. This module computes them
for all keys at once, from the Arrow columns:

* keys are grouped with ``dictionary_encode`` (each distinct key is turned into a
  Python value and encoded once per batch);
* each key's records are sorted by time (stably, so ties keep arrival order) and
  split into *runs* wherever two records are more than ``gap`` apart;
* counts, sums, minima and maxima of the runs come from ``reduceat``; ``first`` and
  ``last`` are the values of a run's first and last record;
* a run that ends before the batch's close time is emitted straight from those
  arrays; the others are written to the store and the end index.

Rows stay on the record-exact replay of the batch path when they could behave
differently: every record of a key that has a late record, or a record near a
closed or hidden session (the conditions of :mod:`.vectorised_keys`). Keys with open
stored sessions read them once and merge them with their runs in Python, with the
replay's tie rules (:func:`~sessionstore.operators.batch_paths.vectorised.merge_slot`). A batch qualifies only when the
aggregation is built-in count/sum/min/max/first/last or count(c)/avg/moments/
min_by/max_by over numeric columns, sums, minima and maxima read integer columns
without nulls whose sum cannot overflow int64, and offsets are not tracked (the aggregator checks its mode and state, :func:`columnar.prepare` the
batch); otherwise :meth:`process_table` returns None and the caller uses
``process_rows``. The property tests hold the two paths equal, state included.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.encoding.keys import encode_str_keys
from sessionstore.operators.batch_paths.arrow_io import columns_of
from sessionstore.operators.batch_paths.columnar import (
    AggregateColumn,
    GroupAggregates,
    Prepared,
    empty_result,
    group_key_values,
    result_table,
    rows_result,
    sortable_keys,
    value_struct_type,
)
from sessionstore.operators.batch_paths.vectorised import FAR_PAST, merge_slot
from sessionstore.operators.sessions.model import SessionUpdate
from sessionstore.operators.sessions.replay import replay, settle
from sessionstore.operators.sessions.rule import components, gap_breaks
from sessionstore.operators.sessions.state import SessionWindowState

__all__ = ["run_final"]


def run_final(
    state: SessionWindowState, batch_in: Prepared, timestamp: str, value: Any
) -> pa.Table:
    """Process a prepared batch in emit-on-close mode, inside the store's batch;
    return the closed sessions as a table (key columns, ``start``, ``end``, ``value``
    struct, ``timestamp``) in the order :meth:`process_rows` emits them."""
    state.resolve_closing(None)  # rows before an advance may merge with them
    out = _run(state, batch_in, timestamp, value)
    state.save_times()
    return out


def _run(state: SessionWindowState, batch_in: Prepared, timestamp: str, value: Any) -> pa.Table:
    table, key_names, slots = batch_in.table, batch_in.key_names, batch_in.slots
    ts, valid, codes = batch_in.ts, batch_in.valid, batch_in.codes
    n = table.num_rows
    state.dropped_records += int(n - np.count_nonzero(valid))
    out_type = value_struct_type(state.aggregation, slots)
    rows = np.flatnonzero(valid)
    if len(rows) == 0:
        return empty_result(table, key_names, out_type)
    batch = _Batch(state, table, key_names, ts, np.where(valid, ts, FAR_PAST), rows, codes)
    batch.replay_irregular_keys(timestamp, value)
    runs = batch.runs(slots)
    py_sessions, removals = batch.merge_open_sessions(runs)
    settle(state, batch.timing, batch.emitted, batch.tracked, batch.loaded_ids, batch.open_entries)
    closing, close_step = batch.write_back(runs, py_sessions, removals)
    return batch.emissions(runs, closing, close_step, out_type)


class _Batch:
    """One batch on the columnar path: its keys, the record-exact replay of the keys
    that need it, and what the rest of the path writes and emits."""

    def __init__(self, state: SessionWindowState, table, key_names, ts, times, rows, codes) -> None:
        self.state, self.table, self.key_names, self.ts, self.rows = (
            state,
            table,
            key_names,
            ts,
            rows,
        )
        self.n = table.num_rows
        self.timing = state.timing(times, times.tolist())
        # groups: one per distinct key
        _, first_idx, self.inv = np.unique(codes[rows], return_index=True, return_inverse=True)
        self.rep_rows = rows[first_idx]
        self.key_values = group_key_values(table, key_names, self.rep_rows)
        n_groups = len(self.key_values)
        self.bad = np.zeros(n_groups, dtype=bool)
        self.bad[self.inv[~self.timing.ok[rows]]] = True
        # every open session is in the end index (the path requires it): read it once
        self.open_entries = state.open_entries()
        self.open_by_kb: dict[bytes, list[tuple[int, int]]] = {}
        for end, start, kb in self.open_entries:
            self.open_by_kb.setdefault(kb, []).append((start, end))
        self.open_kbs = set(self.open_by_kb)
        self.sortable = sortable_keys(state.store, table, key_names)
        encode = state.encode
        kbs = self._string_kbs(state, key_names) if self.sortable else None
        if kbs is not None:  # one string key column: its keys encoded together
            self.kb_of = kbs.__getitem__
            self.hot = np.array([kb in self.open_kbs for kb in kbs], dtype=bool)
        elif self.sortable:
            # Keys are encoded only where the store needs bytes (few): which keys
            # have an open session is asked of the decoded index, and output is
            # sorted by the key columns, which the default codec orders as Arrow does.
            kb_cache: dict[int, bytes] = {}

            def kb_of(g: int) -> bytes:
                kb = kb_cache.get(g)
                if kb is None:
                    kb = kb_cache[g] = encode(self.key_values[g])
                return kb

            self.kb_of = kb_of
            open_keys = {state.decode(kb) for kb in self.open_kbs}
            # equal in Python is a candidate; the bytes decide (1 == True, say)
            self.hot = np.array(
                [k in open_keys and kb_of(g) in self.open_kbs
                 for g, k in enumerate(self.key_values)],
                dtype=bool,
            )  # fmt: skip
        else:
            kbs = [encode(k) for k in self.key_values]  # raises for keys the codec refuses
            self.kb_of = kbs.__getitem__
            self.hot = np.array([kb in self.open_kbs for kb in kbs], dtype=bool)
        self.emitted: list[tuple[tuple, Any]] = []
        self.tracked: list = []
        self.loaded_ids: set[tuple[bytes, int, int]] = set()
        self.row_bad = self.bad[self.inv]

    def _string_kbs(self, state: SessionWindowState, key_names: list[str]) -> list[bytes] | None:
        """Every group's encoded key when the key is one string column of the
        default codec (``sortable``) and none holds a zero byte; else None."""
        if len(key_names) != 1:
            return None
        column = self.table.column(key_names[0])
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            return None
        return encode_str_keys(column.take(pa.array(self.rep_rows, pa.int64())).combine_chunks())

    def replay_irregular_keys(self, timestamp: str, value: Any) -> None:
        """Keys with a row that may behave differently: the record-exact replay."""
        if not self.row_bad.any():
            return
        n, kb_of = self.n, self.kb_of
        bad_rows = self.rows[self.row_bad]
        key = self.key_names[0] if len(self.key_names) == 1 else self.key_names
        sub_keys, _, sub_values = columns_of(
            self.table.take(pa.array(bad_rows)), key, timestamp, value
        )
        keys_full: list[Any] = [None] * n
        values_full: list[Any] = [None] * n
        groups: dict[bytes, list[int]] = {}
        for i, g, k, v in zip(
            bad_rows.tolist(), self.inv[self.row_bad].tolist(), sub_keys, sub_values, strict=True
        ):
            keys_full[i] = k
            values_full[i] = v
            groups.setdefault(kb_of(g), []).append(i)
        replay(
            self.state, groups, keys_full, values_full, [None] * n, self.timing, self.open_kbs,
            self.emitted, self.tracked, self.loaded_ids, allow_fast=False,
        )  # fmt: skip

    def runs(self, slots: list[AggregateColumn]) -> _Runs:
        """Every other key: runs of its records, sorted by time within the key."""
        good = ~self.row_bad
        grows, gg = self.rows[good], self.inv[good]
        order = np.lexsort((self.ts[grows], gg))
        srows = grows[order]
        return _Runs(srows, gg[order], self.ts[srows], self.state.gap, slots)

    def merge_open_sessions(self, runs: _Runs) -> tuple[list, list]:
        """Keys with open stored sessions merge them with their runs, in Python.
        Returns the new sessions ``(group, start, end, acc)`` and the stored ones they
        absorbed ``(group, start, end)``."""
        py_sessions: list[tuple[int, int, int, list]] = []
        removals: list[tuple[int, int, int]] = []
        if not len(runs.g) or not self.hot.any():
            return py_sessions, removals
        gap, emitted_close, kb_of = self.state.gap, self.state.emitted_close, self.kb_of
        hot_groups = np.flatnonzero(self.hot & ~self.bad)
        lo_all = np.searchsorted(runs.g, hot_groups, side="left")
        hi_all = np.searchsorted(runs.g, hot_groups, side="right")
        # the open sessions within gap of each hot key's records, read in one pass
        wanted: list[tuple[bytes, int, int]] = []
        owners: list[tuple[int, int, int, int]] = []  # (group, lo, hi, first wanted)
        for g, lo, hi in zip(hot_groups.tolist(), lo_all.tolist(), hi_all.tolist(), strict=True):
            if lo == hi:
                continue
            kb = kb_of(g)
            lo_end, hi_start = int(runs.start[lo]) - gap, int(runs.end[hi - 1]) + gap
            first = len(wanted)
            for start, end in self.open_by_kb[kb]:
                if (
                    end >= lo_end
                    and start <= hi_start
                    and (emitted_close is None or end >= emitted_close)
                ):
                    wanted.append((kb, start, end))
            owners.append((g, lo, hi, first))
        values = self.state.store.fetch_encoded(wanted)
        bounds = [first for *_, first in owners[1:]] + [len(wanted)] if owners else []
        merging = []
        for (g, lo, hi, first), last in zip(owners, bounds, strict=True):
            stored = [
                (start, end, acc)
                for (_, start, end), acc in zip(wanted[first:last], values[first:last], strict=True)
                if acc is not None
            ]
            if stored:
                merging.append((g, lo, hi, stored))
        if merging:  # the accumulators of every merging key's runs, built at once
            accs = runs.accs(np.concatenate([np.arange(lo, hi) for _, lo, hi, _ in merging]))
            at = 0
            for g, lo, hi, stored in merging:
                mine = accs[at : at + hi - lo]
                _merge_stored(runs, g, lo, hi, mine, stored, gap, py_sessions, removals)
                at += hi - lo
        for g, start, end in removals:
            self.loaded_ids.add((kb_of(g), start, end))
        return py_sessions, removals

    def write_back(self, runs: _Runs, py_sessions: list, removals: list):
        """Store and index the columnar keys' sessions (removals first, so that a
        re-put of a window wins) and collect the Python sessions' emissions.
        Returns the runs that close in this batch and their close steps."""
        state, n, kb_of, key_values = self.state, self.n, self.kb_of, self.key_values
        store, index, close_l = state.store, state.index, self.timing.close_l
        final_vis = self.timing.final_vis
        for g, start, end in removals:
            store.remove(key_values[g], start, end)
            index.discard(kb_of(g), start, end)
        plain = np.flatnonzero(runs.plain)
        p_close = np.searchsorted(self.timing.close_arr, runs.end[plain], side="right")
        stays = p_close >= n
        keep = runs.end[plain] >= final_vis
        certain = state.certain_close(state.stream_time)
        if certain is not None:
            # open after the batch, but certain to close at the next advance: kept
            # apart, in one block row, instead of a segment row and an index entry each
            apart = stays & (runs.end[plain] < certain)
            if apart.any():
                idx = plain[apart]
                kbs = [kb_of(g) for g in runs.g[idx].tolist()]
                state.keep_apart(kbs, runs.start[idx], runs.end[idx], runs.accs(idx))
                stays &= ~apart
                keep &= ~apart
        to_put = plain[keep]
        if len(to_put):
            store.put_many(
                zip(
                    [key_values[g] for g in runs.g[to_put].tolist()],
                    runs.start[to_put].tolist(), runs.end[to_put].tolist(),
                    runs.accs(to_put), strict=True,
                )
            )  # fmt: skip
        stays_open = plain[stays]
        index.add_many(
            zip(
                [kb_of(g) for g in runs.g[stays_open].tolist()],
                runs.start[stays_open].tolist(), runs.end[stays_open].tolist(), strict=True,
            )
        )  # fmt: skip
        finish = state.aggregation.finish
        for g, start, end, acc in py_sessions:
            kb = kb_of(g)
            j = bisect_right(close_l, end)
            if j < n:
                update = SessionUpdate(key_values[g], start, end, finish(acc), end)
                self.emitted.append(((j, end, start, kb), update))
            else:
                index.add(kb, start, end)
            if end >= final_vis:
                store.put(key_values[g], start, end, acc)
        return plain[p_close < n], p_close[p_close < n]

    def emissions(self, runs, closing, close_step, out_type) -> pa.Table:
        """Columnar runs and Python updates, in (close step, end, start, key) order."""
        table, key_names, emitted = self.table, self.key_names, self.emitted
        columnar = _emission_table(table, key_names, runs, closing, self.rep_rows, out_type)
        updates = [u for _, u in emitted]
        python = rows_result(
            table, key_names, [u.key for u in updates], [u.start for u in updates],
            [u.end for u in updates], [u.value for u in updates], out_type,
        )  # fmt: skip
        both = pa.concat_tables([columnar, python])
        sort_cols: dict[str, Any] = {
            "j": np.concatenate([close_step, [e[0][0] for e in emitted]]).astype(np.int64),
            "end": both.column("end"),
            "start": both.column("start"),
        }
        if self.sortable:
            for i, k in enumerate(key_names):
                sort_cols[f"k{i}"] = both.column(k)
        else:
            sort_cols["k0"] = pa.array(
                [self.kb_of(g) for g in runs.g[closing].tolist()] + [e[0][3] for e in emitted],
                pa.binary(),
            )
        order = pc.sort_indices(
            pa.table(sort_cols), sort_keys=[(name, "ascending") for name in sort_cols]
        )
        return both.take(order)


class _Runs(GroupAggregates):
    """Runs of records of the columnar keys: records of one key sorted by time, split
    wherever two are more than ``gap`` apart, with their aggregates; ``g`` is each
    run's key group, ``start``/``end`` its first and last time."""

    def __init__(self, srows, sg, sts, gap, slots) -> None:
        super().__init__(srows, sts, gap_breaks(sg, sts, gap), slots)
        self.g = sg[self.a]
        self.plain = np.ones(len(self.a), dtype=bool)

    @property
    def start(self) -> np.ndarray:
        return self.first_ts

    @property
    def end(self) -> np.ndarray:
        return self.last_ts


def _merge_stored(runs: _Runs, g, lo, hi, accs, stored, gap, py_sessions, removals) -> None:
    """Merge key ``g``'s runs ``lo..hi`` (their accumulators ``accs``) with its open
    stored sessions: components under "within gap", each a new session when it holds
    a run (stored-only ones stay)."""
    idx = np.arange(lo, hi)
    fns = [s.fn for s in runs.slots]
    items = [(s, e, 0, k) for k, (s, e, _) in enumerate(stored)]
    items += [
        (int(s), int(e), 1, k)
        for k, (s, e) in enumerate(
            zip(runs.start[idx].tolist(), runs.end[idx].tolist(), strict=True)
        )
    ]
    for start, end, run_ks, stored_ks in components(items, gap):
        if not run_ks:
            continue
        acc = list(accs[run_ks[0]])
        for k in run_ks[1:]:  # later runs in time order
            acc = [merge_slot(fn, a, b) for fn, a, b in zip(fns, acc, accs[k], strict=True)]
        for k in sorted(stored_ks, key=lambda k: (stored[k][1], stored[k][0])):
            s_start, s_end, s_acc = stored[k]
            acc = [merge_slot(fn, s_acc[j], acc[j]) for j, fn in enumerate(fns)]
            removals.append((g, s_start, s_end))
        runs.plain[lo + np.array(run_ks)] = False
        py_sessions.append((g, start, end, acc))


def _emission_table(table, key_names, runs: _Runs, idx, rep_rows, out_type) -> pa.Table:
    if not len(idx):
        return empty_result(table, key_names, out_type)
    rows = pa.array(rep_rows[runs.g[idx]], pa.int64())
    keys = [table.column(k).take(rows) for k in key_names]
    fields = [runs.result_array(j, idx, f.type) for j, f in enumerate(out_type)]
    value = pa.StructArray.from_arrays(fields, fields=list(out_type))
    return result_table(
        key_names,
        keys,
        pa.array(runs.start[idx], pa.int64()),
        pa.array(runs.end[idx], pa.int64()),
        value,
    )
