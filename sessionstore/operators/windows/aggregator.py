"""Tumbling and hopping event-time windows (SAMZA-552) with emission policies.

``TimeWindows(size_ms, advance_ms=None, grace_ms=0)``: windows ``[start, start +
size)`` with ``start`` a multiple of ``advance_ms`` (tumbling when it equals the
size). A record belongs to every window that contains its timestamp.

Stream time is the largest timestamp seen. A window is *closed* once
``stream_time >= end + grace``; records for a closed window are ignored, and a
record that lands in no open window is dropped and counted.

Emission policies (``emit=``), after the Samza design's triggers:

* ``"update"`` – every change of a window, as it happens (kind ``"update"``).
* ``"final"`` – once per window, when it closes (kind ``"final"``, Samza's
  full-size/default trigger with the grace period folded in).
* ``"on_time"`` – once when stream time reaches the window's end (kind
  ``"on_time"``), then again for every late record within grace (kind ``"late"``,
  the late-arrival update of a past window).
* ``early_every_ms=N`` (with ``"final"`` or ``"on_time"``) – each time stream time
  crosses a multiple of N, the current value of every window whose end has not
  been reached yet (kind ``"early"``).

With ``closes_on="advance"`` (the Spark operator's, like Spark's watermark) only
:meth:`WindowAggregator.advance_to` fires (and ticks early results); every record in
between is judged by the time of the last advance, which is also the store's (writes
do not move it, so a window the records made due stays visible until the next
advance fires it). Default ``"record"``: each record's stream time fires.

A record's emissions come in this order: early values, windows whose trigger time
its stream time reached (by end, start, key), then its own updates (by window
start). Everything that decides an emission (stream time,
the last early tick, which windows are pending) is stored with the window values,
so replaying the same input from the same committed state emits the same output.

This module holds the record path (:meth:`WindowAggregator.process`, which
``process_rows`` runs per row) and chooses the columnar path
(:mod:`~sessionstore.operators.windows.columns`) when a batch qualifies; both work
on the aggregator's :class:`~sessionstore.operators.windows.state.WindowState`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sessionstore.encoding.keys import check_timestamp
from sessionstore.operators.aggregations import Aggregation, make_aggregation, record_output_plan
from sessionstore.operators.batch_paths.arrow_batches import (
    ArrowBatches,
    StateAttribute,
    check_closes_on,
)
from sessionstore.operators.batch_paths.vectorised import FAR_PAST
from sessionstore.operators.windows.model import TimeWindows, WindowUpdate
from sessionstore.operators.windows.state import WindowState
from sessionstore.stores.window import WindowStore

__all__ = ["TimeWindows", "WindowUpdate", "WindowAggregator"]


class WindowAggregator(ArrowBatches):
    """Aggregate records into time windows held in a :class:`WindowStore`."""

    def __init__(
        self,
        store: WindowStore,
        windows: TimeWindows,
        initializer: Callable[[], Any] | None = None,
        aggregator: Callable[[Any, Any, Any], Any] | None = None,
        merger: Callable[[Any, Any, Any], Any] | None = None,
        *,
        aggregations: Aggregation | Mapping | None = None,
        emit: str = "update",
        early_every_ms: int | None = None,
        closes_on: str = "record",
    ) -> None:
        self.check_settings(emit, early_every_ms)
        check_closes_on(closes_on)
        if not isinstance(store, WindowStore):
            raise TypeError(f"store must be a WindowStore, got {type(store).__name__}")
        if store.window_size_ms != windows.size_ms:
            raise ValueError(
                f"store {store.name!r} holds {store.window_size_ms} ms windows, "
                f"not {windows.size_ms} ms"
            )
        if merger is None and aggregations is None and initializer and aggregator:
            merger = _no_merge  # fixed windows never merge
        self.emit = emit
        self.early_every_ms = early_every_ms
        aggregation = make_aggregation(initializer, aggregator, merger, aggregations)
        record_output_plan(store, aggregation, "acc")
        #: What both paths read and move: store, pending index, times, counter.
        self.state = WindowState(
            store, windows, aggregation, pending=emit != "update", held=closes_on == "advance"
        )

    @staticmethod
    def check_settings(emit: str, early_every_ms: int | None = None) -> None:
        """Raise ``ValueError`` for an unknown policy or a bad early interval."""
        if emit not in ("update", "final", "on_time"):
            raise ValueError(f"emit must be 'update', 'final' or 'on_time', got {emit!r}")
        if early_every_ms is not None:
            if emit == "update":
                raise ValueError("early_every_ms needs emit='final' or 'on_time'")
            if type(early_every_ms) is not int or early_every_ms <= 0:
                raise ValueError(f"early_every_ms must be a positive int, got {early_every_ms!r}")

    # Kept once, in the state, which the batch paths read.
    store = StateAttribute()
    windows = StateAttribute()
    aggregation = StateAttribute()
    #: Records that landed in no open window (or had a None key or timestamp).
    dropped_records = StateAttribute()

    @property
    def stream_time(self) -> int | None:
        """The largest timestamp seen (None before the first record)."""
        return self.state.stream_time

    def advance_to(self, event_time: int) -> list[WindowUpdate]:
        """Move stream time to ``event_time`` without a record (never back), firing
        the windows it makes due; engines call it with the query's event time."""
        ts = check_timestamp("event_time", event_time)
        state = self.state
        with state.rolling_back():
            moved = state.advance(ts)
            if state.held:
                # the only thing that fires: up to the new judged time, read with
                # the store's visibility from before it moves
                before = self.store.observed_stream_time
                judged = min(state.stream_time, ts if before is None else max(before, ts))
                out = self._fire(judged) if state.pending is not None else []
                self.store.advance_stream_time(judged)
                return out
            if not moved:
                return []
            return self._fire(ts) if state.pending is not None else []

    def finish_input(self) -> list[WindowUpdate]:
        """The input is bounded and has ended: fire every window still pending, as
        a final watermark would (kind "final", or "on_time" in that mode). Stream
        time stays, so the windows stay stored as the input left them."""
        pending = self.state.pending
        if pending is None:
            return []  # update mode emitted every change already
        with self._rolling_back():
            return self._fired(pending.all(), "final" if self.emit == "final" else "on_time")

    def process(self, key: Any, value: Any, timestamp: int | None) -> list[WindowUpdate]:
        """Add one record to its windows; return what it emits."""
        with self._rolling_back():
            return self._checked(key, value, timestamp)

    def _checked(
        self, key: Any, value: Any, timestamp: Any, before: dict | None = None
    ) -> list[WindowUpdate]:
        if key is None or timestamp is None:
            self.state.dropped_records += 1
            return []
        return self._process(key, value, check_timestamp("timestamp", timestamp), before)

    def _process(
        self, key: Any, value: Any, ts: int, before: dict | None = None
    ) -> list[WindowUpdate]:
        """One record; ``before`` (if given) gets the finished value of each window it
        touches first, as stored before (``_MISSING`` for a new window)."""
        state, store, agg, windows = self.state, self.store, self.aggregation, self.windows
        size, grace = windows.size_ms, windows.grace_ms
        state.advance(ts)
        st = state.judged_time()
        out: list[WindowUpdate] = []
        if st is None:  # held and never advanced: nothing is closed or due yet
            st = FAR_PAST
        elif state.pending is not None and not state.held:
            # Fire due windows before this record's puts move the store's own stream
            # time: with retention >= size + grace they are still visible now.
            out = self._fire(st)
        kb = state.encode(key)
        accepted = False
        for start in windows.starts_for(ts):
            end = start + size
            if end + grace <= st:
                continue  # closed
            accepted = True
            acc = store.fetch_window(key, start)
            is_new = acc is None
            if before is not None and (kb, start) not in before:
                before[(kb, start)] = _MISSING if is_new else agg.finish(acc)
            if is_new:
                acc = agg.initializer()
            acc = agg.add(key, value, ts, acc)
            store.put_window(key, start, acc)
            if self.emit == "update":
                out.append(WindowUpdate(key, start, end, agg.finish(acc), ts, "update"))
            elif self.emit == "on_time" and end <= st:
                out.append(WindowUpdate(key, start, end, agg.finish(acc), ts, "late"))
            elif is_new:
                state.pending.add(kb, start, end)
        if not accepted:
            state.dropped_records += 1
        return out

    def _fire(self, st: int) -> list[WindowUpdate]:
        """Early ticks, then windows whose trigger time stream time has reached."""
        out: list[WindowUpdate] = []
        state, store, finish = self.state, self.store, self.aggregation.finish
        pending = state.pending
        every = self.early_every_ms
        if every is not None:
            tick = st // every
            if state.early_tick is None or tick > state.early_tick:
                if state.early_tick is not None:  # the first record starts the clock
                    for end, start, kb in pending.all():
                        if end > st:
                            key = self.state.decode(kb)
                            value = finish(store.fetch_window(key, start))
                            out.append(WindowUpdate(key, start, end, value, st, "early"))
                state.set_early_tick(tick)
        if self.emit == "final":
            due, kind = st - self.windows.grace_ms + 1, "final"
        else:
            due, kind = st + 1, "on_time"
        if state.fired_due is not None and due <= state.fired_due:
            return out  # stream time did not move: nothing new is due
        # Windows ending before the last due were fired then, and a window is added
        # only while it ends at or after the current due, so only [last due, due)
        # can hold new work: scanning from the start would meet every window this
        # batch already fired (pending deletes), once per record.
        fired_from, state.fired_due = state.fired_due, due
        out += self._fired(pending.below(due, fired_from), kind)
        return out

    def _fired(self, entries: list[tuple[int, int, bytes]], kind: str) -> list[WindowUpdate]:
        """Fire pending windows ``entries`` (end, start, encoded key): out of the
        pending index, and their values emitted as ``kind``."""
        store, pending, finish = self.store, self.state.pending, self.aggregation.finish
        out = []
        for end, start, kb in entries:
            pending.discard(kb, start, end)
            key = self.state.decode(kb)
            value = store.fetch_window(key, start)
            if value is not None:
                out.append(WindowUpdate(key, start, end, finish(value), end, kind))
        return out

    def process_rows(
        self,
        keys: Sequence[Any],
        timestamps: Sequence[int | None],
        values: Sequence[Any],
        *,
        net: bool = False,
    ) -> list[WindowUpdate]:
        """Process a batch in order, as one atomic write; same result as per record.

        ``net=True`` with ``emit="update"`` returns the batch's net change instead:
        one update per window the batch changed, with its value after the batch, in
        (encoded key, start) order, and none for a window whose value ends as it was
        (windows are never deleted). Other policies ignore it.
        """
        out: list[WindowUpdate] = []
        before: dict[tuple[bytes, int], Any] | None = {} if net and self.emit == "update" else None
        with self._rolling_back():
            for key, ts, value in zip(keys, timestamps, values, strict=True):
                out.extend(self._checked(key, value, ts, before))
        if before is None:
            return out
        encode = self.state.encode
        last = {(encode(u.key), u.start): u for u in out}
        return [last[w] for w in sorted(last) if before[w] != last[w].value]

    def _columnar_applies(self) -> bool:
        # emit="final" without early emission: see windows.columns
        return self.emit == "final" and self.early_every_ms is None

    def _run_columnar(self, prepared: Any, timestamp: str, value: Any) -> Any:
        from sessionstore.operators.windows.columns import run_final

        return run_final(self.state, prepared, timestamp, value)

    def _updates_table(self, updates: list[Any], key: str | Sequence[str]) -> Any:
        import pyarrow as pa

        table = super()._updates_table(updates, key)
        return table.append_column("kind", pa.array([u.kind for u in updates], pa.string()))


_MISSING = object()


def _no_merge(key: Any, a: Any, b: Any) -> Any:
    raise AssertionError("fixed windows never merge")
