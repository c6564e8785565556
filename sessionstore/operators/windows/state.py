"""What a time-window aggregator keeps, and what its paths share.

:class:`WindowState` is the aggregator's state: its window store, the pending
index of windows still to fire, the stream time and last early tick it keeps
beside the store (saved in the store's metadata with each batch), what was fired
already, and its counter. The aggregator's record path and the columnar path
(:mod:`~sessionstore.operators.windows.columns`) both work on it; the columnar
path never sees the aggregator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sessionstore.encoding.ints import INT64 as _I64
from sessionstore.operators.aggregations import Aggregation
from sessionstore.operators.batch_paths.arrow_batches import batch_restoring, judged_time
from sessionstore.operators.batch_paths.vectorised import FAR_PAST
from sessionstore.operators.windows.model import TimeWindows
from sessionstore.stores.window import WindowStore

__all__ = ["WindowState"]


class WindowState:
    """A window aggregator's store, windows, times and counter.

    Opening it gives the store a retention that keeps windows visible until they
    close, and (for ``pending=True``: every policy but "update") the index of
    windows waiting to fire."""

    def __init__(
        self,
        store: WindowStore,
        windows: TimeWindows,
        aggregation: Aggregation,
        *,
        pending: bool,
        held: bool = False,
    ) -> None:
        self.store, self.windows, self.aggregation = store, windows, aggregation
        #: The store's key codec (the same functions the store uses).
        self.encode, self.decode = store.encode_key, store.decode_key
        store.set_min_retention(windows.retention_ms)
        #: ``closes_on="advance"``: rows are judged by the time of the last advance
        #: (see :meth:`judged_time`), and the store's time moves only with it.
        self.held = held
        if held:
            store.hold_stream_time()
        #: Windows waiting to fire, by end (None in update mode, which fires none).
        self.pending = store.end_index() if pending else None
        #: The largest timestamp seen (None before the first record).
        self.stream_time = self._read("stream_time")
        #: The last early-emission tick (stream time // early_every_ms).
        self.early_tick = self._read("early_tick")
        #: Windows ending before this were fired (None: unknown, scan them all once).
        self.fired_due: int | None = None
        #: Records that landed in no open window (or had a None key or timestamp).
        self.dropped_records = 0

    def _read(self, name: str) -> int | None:
        raw = self.store.read_aux(name)
        return None if raw is None else _I64.unpack(raw)[0]

    def advance(self, ts: int) -> bool:
        """Move stream time to ``ts`` if that is forward (saved with the batch)."""
        if self.stream_time is not None and ts <= self.stream_time:
            return False
        self.stream_time = ts
        self.store.write_aux("stream_time", _I64.pack(ts))
        return True

    def judged_time(self) -> int | None:
        """The time rows are judged by (see :func:`~.arrow_batches.judged_time`)."""
        return judged_time(self.held, self.stream_time, self.store.observed_stream_time)

    def judged_times(self, times: np.ndarray) -> tuple[np.ndarray, int]:
        """The time each row of a batch is judged by (``times``: the rows' times,
        ``FAR_PAST`` for a dropped row), and the stream time after the batch."""
        st0 = FAR_PAST if self.stream_time is None else self.stream_time
        end_time = max(st0, int(times.max()))
        if self.held:
            judged = self.judged_time()
            full = np.full(len(times), FAR_PAST if judged is None else judged, dtype=np.int64)
            return full, end_time
        return np.maximum.accumulate(np.maximum(times, st0)), end_time

    def set_early_tick(self, tick: int) -> None:
        """Record the early tick reached (saved with the batch)."""
        self.early_tick = tick
        self.store.write_aux("early_tick", _I64.pack(tick))

    def rolling_back(self) -> Any:
        """The store's batch; on failure, stream time and the early tick are read back
        from it, and the next firing scans the pending windows afresh."""
        return batch_restoring(self.store, self._reread)

    def _reread(self) -> None:
        self.fired_due = None
        self.stream_time = self._read("stream_time")
        self.early_tick = self._read("early_tick")
