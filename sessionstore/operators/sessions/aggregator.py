"""Session-window aggregation (KIP-94) over a session store, record by record or per batch.

Rules (README "Session windows" has the full list):

* **Merge candidates** of a record at ``ts`` are the stored sessions of its key with
  ``end >= ts - gap`` and ``start <= ts + gap`` (an inclusive gap, as Spark's
  ``session_window`` and KIP-94). They are folded in (end, start) order:
  ``acc = initializer(); acc = merger(key, acc, c)…; acc = aggregator(key, value, acc)``.
* **Stream time** is the largest timestamp seen; ``close_time = stream_time - gap -
  grace``. A session is closed when ``end < close_time``. A record whose merged
  window ends before ``close_time`` is dropped and counted, as is a record with a
  None key or timestamp.
* ``emit="update"`` forwards every change: merged-away sessions as tombstones
  (value None, stamped with their old end), then the merged session stamped with
  its end; as in Kafka, no tombstone for the window the merged session keeps.
  ``emit="final"`` forwards each session once, when it closes, ordered by
  (end, start, key); a closed session is never merged into or re-emitted.
* ``net=True`` on the batch paths (update mode): a batch's net change, at most one
  update per session identity (see :meth:`SessionWindowAggregator.process_rows`).

:meth:`SessionWindowAggregator.process_batch` gives exactly the updates and final
state of calling :meth:`~SessionWindowAggregator.process` on each record in order,
while reading the store once per key and writing each surviving session once: it
replays each key's records in memory against the stream-time prefix of the whole
batch, which decides closing and visibility exactly as the record path does.
Accumulators must round-trip unchanged through the store's value serde (msgpack:
use lists, not tuples).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from sessionstore.encoding.ints import INT64 as _I64
from sessionstore.encoding.keys import TS_MAX, TS_MIN, check_timestamp
from sessionstore.operators.aggregations import Aggregation, Aggregations, record_output_plan
from sessionstore.operators.arrow_batches import ArrowBatches, batch_restoring
from sessionstore.operators.gc_pause import gc_paused
from sessionstore.operators.sessions.batch import (
    FAR_PAST,
    fast_path_columns,
    run_fast_final,
    run_fast_keys,
)

__all__ = ["SessionWindows", "SessionUpdate", "SessionWindowAggregator"]


@dataclass(frozen=True)
class SessionWindows:
    """Gap-based sessions: records at most ``gap_ms`` apart share a session; late
    records are accepted for ``grace_ms`` after a session's end."""

    gap_ms: int
    grace_ms: int = 0

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


class _Timing(NamedTuple):
    """How each row of a batch sees time: its own time (``FAR_PAST`` when dropped),
    the stream time after it, the close time after it, the store's visibility bound
    before it, and whether it may take a vectorised path (never late, and every
    session within gap of it visible and, in final mode, open)."""

    ts: np.ndarray
    ts_l: list[int]
    prefix: np.ndarray
    close_arr: np.ndarray
    close_l: list[int]
    vis_l: list[int]
    ok: np.ndarray


class _Session:
    __slots__ = ("start", "end", "acc", "offsets", "loaded", "removed_at")

    def __init__(self, start: int, end: int, acc: Any, offsets: list | None, loaded: bool) -> None:
        self.start, self.end, self.acc, self.loaded = start, end, acc, loaded
        self.offsets = offsets
        self.removed_at: int | None = None


def _make_aggregation(
    initializer: Callable | None,
    aggregator: Callable | None,
    merger: Callable | None,
    aggregations: Aggregation | Mapping | None,
) -> Aggregation:
    if aggregations is not None:
        if initializer or aggregator or merger:
            raise ValueError("pass either aggregations= or initializer/aggregator/merger, not both")
        if isinstance(aggregations, Aggregation):
            return aggregations
        return Aggregations(aggregations)
    if not (callable(initializer) and callable(aggregator) and callable(merger)):
        raise ValueError(
            "a custom aggregation needs initializer, aggregator and merger callables "
            f"(got {initializer!r}, {aggregator!r}, {merger!r})"
        )
    return Aggregation(initializer, aggregator, merger)


class SessionWindowAggregator(ArrowBatches):
    """The KIP-94 session-window processor over a session store (RocksDB or memory)."""

    def __init__(
        self,
        store: Any,
        windows: SessionWindows,
        initializer: Callable[[], Any] | None = None,
        aggregator: Callable[[Any, Any, Any], Any] | None = None,
        merger: Callable[[Any, Any, Any], Any] | None = None,
        *,
        aggregations: Aggregation | Mapping | None = None,
        emit: str = "update",
        track_offsets: bool = False,
    ) -> None:
        if emit not in ("update", "final"):
            raise ValueError(f"emit must be 'update' or 'final', got {emit!r}")
        if not isinstance(windows, SessionWindows):
            raise TypeError(f"windows must be SessionWindows, got {type(windows).__name__}")
        self.store = store
        self.windows = windows
        self.emit = emit
        self.aggregation = _make_aggregation(initializer, aggregator, merger, aggregations)
        self._gap, self._grace = windows.gap_ms, windows.grace_ms
        # Open sessions must stay visible: Kafka's default retention (gap + grace)
        # would hide a session that can still be merged into.
        store.set_min_retention(windows.gap_ms + windows.grace_ms + 1)
        self._final = emit == "final"
        self._index = store.end_index() if self._final else None
        # The end index holds every open session only if the store was never
        # written in update mode (which keeps no index): remember such writes.
        if not self._final and store.read_aux("update_mode") is None:
            store.write_aux("update_mode", b"1")
        self._index_complete = self._final and store.read_aux("update_mode") is None
        self._encode = store._encode_key
        self._decode = store._decode_key
        self._stream_time = self._read_time("stream_time")
        self._emitted_close = self._read_time("emitted_close")
        # With offsets tracked a session is stored as [acc, sorted record offsets], and
        # a record whose offset a candidate session already holds is a replay.
        self.track_offsets = track_offsets
        record_output_plan(store, self.aggregation, "acc_offsets" if track_offsets else "acc")
        #: Records dropped: None key or timestamp, or late beyond grace.
        self.dropped_records = 0
        #: Records ignored because their offset was already in their session.
        self.replayed_records = 0

    # ----------------------------------------------------------------- state
    def _read_time(self, name: str) -> int | None:
        raw = self.store.read_aux(name)
        return None if raw is None else _I64.unpack(raw)[0]

    def _save_times(self) -> None:
        if self._stream_time is not None:
            self.store.write_aux("stream_time", _I64.pack(self._stream_time))
        if self._emitted_close is not None:
            self.store.write_aux("emitted_close", _I64.pack(self._emitted_close))

    def _rolling_back(self):
        """The store's batch; on failure the times kept here are read back from it."""
        return batch_restoring(self.store, self._reread_times)

    def _reread_times(self) -> None:
        self._stream_time = self._read_time("stream_time")
        self._emitted_close = self._read_time("emitted_close")

    @property
    def stream_time(self) -> int | None:
        return self._stream_time

    def close_time(self) -> int | None:
        """Sessions ending before this are closed (None before the first record)."""
        st = self._stream_time
        return None if st is None else st - self._gap - self._grace

    def advance_to(self, event_time: int) -> list[SessionUpdate]:
        """Move stream time to ``event_time`` without a record (never back): in final
        mode this closes and emits the sessions it passes. Engines call it with the
        query's event time, so sessions close in partitions that get no data."""
        ts = check_timestamp("event_time", event_time)
        with self._rolling_back():
            out: list[SessionUpdate] = []
            if self._stream_time is None or ts > self._stream_time:
                self._stream_time = ts
                if self._final:
                    out = self._close_until(ts - self._gap - self._grace)
                self._save_times()
            # the store follows, so its visibility keeps matching our stream time
            self.store.advance_stream_time(self._stream_time)
        return out

    # ------------------------------------------------------------ record path
    def process(
        self, key: Any, value: Any, timestamp: int | None, offset: int | None = None
    ) -> list[SessionUpdate]:
        """Process one record; return what it emits.

        ``offset`` (the record's position in its partition) is required with
        ``track_offsets=True`` and ignored otherwise.
        """
        if key is None or timestamp is None:
            self.dropped_records += 1
            return []
        ts = check_timestamp("timestamp", timestamp)
        offset = self._check_offset(offset)
        kb = self._encode(key)
        with self._rolling_back():
            out = self._process(key, kb, value, ts, offset)
            self._save_times()
        return out

    def _check_offset(self, offset: Any) -> int | None:
        if not self.track_offsets:
            return None
        if type(offset) is not int:
            if offset is None or isinstance(offset, bool) or not hasattr(offset, "__index__"):
                raise ValueError(
                    f"track_offsets=True needs an int offset per record, got {offset!r}"
                )
            offset = int(offset)
        return offset

    def _process(
        self, key: Any, kb: bytes, value: Any, ts: int, offset: int | None
    ) -> list[SessionUpdate]:
        store, gap, agg = self.store, self._gap, self.aggregation
        if self._stream_time is None or ts > self._stream_time:
            self._stream_time = ts
        close = self._stream_time - gap - self._grace
        out: list[SessionUpdate] = []
        if self._final:
            out.extend(self._close_until(close))
        candidates = list(store.find_sessions(key, ts - gap, ts + gap))
        if self._final:
            candidates = [c for c in candidates if c[0].end >= close]
        offsets: list[int] = []
        if self.track_offsets:
            for _, (_, held) in candidates:
                if offset in held:
                    self.replayed_records += 1
                    return out
                offsets.extend(held)
            offsets.append(offset)
            offsets.sort()
            candidates = [(w, stored[0]) for w, stored in candidates]
        start = min([ts] + [w.start for w, _ in candidates])
        end = max([ts] + [w.end for w, _ in candidates])
        if end < close:
            self.dropped_records += 1
            return out
        acc = agg.initializer()
        for _, merged in candidates:
            acc = agg.merger(key, acc, merged)
        acc = agg.add(key, value, ts, acc)
        for window, _ in candidates:
            store.remove(key, window.start, window.end)
            if self._final:
                self._index.discard(kb, window.start, window.end)
            elif window.start != start or window.end != end:
                # Kafka forwards no tombstone for the window the update replaces
                out.append(SessionUpdate(key, window.start, window.end, None, window.end))
        store.put(key, start, end, [acc, offsets] if self.track_offsets else acc)
        if self._final:
            self._index.add(kb, start, end)
        else:
            out.append(SessionUpdate(key, start, end, agg.finish(acc), end))
        return out

    def _close_until(self, close: int) -> list[SessionUpdate]:
        """Emit (and forget from the index) every open session ending before ``close``."""
        if self._emitted_close is not None and close <= self._emitted_close:
            return []
        # sessions ending before the last close were emitted then, and none is added
        # that ends before the current close: scan only what this close adds
        from_end, self._emitted_close = self._emitted_close, close
        out = []
        finish, store, index, decode = (
            self.aggregation.finish,
            self.store,
            self._index,
            self._decode,
        )
        for end, start, kb in index.below(close, from_end):
            index.discard(kb, start, end)
            key = decode(kb)
            acc = store.fetch_session(key, start, end)
            if acc is not None:
                if self.track_offsets:
                    acc = acc[0]
                out.append(SessionUpdate(key, start, end, finish(acc), end))
        return out

    # ------------------------------------------------------------- batch path
    def process_rows(
        self,
        keys: Sequence[Any],
        timestamps: Sequence[int | None],
        values: Sequence[Any],
        offsets: Sequence[int | None] | None = None,
        *,
        net: bool = False,
    ) -> list[SessionUpdate]:
        """Process a batch given as columns; same result as :meth:`process` per row.

        ``net=True`` (update mode; final mode emits each session once anyway) returns
        the batch's net change instead, at most one update per session identity
        ``(key, start, end)``, in (encoded key, start, end) order: the value of each
        session that exists when the batch ends and whose value differs from the one
        stored (so emitted) before it, and a tombstone for each stored session the
        batch merged away. A session created and merged away within the batch emits
        nothing, and neither does closing. Applied in any order, these updates turn
        the table of the earlier updates into the table of all updates so far. The
        state written is the same either way.
        """
        n = len(keys)
        if offsets is None:
            offsets = [None] * n
        if not (len(timestamps) == n == len(values) == len(offsets)):
            raise ValueError(
                f"keys, timestamps and values differ in length: {n}, {len(timestamps)}, "
                f"{len(values)}"
            )
        if n == 0:
            return []
        net = net and not self._final
        store = self.store
        if store.observed_stream_time != self._stream_time:
            # Someone else wrote to the store: its visibility no longer follows our
            # stream time, so replay record by record (still exact, just slower).
            out: list[SessionUpdate] = []
            with self._rolling_back():
                before = self._stored_values(keys, timestamps) if net else None
                for k, t, v, o in zip(keys, timestamps, values, offsets, strict=True):
                    out.extend(self.process(k, v, t, o))
            if before is None:
                return out
            encode = self._encode
            after = {(encode(u.key), u.start, u.end): (u.key, u.value) for u in out}
            return _net_changes(before, after)
        with self._rolling_back(), gc_paused():
            out = self._process_rows(keys, timestamps, values, offsets, net)
            self._save_times()
        return out

    def _process_rows(self, keys, timestamps, values, offsets, net=False) -> list[SessionUpdate]:
        groups, times, offsets = self._group(keys, timestamps, offsets)
        if not groups:
            return []
        timing = self._timing(np.array(times, dtype=np.int64), times)
        emitted: list[tuple[tuple, SessionUpdate]] = []
        tracked: list[tuple[Any, bytes, _Session]] = []  # every session the replay knows
        loaded_ids: set[tuple[bytes, int, int]] = set()
        entries = self._open_entries()
        open_kbs = None if entries is None else {kb for _, _, kb in entries}
        self._replay(
            groups, keys, values, offsets, timing, open_kbs, emitted, tracked, loaded_ids,
            net=net,
        )  # fmt: skip
        self._settle(timing, emitted, tracked, loaded_ids, entries)
        if net:
            return self._net_of(tracked)
        emitted.sort(key=lambda e: e[0])
        return [u for _, u in emitted]

    def _net_of(self, tracked: list[tuple[Any, bytes, _Session]]) -> list[SessionUpdate]:
        """The net change of a replayed batch: stored sessions it removed, and the
        sessions it leaves (a removed one's identity may come back with them)."""
        finish = self.aggregation.finish
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
        return _net_changes(before, after)

    def _stored_values(self, keys, timestamps) -> dict[tuple[bytes, int, int], Any]:
        """Finished values of every stored session a batch can touch (within gap of
        its records' times, per key), by identity: what earlier batches emitted."""
        spans: dict[bytes, list] = {}
        encode = self._encode
        for key, t in zip(keys, timestamps, strict=True):
            if key is None or t is None:
                continue
            t = check_timestamp("timestamp", t)
            span = spans.setdefault(encode(key), [key, t, t])
            span[1], span[2] = min(span[1], t), max(span[2], t)
        finish, gap, track = self.aggregation.finish, self._gap, self.track_offsets
        return {
            (kb, window.start, window.end): finish(acc[0] if track else acc)
            for kb, (key, lo, hi) in spans.items()
            for window, acc in self.store.find_sessions(key, lo - gap, hi + gap)
        }

    def _group(self, keys, timestamps, offsets) -> tuple[dict[bytes, list[int]], list[int], list]:
        """Row indices by encoded key, every row's time (``FAR_PAST`` for a dropped
        row: None key or time) and the checked offsets."""
        encode, track = self._encode, self.track_offsets
        offsets = list(offsets)
        groups: dict[bytes, list[int]] = {}
        times: list[int] = []
        str_kbs: dict[str, bytes] = {}  # str keys repeat: encode each once per batch
        for i in range(len(keys)):
            key, t = keys[i], timestamps[i]
            if key is None or t is None:
                self.dropped_records += 1
                times.append(FAR_PAST)
                continue
            if type(t) is not int or not TS_MIN <= t <= TS_MAX:
                t = check_timestamp("timestamp", t)
            times.append(t)
            if track:
                offsets[i] = self._check_offset(offsets[i])
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

    def _timing(self, ts_fill: np.ndarray, times: list[int]) -> _Timing:
        """Stream time, close time and store visibility as each row of a batch sees them
        (``times`` is ``ts_fill`` as a list)."""
        n = len(times)
        st0 = FAR_PAST if self._stream_time is None else self._stream_time
        prefix = np.maximum.accumulate(np.maximum(ts_fill, st0))
        close_arr = prefix - (self._gap + self._grace)
        # store visibility during record i's lookup uses the stream time before it
        before = np.empty(n, dtype=np.int64)
        before[0] = st0
        before[1:] = prefix[:-1]
        vis_arr = before - self.store.retention_ms + 1
        ok = (ts_fill >= close_arr) & (ts_fill - self._gap >= vis_arr)
        if self._final:
            ok &= ts_fill - self._gap >= close_arr
        return _Timing(ts_fill, times, prefix, close_arr, close_arr.tolist(), vis_arr.tolist(), ok)

    def _open_entries(self) -> list[tuple[int, int, bytes]] | None:
        """Final mode: every open session ``(end, start, encoded key)``, read once per
        batch, when the end index has them all (else None)."""
        return self._index.all() if self._index_complete else None

    def _replay(
        self, groups, keys, values, offsets, timing, open_kbs, emitted, tracked, loaded_ids,
        allow_fast: bool = True, net: bool = False,
    ) -> None:  # fmt: skip
        """Replay each group's records (vectorised for keys that qualify), collecting
        emissions, every session touched and the ids of the stored sessions loaded.
        With ``net`` (update mode) only the sessions count, not each record's updates."""
        store, agg = self.store, self.aggregation
        gap, final = self._gap, self._final
        each = not final and not net  # update mode: every record's updates
        track = self.track_offsets
        ts_l, close_l, vis_l = timing.ts_l, timing.close_l, timing.vis_l
        # keys that provably behave like a sorted stream take the vectorised path
        fast_columns = None if track or not allow_fast else fast_path_columns(agg, values)
        if fast_columns is not None:
            ok_l = timing.ok.tolist()
            ok_at = ok_l.__getitem__
        fast_keys: list[tuple[Any, bytes, list[int], _Session | None]] = []
        emitted_close = self._emitted_close
        add, merger, init, finish = agg.add, agg.merger, agg.initializer, agg.finish
        # Final mode: a key's stored sessions matter only while open, and every open
        # session is in the end index, so keys absent from it need no store read.
        at = ts_l.__getitem__
        for kb, idxs in groups.items():
            key = keys[idxs[0]]
            tmin = min(map(at, idxs))
            tmax = max(map(at, idxs))
            sessions: list[_Session] = []
            if open_kbs is not None and kb not in open_kbs:
                found: Any = ()
            else:
                found = store.find_sessions(key, tmin - gap, tmax + gap)
            for window, acc in found:
                held = None
                if track:
                    acc, held = acc
                s = _Session(window.start, window.end, acc, held, True)
                sessions.append(s)
                tracked.append((key, kb, s))
                loaded_ids.add((kb, window.start, window.end))
            if fast_columns is not None:
                if not each:
                    # only closures or the final sessions count: any arrival order will do
                    if all(map(ok_at, idxs)):
                        ordered = sorted(idxs, key=ts_l.__getitem__)  # stable
                        # Closed sessions end before tmin - gap and are not even
                        # loaded here; the filter keeps the sweep from relying on it.
                        # (Update mode merges into closed sessions: all are candidates.)
                        open_stored = [
                            s
                            for s in sessions
                            if not final or emitted_close is None or s.end >= emitted_close
                        ]
                        fast_keys.append((key, kb, ordered, open_stored))
                        continue
                elif _sorted_stream(idxs, ts_l, ok_l, sessions, gap):
                    fast_keys.append((key, kb, idxs, sessions[-1] if sessions else None))
                    continue
            for i in idxs:
                t, close, vis = ts_l[i], close_l[i], vis_l[i]
                lo_end, hi_start = t - gap, t + gap
                lo_end = max(lo_end, vis)
                if final:
                    lo_end = max(lo_end, close)
                cands = [s for s in sessions if s.end >= lo_end and s.start <= hi_start]
                merged_offsets = None
                if track:
                    offset = offsets[i]
                    if any(offset in s.offsets for s in cands):
                        self.replayed_records += 1
                        continue
                    merged_offsets = sorted([o for s in cands for o in s.offsets] + [offset])
                start, end = t, t
                for s in cands:
                    if s.start < start:
                        start = s.start
                    if s.end > end:
                        end = s.end
                if end < close:
                    self.dropped_records += 1
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
                new = _Session(start, end, acc, merged_offsets, False)
                _insert_sorted(sessions, new)
                tracked.append((key, kb, new))
                if each:
                    emitted.append(((i, seq), SessionUpdate(key, start, end, finish(acc), end)))

        if fast_keys and not each:
            run_fast_final(fast_keys, ts_l, fast_columns, agg, gap, _Session, tracked)
        elif fast_keys:
            run_fast_keys(
                fast_keys,
                ts_l,
                fast_columns,
                agg,
                gap,
                False,
                _Session,
                emitted,
                tracked,
                SessionUpdate,
            )

    def _settle(self, timing, emitted, tracked, loaded_ids, open_entries=None) -> None:
        """Close the open sessions the batch passed without loading them, write the
        touched sessions back, and move stream and close time. ``open_entries`` is
        the end index as the batch read it (nothing writes it before this), which
        spares a second read."""
        store, final, n = self.store, self._final, len(timing.ts_l)
        prefix, close_l, emitted_close = timing.prefix, timing.close_l, self._emitted_close
        finish, track = self.aggregation.finish, self.track_offsets
        final_vis = int(prefix[-1]) - store.retention_ms + 1
        index = self._index
        if final:
            final_close = close_l[-1]
            # open sessions the replay did not load close by time alone (all those
            # ending before the last close time were emitted then)
            closing = [
                (kb, start, end)
                for end, start, kb in (
                    index.below(final_close, emitted_close)
                    if open_entries is None
                    else [e for e in open_entries if e[0] < final_close]
                )
                if (kb, start, end) not in loaded_ids
            ]
            decode = self._decode
            for (kb, start, end), acc in zip(closing, store.fetch_encoded(closing), strict=True):
                index.discard(kb, start, end)
                if acc is None:
                    continue
                if track:
                    acc = acc[0]
                j = bisect_right(close_l, end)  # close_l is non-decreasing
                key = decode(kb)
                emitted.append(
                    ((j, end, start, kb), SessionUpdate(key, start, end, finish(acc), end))
                )
        # write back: removals first, so that a re-put of the same window wins
        for key, kb, s in tracked:
            if s.loaded and s.removed_at is not None:
                store.remove(key, s.start, s.end)
                if final:
                    index.discard(kb, s.start, s.end)
        for key, kb, s in tracked:
            if s.removed_at is not None:
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
        if self._stream_time is None or int(prefix[-1]) > self._stream_time:
            self._stream_time = int(prefix[-1])
        if final:
            last_close = close_l[-1]
            if emitted_close is None or last_close > emitted_close:
                self._emitted_close = last_close

    def _columnar_applies(self) -> bool:
        # emit-on-close with every open session indexed, no offsets, and a store
        # whose visibility follows our stream time: see session_columns
        return (
            self._final
            and self._index_complete
            and not self.track_offsets
            and self.store.observed_stream_time == self._stream_time
        )

    def _run_columnar(self, prepared: Any, timestamp: str, value: Any) -> Any:
        from sessionstore.operators.sessions.columns import run_final

        return run_final(self, prepared, timestamp, value)

    def process_records(
        self, records: Iterable[tuple], *, net: bool = False
    ) -> list[SessionUpdate]:
        """Batch path for ``(key, value, timestamp)`` or ``(key, value, timestamp,
        offset)`` tuples (``net`` as in :meth:`process_rows`)."""
        rows = list(records)
        offsets = [r[3] for r in rows] if rows and len(rows[0]) > 3 else None
        return self.process_rows(
            [r[0] for r in rows], [r[2] for r in rows], [r[1] for r in rows], offsets, net=net
        )


def _net_changes(
    before: dict[tuple[bytes, int, int], Any], after: dict[tuple[bytes, int, int], tuple[Any, Any]]
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
    idxs: list[int], ts: list[int], ok: list[bool], sessions: list[_Session], gap: int
) -> bool:
    """True when a key's records (in the order given) may take the vectorised path
    (see session_batch): none late or near a hidden or closed session, in time
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


def _insert_sorted(sessions: list[_Session], new: _Session) -> None:
    """Keep ``sessions`` in (end, start) order, the order candidates are merged in."""
    i = len(sessions)
    while i > 0 and (sessions[i - 1].end, sessions[i - 1].start) > (new.end, new.start):
        i -= 1
    sessions.insert(i, new)
