"""One micro-batch of a StatefulProcessor on one partition, in Spark's order.

:meth:`ProcessorRunner.run_batch` calls, as Spark's Python runners do:

1. ``init(handle)`` (once per batch: Spark creates the processor's handle per
   task);
2. for each grouping key of the batch, in encoded-key order:
   ``handleInitialState`` for each initial-state item of the key (first batch
   only), then ``handleInputRows`` when the key has rows. The handler's output is
   consumed while the key is current, because a generator changes state as it is
   iterated;
3. ``handleExpiredTimer`` for every timer due at the batch's time (expiry at or
   before the processing time, or the watermark in event-time mode), timers the
   batch's input registered included, in (expiry, key) order, each timer deleted
   after its handler, as PySpark does;
4. the TTL pass (see :meth:`ProcessorCore.clean_expired`), then ``close()``.

The processor is duck-typed: any object with ``init`` and ``handleInputRows``
(``handleInitialState``, ``handleExpiredTimer`` and ``close`` are optional), so
PySpark's ``StatefulProcessor`` subclasses run unchanged and nothing here imports
pyspark. What a key's rows are (pandas DataFrames or Rows) is the engine's
business: it passes them ready for the processor and converts what comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sessionstore.operators.processors.core import HandleState
from sessionstore.operators.processors.handle import ProcessorHandle
from sessionstore.operators.processors.timers import ExpiredTimerInfo, TimerValues

__all__ = ["ProcessorRunner", "BatchTimes", "TTL_CLEANUP_LIMIT"]

#: (key, variable) pairs the TTL pass visits per batch at most: bounded work per
#: batch; a backlog is worked off over the following batches.
TTL_CLEANUP_LIMIT = 10_000


@dataclass(frozen=True)
class BatchTimes:
    """The times of a batch: processing time (the batch's timestamp) and the
    event-time watermark in ms, -1 where the time mode has none."""

    processing_ms: int = -1
    watermark_ms: int = -1


@dataclass
class BatchCounts:
    """What a batch did, for metrics."""

    keys: int = 0
    timers_fired: int = 0
    ttl_visited: int = 0
    outputs: list[Any] = field(default_factory=list)


class ProcessorRunner:
    """Runs ``processor`` over a handle; one :meth:`run_batch` per micro-batch."""

    def __init__(self, processor: Any, handle: ProcessorHandle, time_mode: str = "None") -> None:
        self.processor = processor
        self.handle = handle
        self.time_mode = time_mode

    def timer_values(self, times: BatchTimes) -> TimerValues:
        """What ``TimerValues`` tells the processor in this time mode (Spark gives
        -1 for both in mode None)."""
        if self.time_mode == "None":
            return TimerValues(-1, -1)
        return TimerValues(times.processing_ms, times.watermark_ms)

    def run_batch(
        self,
        groups: Iterable[tuple[tuple, bytes | None, Callable[[], Any]]],
        times: BatchTimes,
        initial: dict[tuple, list[Any]] | None = None,
        ttl_cleanup_limit: int = TTL_CLEANUP_LIMIT,
    ) -> BatchCounts:
        """Process one batch. ``groups`` yields ``(key tuple, encoded key or None,
        rows factory)`` in encoded-key order; the factory returns what
        ``handleInputRows`` takes (an iterator of DataFrames or of Rows).
        ``initial`` maps keys to their initial-state items (first batch only).
        Returns the outputs (what the handlers yielded, in order) and counts."""
        proc, core = self.processor, self.handle.core
        counts = BatchCounts()
        out = counts.outputs
        core.begin_batch(times.processing_ms, times.watermark_ms)
        proc.init(self.handle)
        core.state = HandleState.INITIALIZED
        tv = self.timer_values(times)
        initial = dict(initial or {})
        handle_initial = getattr(proc, "handleInitialState", None)
        if initial:
            # keys that only have initial state join the batch's keys, in key order
            encode = core.encode_key
            pending = {encode(k): k for k in initial}
            groups = _merge_keys(
                ((k, encode(k) if kb is None else kb, rows) for k, kb, rows in groups), pending
            )
        begin_key, end_key = core.begin_key, core.end_key
        handle_rows = proc.handleInputRows
        for key, key_bytes, rows in groups:
            begin_key(key, key_bytes)
            if initial:
                for item in initial.pop(key, ()):
                    if handle_initial is not None:
                        handle_initial(key, item, tv)
            if rows is not None:
                result = handle_rows(key, rows(), tv)
                if result is not None:
                    out.extend(result)
            end_key()
            counts.keys += 1
        core.state = HandleState.DATA_PROCESSED
        threshold = {"ProcessingTime": times.processing_ms, "EventTime": times.watermark_ms}.get(
            self.time_mode
        )
        if threshold is not None and threshold >= 0:
            counts.timers_fired = self._fire_timers(threshold, tv, out)
        if core.has_ttl() and times.processing_ms >= 0:
            counts.ttl_visited = core.clean_expired(ttl_cleanup_limit)
        core.state = HandleState.TIMER_PROCESSED
        close = getattr(proc, "close", None)
        if close is not None:
            close()
        core.state = HandleState.CLOSED
        return counts

    def _fire_timers(self, threshold: int, tv: TimerValues, out: list[Any]) -> int:
        core = self.handle.core
        fire = getattr(self.processor, "handleExpiredTimer", None)
        # the due timers as of now, those the input registered included; timers a
        # handler registers fire next batch
        due = core.due_timers(threshold)
        for ts, key_bytes in due:
            key = core.key_of(key_bytes)
            core.begin_key(key, key_bytes)
            if fire is not None:
                result = fire(key=key, timerValues=tv, expiredTimerInfo=ExpiredTimerInfo(ts))
                if result is not None:
                    out.extend(result)
            core.delete_timer(ts)
            core.end_key()
        return len(due)


def _merge_keys(
    groups: Iterable[tuple[tuple, bytes | None, Callable[[], Any]]],
    pending: dict[bytes, tuple],
) -> Iterable[tuple[tuple, bytes, Callable[[], Any] | None]]:
    """``groups`` with the keys of ``pending`` (encoded key -> key) that have no
    rows added, in encoded-key order (``groups`` carry their encoded keys)."""
    extra = sorted(pending.items())
    i = 0
    for key, key_bytes, rows in groups:
        while i < len(extra) and extra[i][0] < key_bytes:
            yield extra[i][1], extra[i][0], None
            i += 1
        if i < len(extra) and extra[i][0] == key_bytes:
            i += 1
        yield key, key_bytes, rows
    for kb, key in extra[i:]:
        yield key, kb, None
