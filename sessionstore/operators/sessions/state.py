"""What a session aggregator keeps, and what its paths share.

:class:`SessionWindowState` is the aggregator's state: its store and end index, the
stream time and last close time it keeps beside the store (saved in the store's
metadata with each batch), and its counters. The aggregator's record path works
on it, and so do the batch paths, which never see the aggregator: the
record-exact replay (:mod:`~sessionstore.operators.sessions.replay`), its
vectorised part (:mod:`~sessionstore.operators.sessions.vectorised_keys`) and the columnar
path (:mod:`~sessionstore.operators.sessions.columns`). :class:`Timing` is how each row of
one batch sees time; :class:`Session` is a session held in memory while a batch
is replayed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from sessionstore.encoding.ints import INT64 as _I64
from sessionstore.operators.aggregations import Aggregation
from sessionstore.operators.batch_paths.arrow_batches import batch_restoring, judged_time
from sessionstore.operators.batch_paths.vectorised import FAR_PAST
from sessionstore.operators.sessions.model import SessionWindows
from sessionstore.operators.sessions.rule import close_time

__all__ = ["SessionWindowState", "Session", "Timing"]


class Timing(NamedTuple):
    """How each row of a batch sees time: its own time (``FAR_PAST`` when dropped),
    the time it is judged by (the stream time after it, or with ``closes_on="advance"``
    the time of the last advance), the close time it sees, the store's visibility
    bound before it, and whether it may take a vectorised path (never late, and
    every session within gap of it visible and, in final mode, open). After the
    batch: the stream time (``end_time``) and the store's visibility bound
    (``final_vis``)."""

    ts: np.ndarray
    ts_l: list[int]
    prefix: np.ndarray
    close_arr: np.ndarray
    close_l: list[int]
    vis_l: list[int]
    ok: np.ndarray
    end_time: int
    final_vis: int


class Session:
    """A session as a batch replay holds it: loaded from the store or made by the
    batch, and the row that merged it away (None while it lives)."""

    __slots__ = ("start", "end", "acc", "offsets", "loaded", "removed_at")

    def __init__(self, start: int, end: int, acc: Any, offsets: list | None, loaded: bool) -> None:
        self.start, self.end, self.acc, self.loaded = start, end, acc, loaded
        self.offsets = offsets
        self.removed_at: int | None = None


class SessionWindowState:
    """A session aggregator's store, settings, times and counters.

    Opening it sets the store up for the mode: a minimum retention that keeps open
    sessions visible, the end index in final mode, and a mark in update mode."""

    def __init__(
        self,
        store: Any,
        windows: SessionWindows,
        aggregation: Aggregation,
        *,
        final: bool,
        track_offsets: bool,
        held: bool = False,
    ) -> None:
        self.store = store
        #: ``closes_on="advance"``: rows are judged by the time of the last advance
        #: (see :meth:`judged_time`), and the store's time moves only with it.
        self.held = held
        if held:
            store.hold_stream_time()
        self.aggregation = aggregation
        self.gap, self.grace = windows.gap_ms, windows.grace_ms
        self.final = final
        self.track_offsets = track_offsets
        store.set_min_retention(windows.retention_ms)
        self.index = store.end_index() if final else None
        # The end index holds every open session only if the store was never
        # written in update mode (which keeps no index): remember such writes.
        if not final and store.read_aux("update_mode") is None:
            store.write_aux("update_mode", b"1")
        self.index_complete = final and store.read_aux("update_mode") is None
        #: Emit-on-close judged by the last advance keeps the sessions a batch
        #: passes that are certain to close at the next advance apart (see
        #: :mod:`sessionstore.stores.closing`), where the store can.
        self.keeps_apart = final and held
        self.closing = store.closing_sessions(create=self.keeps_apart)
        #: Whether :attr:`closing` may hold sessions (read once, then followed).
        self.closing_pending = self.closing is not None and self.closing.any()
        if self.closing_pending and not self.keeps_apart:
            # kept by a run in the other mode: back into the segments (and index)
            with store.batch():
                self.resolve_closing(None)
        #: The store's key codec (the same functions the store uses).
        self.encode, self.decode = store.encode_key, store.decode_key
        #: The largest timestamp seen (None before the first record).
        self.stream_time = self._read_time("stream_time")
        #: Final mode: sessions ending before this were emitted (None: none yet).
        self.emitted_close = self._read_time("emitted_close")
        #: Records dropped: None key or timestamp, or late beyond grace.
        self.dropped_records = 0
        #: Records ignored because their offset was already in their session.
        self.replayed_records = 0

    def _read_time(self, name: str) -> int | None:
        raw = self.store.read_aux(name)
        return None if raw is None else _I64.unpack(raw)[0]

    def save_times(self) -> None:
        """Write stream and close time into the store's current batch."""
        if self.stream_time is not None:
            self.store.write_aux("stream_time", _I64.pack(self.stream_time))
        if self.emitted_close is not None:
            self.store.write_aux("emitted_close", _I64.pack(self.emitted_close))

    def rolling_back(self) -> Any:
        """The store's batch; on failure the times kept here are read back from it."""
        return batch_restoring(self.store, self._reread_times)

    def _reread_times(self) -> None:
        self.stream_time = self._read_time("stream_time")
        self.emitted_close = self._read_time("emitted_close")
        self.closing_pending = self.closing is not None and self.closing.any()

    def certain_close(self, stream_time: int | None) -> int | None:
        """Sessions ending before this are certain to close at the next advance
        (None: keep none apart): the close time at ``stream_time``, the partition's
        own after a batch. The next advance is to the event time shared by every
        partition, which is at least this one's stream time, and no later row
        merges with a closed session. (Exactness does not rest on it: an advance to
        an earlier time, or rows before an advance, put back what they do not
        close, see :meth:`resolve_closing`.)"""
        if not self.keeps_apart or self.closing is None or stream_time in (None, FAR_PAST):
            return None
        return close_time(stream_time, self.gap, self.grace)

    def keep_apart(self, kbs: list[bytes], starts: Any, ends: Any, accs: list[Any]) -> None:
        """Keep sessions certain to close at the next advance (see
        :meth:`certain_close`), given as columns: encoded keys, starts, ends and
        the values the store would hold."""
        self.closing.add_many(kbs, starts, ends, list(map(self.store.value_serde.dumps, accs)))
        self.closing_pending = True

    def resolve_closing(self, close: int | None) -> list[tuple[int, int, bytes, bytes]]:
        """Take the kept closing sessions: those ending before ``close`` are returned
        to be emitted (``(end, start, encoded key, value bytes)`` in that order); the
        others (all, when ``close`` is None: rows come before an advance) go where
        the batch that made them would have put them, a row and an end-index entry,
        and stay open."""
        if not self.closing_pending:
            return []
        self.closing_pending = False
        due: list[tuple[int, int, bytes, bytes]] = []
        store, index = self.store, self.index
        for entry in self.closing.take_all():
            end, start, kb, vb = entry
            if close is not None and end < close:
                due.append(entry)
            else:
                store.put_encoded(kb, start, end, vb)
                if index is not None:
                    index.add(kb, start, end)
        return due

    def judged_time(self) -> int | None:
        """The time rows are judged by (see :func:`~.arrow_batches.judged_time`)."""
        return judged_time(self.held, self.stream_time, self.store.observed_stream_time)

    def close_time(self) -> int | None:
        """Sessions ending before this are closed (None before the first record)."""
        judged = self.judged_time()
        return None if judged is None else close_time(judged, self.gap, self.grace)

    def follows_store(self) -> bool:
        """Whether the store's visibility still follows the judged time (nobody else
        wrote to it), which the batch paths' visibility bounds assume."""
        return self.store.observed_stream_time == self.judged_time()

    def check_offset(self, offset: Any) -> int | None:
        """A record's offset as an int when offsets are tracked (else None)."""
        if not self.track_offsets:
            return None
        if type(offset) is not int:
            if offset is None or isinstance(offset, bool) or not hasattr(offset, "__index__"):
                raise ValueError(
                    f"track_offsets=True needs an int offset per record, got {offset!r}"
                )
            offset = int(offset)
        return offset

    def timing(self, ts_fill: np.ndarray, times: list[int]) -> Timing:
        """Stream time, close time and store visibility as each row of a batch sees them
        (``times`` is ``ts_fill`` as a list)."""
        n = len(times)
        st0 = FAR_PAST if self.stream_time is None else self.stream_time
        end_time = max(st0, int(ts_fill.max()))
        if self.held:
            # every row is judged by the time of the last advance
            judged = self.judged_time()
            prefix = np.full(n, FAR_PAST if judged is None else judged, dtype=np.int64)
            before = prefix
        else:
            prefix = np.maximum.accumulate(np.maximum(ts_fill, st0))
            # store visibility during record i's lookup uses the stream time before it
            before = np.empty(n, dtype=np.int64)
            before[0] = st0
            before[1:] = prefix[:-1]
        close_arr = close_time(prefix, self.gap, self.grace)
        vis_arr = before - self.store.retention_ms + 1
        ok = (ts_fill >= close_arr) & (ts_fill - self.gap >= vis_arr)
        if self.final:
            ok &= ts_fill - self.gap >= close_arr
        final_vis = int(prefix[-1]) - self.store.retention_ms + 1
        return Timing(
            ts_fill, times, prefix, close_arr, close_arr.tolist(), vis_arr.tolist(), ok,
            end_time, final_vis,
        )  # fmt: skip

    def open_entries(self) -> list[tuple[int, int, bytes]] | None:
        """Final mode: every open session ``(end, start, encoded key)``, read once per
        batch, when the end index has them all (else None)."""
        return self.index.all() if self.index_complete else None
