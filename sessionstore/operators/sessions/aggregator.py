"""Session-window aggregation (KIP-94) over a session store, record by record or per batch.

Rules (docs/operators.md, "Session windows (KIP-94)", has the full list):

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
* ``closes_on="advance"`` (the Spark operator's, like Spark's watermark): only
  :meth:`~SessionWindowAggregator.advance_to` closes; every record in between is
  judged (late, closed candidates, visibility) by the time of the last advance, and
  moves only ``stream_time``, which the engine shares for the next advance. The
  store's time is the last advance's (writes do not move it), so a session the
  records passed stays visible until the next advance emits it. Default
  ``"record"``: each record's stream time closes, as in KIP-94.

:meth:`SessionWindowAggregator.process_batch` gives exactly the updates and final
state of calling :meth:`~SessionWindowAggregator.process` on each record in order,
while reading the store once per key and writing each surviving session once: it
replays each key's records in memory against the stream-time prefix of the whole
batch, which decides closing and visibility exactly as the record path does.
Accumulators must round-trip unchanged through the store's value serde (msgpack:
use lists, not tuples).

This module holds the record path (:meth:`SessionWindowAggregator.process`, the
reference the batch paths are held equal to) and chooses a batch's path: the
record-exact replay (:mod:`.replay`, which hands in-order keys to the vectorised
:mod:`.vectorised_keys`) or the columnar path (:mod:`.columns`). Every path works on the
aggregator's :class:`~.state.SessionWindowState`, never on the aggregator itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sessionstore.encoding.keys import TS_MAX, check_timestamp, decode_key, decode_keys
from sessionstore.operators.aggregations import (
    Aggregation,
    Aggregations,
    make_aggregation,
    record_output_plan,
)
from sessionstore.operators.batch_paths.arrow_batches import (
    ArrowBatches,
    StateAttribute,
    check_closes_on,
)
from sessionstore.operators.batch_paths.vectorised import FAR_PAST
from sessionstore.operators.gc_pause import gc_paused
from sessionstore.operators.sessions.model import ClosedSessions, SessionUpdate, SessionWindows
from sessionstore.operators.sessions.replay import net_changes, replay_rows, stored_values
from sessionstore.operators.sessions.rule import (
    candidate_bounds,
    close_time,
    is_late,
    merged_window,
)
from sessionstore.operators.sessions.state import SessionWindowState

__all__ = ["SessionWindows", "SessionUpdate", "SessionWindowAggregator"]


def _close_order(entry: tuple) -> tuple:
    """(end, start, encoded key): the order a close emits in, the end index's."""
    return entry[:3]


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
        closes_on: str = "record",
    ) -> None:
        if emit not in ("update", "final"):
            raise ValueError(f"emit must be 'update' or 'final', got {emit!r}")
        check_closes_on(closes_on)
        if not isinstance(windows, SessionWindows):
            raise TypeError(f"windows must be SessionWindows, got {type(windows).__name__}")
        self.windows = windows
        self.emit = emit
        # With offsets tracked a session is stored as [acc, sorted record offsets], and
        # a record whose offset a candidate session already holds is a replay.
        aggregation = make_aggregation(initializer, aggregator, merger, aggregations)
        #: What every path reads and moves: store, end index, times, counters.
        self.state = SessionWindowState(
            store,
            windows,
            aggregation,
            final=emit == "final",
            track_offsets=track_offsets,
            held=closes_on == "advance",
        )
        record_output_plan(store, self.aggregation, "acc_offsets" if track_offsets else "acc")

    # Kept once, in the state, which the batch paths read.
    store = StateAttribute()
    aggregation = StateAttribute()
    track_offsets = StateAttribute()
    #: Records dropped: None key or timestamp, or late beyond grace.
    dropped_records = StateAttribute()
    #: Records ignored because their offset was already in their session.
    replayed_records = StateAttribute()

    @property
    def stream_time(self) -> int | None:
        """The largest timestamp seen (None before the first record)."""
        return self.state.stream_time

    def close_time(self) -> int | None:
        """Sessions ending before this are closed (None before the first record)."""
        return self.state.close_time()

    def advance_to(self, event_time: int) -> list[SessionUpdate]:
        """Move stream time to ``event_time`` without a record (never back): in final
        mode this closes and emits the sessions it passes. Engines call it with the
        query's event time, so sessions close in partitions that get no data.

        With ``closes_on="advance"`` this is the only thing that closes: the judged
        time becomes ``event_time`` (or stays, if later), and every session ending
        before it minus gap and grace is emitted, however far the records since the
        last advance moved the stream time."""
        return self._advance(event_time, self._updates)

    def advance_columns(self, event_time: int) -> ClosedSessions:
        """:meth:`advance_to`, its emitted sessions as columns (the aggregation must
        be :class:`~sessionstore.operators.aggregations.Aggregations`): the results
        are computed per aggregate over all of them, not per session."""
        self._check_columns()
        return self._advance(event_time, self._columns)

    def finish_input(self) -> list[SessionUpdate]:
        """The input is bounded and has ended: in final mode, emit every session
        still open (update mode emitted every change already). Stream time stays,
        so the sessions stay stored as the input left them; they count as closed
        from then on, as at a final watermark."""
        return self._finish(self._updates)

    def finish_input_columns(self) -> ClosedSessions:
        """:meth:`finish_input`, its emitted sessions as columns (as
        :meth:`advance_columns`)."""
        self._check_columns()
        return self._finish(self._columns)

    def _advance(self, event_time: int, emit: Callable[[list[tuple]], Any]) -> Any:
        # ``emit`` turns the closed sessions into the output inside the store's
        # batch: a result that fails (a decimal overflow) undoes the close
        ts = check_timestamp("event_time", event_time)
        state = self.state
        with state.rolling_back():
            closed: list[tuple] = []
            if state.stream_time is None or ts > state.stream_time:
                state.stream_time = ts
            judged = state.stream_time
            if state.held:
                before = self.store.observed_stream_time
                judged = min(judged, ts if before is None else max(before, ts))
            if state.final:
                # read with the store's visibility from before the advance
                closed = self._closed(close_time(judged, state.gap, state.grace))
            out = emit(closed)
            state.save_times()
            # the store follows, so its visibility keeps matching the judged time
            self.store.advance_stream_time(judged)
        return out

    def _finish(self, emit: Callable[[list[tuple]], Any]) -> Any:
        state = self.state
        if not state.final:
            return emit([])
        with state.rolling_back():
            out = emit(self._closed(TS_MAX))
            state.save_times()
        return out

    # ------------------------------------------------------------ record path
    def process(
        self, key: Any, value: Any, timestamp: int | None, offset: int | None = None
    ) -> list[SessionUpdate]:
        """Process one record; return what it emits.

        ``offset`` (the record's position in its partition) is required with
        ``track_offsets=True`` and ignored otherwise.
        """
        state = self.state
        if key is None or timestamp is None:
            state.dropped_records += 1
            return []
        ts = check_timestamp("timestamp", timestamp)
        offset = state.check_offset(offset)
        kb = state.encode(key)
        with state.rolling_back():
            state.resolve_closing(None)  # rows before an advance may merge with them
            out = self._process(key, kb, value, ts, offset)
            state.save_times()
        return out

    def _process(
        self, key: Any, kb: bytes, value: Any, ts: int, offset: int | None
    ) -> list[SessionUpdate]:
        state, store, agg = self.state, self.store, self.aggregation
        gap = state.gap
        if state.stream_time is None or ts > state.stream_time:
            state.stream_time = ts
        close = state.close_time()
        out: list[SessionUpdate] = []
        if close is None:  # held and never advanced: nothing is closed or late yet
            close = FAR_PAST
        elif state.final and not state.held:
            out.extend(self._close_until(close))
        lo_end, hi_start = candidate_bounds(ts, gap)
        candidates = list(store.find_sessions(key, lo_end, hi_start))
        if state.final:
            candidates = [c for c in candidates if c[0].end >= close]
        offsets: list[int] = []
        if self.track_offsets:
            for _, (_, held) in candidates:
                if offset in held:
                    state.replayed_records += 1
                    return out
                offsets.extend(held)
            offsets.append(offset)
            offsets.sort()
            candidates = [(w, stored[0]) for w, stored in candidates]
        start, end = merged_window(ts, [w for w, _ in candidates])
        if is_late(end, close):
            state.dropped_records += 1
            return out
        acc = agg.initializer()
        for _, merged in candidates:
            acc = agg.merger(key, acc, merged)
        acc = agg.add(key, value, ts, acc)
        for window, _ in candidates:
            store.remove(key, window.start, window.end)
            if state.final:
                state.index.discard(kb, window.start, window.end)
            elif window.start != start or window.end != end:
                # Kafka forwards no tombstone for the window the update replaces
                out.append(SessionUpdate(key, window.start, window.end, None, window.end))
        store.put(key, start, end, [acc, offsets] if self.track_offsets else acc)
        if state.final:
            state.index.add(kb, start, end)
        else:
            out.append(SessionUpdate(key, start, end, agg.finish(acc), end))
        return out

    def _close_until(self, close: int) -> list[SessionUpdate]:
        """Emit (and forget from the index) every open session ending before ``close``."""
        return self._updates(self._closed(close))

    def _closed(self, close: int) -> list[tuple]:
        """Forget from the index every open session ending before ``close``; return
        them as ``(end, start, encoded key, accumulator)`` in close order."""
        state = self.state
        if state.emitted_close is not None and close <= state.emitted_close:
            return []
        # sessions ending before the last close were emitted then, and none is added
        # that ends before the current close: scan only what this close adds
        from_end, state.emitted_close = state.emitted_close, close
        store = self.store
        # one index read and delete, one multi-get per segment: a close after a
        # micro-batch emits every session the batch passed
        entries = state.index.take_below(close, from_end)
        values = store.fetch_encoded([(kb, start, end) for end, start, kb in entries])
        merged = [(*e, acc) for e, acc in zip(entries, values, strict=True) if acc is not None]
        due = state.resolve_closing(close)
        if due:  # sessions kept apart to close now, in (end, start, key) order as well
            loads = store.value_serde.loads
            kept = [(end, start, kb, loads(vb)) for end, start, kb, vb in due]
            if merged:  # two sorted runs: one merge pass
                merged = sorted(merged + kept, key=_close_order)
            else:
                merged = kept
        if self.track_offsets:  # stored as [acc, offsets]
            merged = [(end, start, kb, value[0]) for end, start, kb, value in merged]
        return merged

    def _updates(self, closed: list[tuple]) -> list[SessionUpdate]:
        finish, decode = self.aggregation.finish, self.state.decode
        return [
            SessionUpdate(decode(kb), start, end, finish(acc), end)
            for end, start, kb, acc in closed
        ]

    def _check_columns(self) -> None:
        # before anything closes: a refused call must leave the state as it was
        if not isinstance(self.aggregation, Aggregations):
            raise TypeError(
                "closed sessions as columns need built-in aggregations (Aggregations), "
                f"got {self.aggregation!r}"
            )

    def _columns(self, closed: list[tuple]) -> ClosedSessions:
        decode, kbs = self.state.decode, [c[2] for c in closed]
        return ClosedSessions(
            decode_keys(kbs) if decode is decode_key else list(map(decode, kbs)),
            [c[1] for c in closed],
            [c[0] for c in closed],
            self.aggregation.finish_columns([c[3] for c in closed]),
        )

    # ------------------------------------------------------------- batch paths
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
        state = self.state
        net = net and not state.final
        if not state.follows_store():
            # Someone else wrote to the store: its visibility no longer follows our
            # stream time, so replay record by record (still exact, just slower).
            out: list[SessionUpdate] = []
            with state.rolling_back():
                before = stored_values(state, keys, timestamps) if net else None
                for k, t, v, o in zip(keys, timestamps, values, offsets, strict=True):
                    out.extend(self.process(k, v, t, o))
            if before is None:
                return out
            encode = state.encode
            after = {(encode(u.key), u.start, u.end): (u.key, u.value) for u in out}
            return net_changes(before, after)
        with state.rolling_back(), gc_paused():
            state.resolve_closing(None)  # rows before an advance may merge with them
            out = replay_rows(state, keys, timestamps, values, offsets, net)
            state.save_times()
        return out

    def _columnar_applies(self) -> bool:
        # emit-on-close with every open session indexed, no offsets, and a store
        # whose visibility follows our stream time: see sessions.columns
        state = self.state
        return (
            state.final
            and state.index_complete
            and not state.track_offsets
            and state.follows_store()
        )

    def _run_columnar(self, prepared: Any, timestamp: str, value: Any) -> Any:
        from sessionstore.operators.sessions.columns import run_final

        return run_final(self.state, prepared, timestamp, value)
