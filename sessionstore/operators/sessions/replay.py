"""The record-exact replay of a batch of session records.

Each key's records are replayed in memory, in arrival order, against the
stream-time prefix of the whole batch (:meth:`SessionWindowState.timing`), which decides
closing and visibility exactly as the record path does; the store is read once per
key and each surviving session written once (:func:`settle`). Keys whose records
provably behave like a sorted stream take the vectorised path of
:mod:`~sessionstore.operators.sessions.vectorised_keys` instead. The columnar path replays
its irregular keys here too. The property tests hold the replay equal to the
record path, state included.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import numpy as np

from sessionstore.encoding.keys import TS_MAX, TS_MIN, check_timestamp
from sessionstore.operators.batch_paths.vectorised import FAR_PAST
from sessionstore.operators.sessions.model import SessionUpdate
from sessionstore.operators.sessions.rule import candidate_bounds, is_late, merged_window
from sessionstore.operators.sessions.state import Session, SessionWindowState, Timing
from sessionstore.operators.sessions.vectorised_keys import (
    fast_path_columns,
    run_fast_final,
    run_fast_keys,
)

__all__ = ["replay_rows", "replay", "settle", "group", "net_of", "stored_values", "net_changes"]

#: ``(sort key, update)``: the sort key orders a batch's emissions as the record
#: path emits them.
Emitted = list[tuple[tuple, SessionUpdate]]
#: ``(key, encoded key, session)`` of every session a batch replay knows.
Tracked = list[tuple[Any, bytes, Session]]
#: ``(encoded key, start, end)``: a session's identity.
SessionId = tuple[bytes, int, int]


def replay_rows(
    state: SessionWindowState,
    keys: Sequence[Any],
    timestamps: Sequence[int | None],
    values: Sequence[Any],
    offsets: Sequence[int | None],
    net: bool = False,
) -> list[SessionUpdate]:
    """A batch's updates (its net change with ``net``), replayed in memory and
    written back, as ``process`` on each row in order would give them. The caller
    holds the store's batch and saves the times after."""
    groups, times, offsets = group(state, keys, timestamps, offsets)
    if not groups:
        return []
    timing = state.timing(np.array(times, dtype=np.int64), times)
    emitted: Emitted = []
    tracked: Tracked = []  # every session the replay knows
    loaded_ids: set[SessionId] = set()
    entries = state.open_entries()
    open_kbs = None if entries is None else {kb for _, _, kb in entries}
    replay(
        state, groups, keys, values, offsets, timing, open_kbs, emitted, tracked, loaded_ids,
        net=net,
    )  # fmt: skip
    settle(state, timing, emitted, tracked, loaded_ids, entries)
    if net:
        return net_of(state, tracked)
    emitted.sort(key=lambda e: e[0])
    return [u for _, u in emitted]


def net_of(state: SessionWindowState, tracked: Tracked) -> list[SessionUpdate]:
    """The net change of a replayed batch: stored sessions it removed, and the
    sessions it leaves (a removed one's identity may come back with them)."""
    finish = state.aggregation.finish
    before: dict[tuple[bytes, int, int], Any] = {}
    after: dict[tuple[bytes, int, int], tuple[Any, Any]] = {}
    for key, kb, s in tracked:
        if s.loaded and s.removed_at is not None:
            ident = (kb, s.start, s.end)
            before[ident] = finish(s.acc)
            after[ident] = (key, None)
    for key, kb, s in tracked:
        if not s.loaded and s.removed_at is None:
            after[(kb, s.start, s.end)] = (key, finish(s.acc))
    return net_changes(before, after)


def stored_values(
    state: SessionWindowState, keys: Sequence[Any], timestamps: Sequence[int | None]
) -> dict[SessionId, Any]:
    """Finished values of every stored session a batch can touch (within gap of
    its records' times, per key), by identity: what earlier batches emitted."""
    spans: dict[bytes, list] = {}
    encode = state.encode
    for key, t in zip(keys, timestamps, strict=True):
        if key is None or t is None:
            continue
        t = check_timestamp("timestamp", t)
        span = spans.setdefault(encode(key), [key, t, t])
        span[1], span[2] = min(span[1], t), max(span[2], t)
    finish, gap, track = state.aggregation.finish, state.gap, state.track_offsets
    return {
        (kb, window.start, window.end): finish(acc[0] if track else acc)
        for kb, (key, lo, hi) in spans.items()
        for window, acc in state.store.find_sessions(key, lo - gap, hi + gap)
    }


def group(
    state: SessionWindowState,
    keys: Sequence[Any],
    timestamps: Sequence[int | None],
    offsets: Sequence[int | None],
) -> tuple[dict[bytes, list[int]], list[int], list]:
    """Row indices by encoded key, every row's time (``FAR_PAST`` for a dropped
    row: None key or time) and the checked offsets."""
    encode, track = state.encode, state.track_offsets
    offsets = list(offsets)
    groups: dict[bytes, list[int]] = {}
    times: list[int] = []
    str_kbs: dict[str, bytes] = {}  # str keys repeat: encode each once per batch
    for i in range(len(keys)):
        key, t = keys[i], timestamps[i]
        if key is None or t is None:
            state.dropped_records += 1
            times.append(FAR_PAST)
            continue
        if type(t) is not int or not TS_MIN <= t <= TS_MAX:
            t = check_timestamp("timestamp", t)
        times.append(t)
        if track:
            offsets[i] = state.check_offset(offsets[i])
        if type(key) is str:
            kb = str_kbs.get(key)
            if kb is None:
                kb = str_kbs[key] = encode(key)
        else:
            kb = encode(key)
        group = groups.get(kb)
        if group is None:
            groups[kb] = [i]
        else:
            group.append(i)
    return groups, times, offsets


def replay(
    state: SessionWindowState,
    groups: dict[bytes, list[int]],
    keys: Sequence[Any],
    values: Sequence[Any],
    offsets: Sequence[int | None],
    timing: Timing,
    open_kbs: set[bytes] | None,
    emitted: Emitted,
    tracked: Tracked,
    loaded_ids: set[SessionId],
    allow_fast: bool = True,
    net: bool = False,
) -> None:
    """Replay each group's records (vectorised for keys that qualify), collecting
    emissions, every session touched and the ids of the stored sessions loaded.
    With ``net`` (update mode) only the sessions count, not each record's updates."""
    agg, gap, final = state.aggregation, state.gap, state.final
    each = not final and not net  # update mode: every record's updates
    ts_l = timing.ts_l
    # keys that provably behave like a sorted stream take the vectorised path
    fast_columns = None if state.track_offsets or not allow_fast else fast_path_columns(agg, values)
    ok_l = timing.ok.tolist() if fast_columns is not None else []
    fast_keys: list[tuple[Any, bytes, list[int], Any]] = []
    for kb, idxs in groups.items():
        key = keys[idxs[0]]
        sessions = _load_sessions(state, key, kb, idxs, ts_l, open_kbs, tracked, loaded_ids)
        if fast_columns is not None:
            fast = _fast_entry(state, key, kb, idxs, ts_l, ok_l, sessions, each)
            if fast is not None:
                fast_keys.append(fast)
                continue
        _replay_key(state, key, kb, idxs, sessions, values, offsets, timing, emitted, tracked, each)
    if fast_keys and not each:
        run_fast_final(fast_keys, ts_l, fast_columns, agg, gap, tracked)
    elif fast_keys:
        run_fast_keys(fast_keys, ts_l, fast_columns, agg, gap, emitted, tracked)


def _load_sessions(
    state: SessionWindowState,
    key: Any,
    kb: bytes,
    idxs: list[int],
    ts_l: list[int],
    open_kbs: set[bytes] | None,
    tracked: Tracked,
    loaded_ids: set[SessionId],
) -> list[Session]:
    """The stored sessions of ``key`` within gap of its records, in (end, start)
    order, each tracked and its id noted. Final mode: a key's stored sessions matter
    only while open, and every open session is in the end index, so keys absent
    from it (``open_kbs``) need no store read."""
    if open_kbs is not None and kb not in open_kbs:
        return []
    gap, track = state.gap, state.track_offsets
    at = ts_l.__getitem__
    sessions: list[Session] = []
    for window, acc in state.store.find_sessions(
        key, min(map(at, idxs)) - gap, max(map(at, idxs)) + gap
    ):
        held = None
        if track:
            acc, held = acc
        s = Session(window.start, window.end, acc, held, True)
        sessions.append(s)
        tracked.append((key, kb, s))
        loaded_ids.add((kb, window.start, window.end))
    return sessions


def _fast_entry(
    state: SessionWindowState,
    key: Any,
    kb: bytes,
    idxs: list[int],
    ts_l: list[int],
    ok_l: list[bool],
    sessions: list[Session],
    each: bool,
) -> tuple[Any, bytes, list[int], Any] | None:
    """The key's entry for the vectorised path of :mod:`.vectorised_keys`, or None when its
    records must be replayed one by one."""
    if each:
        if _sorted_stream(idxs, ts_l, ok_l, sessions, state.gap):
            return key, kb, idxs, sessions[-1] if sessions else None
        return None
    # only closures or the final sessions count: any arrival order will do
    if not all(map(ok_l.__getitem__, idxs)):
        return None
    ordered = sorted(idxs, key=ts_l.__getitem__)  # stable
    # Closed sessions end before tmin - gap and are not even loaded; the filter
    # keeps the sweep from relying on it. (Update mode merges into closed
    # sessions: all are candidates.)
    emitted_close = state.emitted_close
    open_stored = [
        s for s in sessions if not state.final or emitted_close is None or s.end >= emitted_close
    ]
    return key, kb, ordered, open_stored


def _replay_key(
    state: SessionWindowState,
    key: Any,
    kb: bytes,
    idxs: list[int],
    sessions: list[Session],
    values: Sequence[Any],
    offsets: Sequence[int | None],
    timing: Timing,
    emitted: Emitted,
    tracked: Tracked,
    each: bool,
) -> None:
    """Replay one key's records in arrival order against ``sessions`` (its stored
    ones, kept in (end, start) order), as the record path would process them."""
    agg, gap, final, track = state.aggregation, state.gap, state.final, state.track_offsets
    add, merger, init, finish = agg.add, agg.merger, agg.initializer, agg.finish
    ts_l, close_l, vis_l = timing.ts_l, timing.close_l, timing.vis_l
    for i in idxs:
        t, close, vis = ts_l[i], close_l[i], vis_l[i]
        lo_end, hi_start = candidate_bounds(t, gap, max(vis, close) if final else vis)
        cands = [s for s in sessions if s.end >= lo_end and s.start <= hi_start]
        merged_offsets = None
        if track:
            offset = offsets[i]
            if any(offset in s.offsets for s in cands):
                state.replayed_records += 1
                continue
            merged_offsets = sorted([o for s in cands for o in s.offsets] + [offset])
        start, end = merged_window(t, cands)
        if is_late(end, close):
            state.dropped_records += 1
            continue
        acc = init()
        for s in cands:
            acc = merger(key, acc, s.acc)
        acc = add(key, values[i], t, acc)
        seq = 0
        for s in cands:
            s.removed_at = i
            sessions.remove(s)
            if each and (s.start != start or s.end != end):  # as the record path
                emitted.append(((i, seq), SessionUpdate(key, s.start, s.end, None, s.end)))
                seq += 1
        new = Session(start, end, acc, merged_offsets, False)
        insert_sorted(sessions, new)
        tracked.append((key, kb, new))
        if each:
            emitted.append(((i, seq), SessionUpdate(key, start, end, finish(acc), end)))


def settle(
    state: SessionWindowState,
    timing: Timing,
    emitted: Emitted,
    tracked: Tracked,
    loaded_ids: set[SessionId],
    open_entries: list[tuple[int, int, bytes]] | None = None,
) -> None:
    """Close the open sessions the batch passed without loading them, write the
    touched sessions back, and move stream and close time. ``open_entries`` is
    the end index as the batch read it (nothing writes it before this), which
    spares a second read."""
    store, final, n = state.store, state.final, len(timing.ts_l)
    close_l, emitted_close = timing.close_l, state.emitted_close
    finish, track = state.aggregation.finish, state.track_offsets
    final_vis = timing.final_vis
    index = state.index
    if final:
        _close_unloaded(state, timing, emitted, loaded_ids, open_entries)
    # write back: removals first, so that a re-put of the same window wins
    for key, kb, s in tracked:
        if s.loaded and s.removed_at is not None:
            store.remove(key, s.start, s.end)
            if final:
                index.discard(kb, s.start, s.end)
    after = (
        timing.end_time if state.stream_time is None else max(state.stream_time, timing.end_time)
    )
    certain = state.certain_close(after) if final else None
    apart: list[tuple[bytes, int, int, Any]] = []
    for key, kb, s in tracked:
        if s.removed_at is not None:
            continue
        if (
            certain is not None
            and not s.loaded
            and s.end < certain
            and bisect_right(close_l, s.end) == n
        ):
            # closes at the next advance: kept apart, as the store would hold it
            apart.append((kb, s.start, s.end, [s.acc, s.offsets] if track else s.acc))
            continue
        closes_at = None
        if final:
            was_open = not s.loaded or emitted_close is None or s.end >= emitted_close
            if was_open:
                j = bisect_right(close_l, s.end)
                if j < n:
                    closes_at = j
                    emitted.append(
                        (
                            (j, s.end, s.start, kb),
                            SessionUpdate(key, s.start, s.end, finish(s.acc), s.end),
                        )
                    )
                if s.loaded and closes_at is not None:
                    index.discard(kb, s.start, s.end)
                elif not s.loaded and closes_at is None:
                    index.add(kb, s.start, s.end)
        if not s.loaded and s.end >= final_vis:
            store.put(key, s.start, s.end, [s.acc, s.offsets] if track else s.acc)
    if apart:
        kbs, starts, ends, accs = (list(column) for column in zip(*apart, strict=True))
        state.keep_apart(kbs, starts, ends, accs)
    if state.stream_time is None or timing.end_time > state.stream_time:
        state.stream_time = timing.end_time
    if final and int(timing.prefix[-1]) != FAR_PAST:  # FAR_PAST: held, never advanced
        last_close = close_l[-1]
        if emitted_close is None or last_close > emitted_close:
            state.emitted_close = last_close


def _close_unloaded(
    state: SessionWindowState,
    timing: Timing,
    emitted: Emitted,
    loaded_ids: set[SessionId],
    open_entries: list[tuple[int, int, bytes]] | None,
) -> None:
    """Final mode: the open sessions the replay did not load close by time alone
    (all those ending before the last close time were emitted then)."""
    store, index, close_l = state.store, state.index, timing.close_l
    finish, track, decode = state.aggregation.finish, state.track_offsets, state.decode
    final_close = close_l[-1]
    closing = [
        (kb, start, end)
        for end, start, kb in (
            index.below(final_close, state.emitted_close)
            if open_entries is None
            else [e for e in open_entries if e[0] < final_close]
        )
        if (kb, start, end) not in loaded_ids
    ]
    for (kb, start, end), acc in zip(closing, store.fetch_encoded(closing), strict=True):
        index.discard(kb, start, end)
        if acc is None:
            continue
        if track:
            acc = acc[0]
        j = bisect_right(close_l, end)  # close_l is non-decreasing
        emitted.append(
            ((j, end, start, kb), SessionUpdate(decode(kb), start, end, finish(acc), end))
        )


def net_changes(
    before: dict[SessionId, Any], after: dict[SessionId, tuple[Any, Any]]
) -> list[SessionUpdate]:
    """A batch's net change, in identity order. ``before``: finished values of the
    stored sessions the batch touched, as it began; ``after``: ``(key, finished
    value, or None when merged away)`` of every session identity it touched, as it
    ends. Merged away and stored before: a tombstone; present with a new value: an
    update; anything else (a session born and merged away in the batch, a value
    unchanged) emits nothing."""
    out = []
    for ident in sorted(after):
        key, value = after[ident]
        _, start, end = ident
        old = before.get(ident, _MISSING)
        if value is None:
            if old is not _MISSING:
                out.append(SessionUpdate(key, start, end, None, end))
        elif old is _MISSING or old != value:
            out.append(SessionUpdate(key, start, end, value, end))
    return out


_MISSING = object()


def _sorted_stream(
    idxs: list[int], ts: list[int], ok: list[bool], sessions: list[Session], gap: int
) -> bool:
    """True when a key's records (in the order given) may take the vectorised path
    (see :mod:`.vectorised_keys`): none late or near a hidden or closed session, in time
    order, and starting at or after its latest stored session, which is then the
    only possible candidate."""
    prev = ts[idxs[0]]
    if sessions:
        if prev < sessions[-1].end:
            return False
        if len(sessions) > 1 and sessions[-2].end >= prev - gap:
            return False
    for i in idxs:
        t = ts[i]
        if t < prev or not ok[i]:
            return False
        prev = t
    return True


def insert_sorted(sessions: list[Session], new: Session) -> None:
    """Keep ``sessions`` in (end, start) order, the order candidates are merged in."""
    i = len(sessions)
    while i > 0 and (sessions[i - 1].end, sessions[i - 1].start) > (new.end, new.start):
        i -= 1
    sessions.insert(i, new)
