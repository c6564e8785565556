"""Windowed stream-stream join (SAMZA-552, case 2).

Two keyed streams join when their event times lie within ``within_ms`` of each
other. Each side buffers its messages in a :class:`~sessionstore.stores.messages.
MessageStore` keyed ``key ‖ timestamp ‖ offset``; a new message range-reads the
other side's buffer for ``[ts - within, ts + within]`` and emits one pair per
partner found, so each pair is emitted exactly once, by whichever side arrives
second. A message already buffered (same key, timestamp and offset: a replay) is
neither stored nor joined again.

Stream time is the largest timestamp of either side. A message with
``ts < stream_time - within - grace`` could miss partners that were already
expired, so it is dropped and counted. Buffers keep ``2 * within + grace`` of
stream time, the oldest partner a non-late message can have; expiry drops whole
time segments (column families).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sessionstore.encoding.ints import INT64 as _I64
from sessionstore.encoding.keys import check_timestamp
from sessionstore.stores.messages import MessageStore

__all__ = ["WindowedJoin", "JoinedPair", "LEFT", "RIGHT"]

LEFT = "left"
RIGHT = "right"


class JoinedPair(NamedTuple):
    """A left and a right message of ``key`` within the join window."""

    key: Any
    left_timestamp: int
    right_timestamp: int
    value: Any
    timestamp: int  # the later of the two event times


def _pair(left: Any, right: Any) -> tuple[Any, Any]:
    return left, right


class WindowedJoin:
    """Inner join of two keyed streams over an event-time window."""

    @staticmethod
    def retention_ms(within_ms: int, grace_ms: int) -> int:
        """The buffers' retention: a message must stay until every partner that can
        still arrive (``within`` either side, ``grace`` late) has met it."""
        return 2 * within_ms + grace_ms + 1

    def __init__(
        self,
        left_store: MessageStore,
        right_store: MessageStore,
        within_ms: int,
        grace_ms: int = 0,
        joiner: Callable[[Any, Any], Any] = _pair,
    ) -> None:
        for name, value in (("within_ms", within_ms), ("grace_ms", grace_ms)):
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        for store in (left_store, right_store):
            if not isinstance(store, MessageStore):
                raise TypeError(f"join buffers must be MessageStores, got {type(store).__name__}")
        if left_store is right_store:
            raise ValueError("the two sides need separate message stores")
        self.left, self.right = left_store, right_store
        self.within_ms, self.grace_ms, self.joiner = within_ms, grace_ms, joiner
        for store in (left_store, right_store):
            store.set_min_retention(self.retention_ms(within_ms, grace_ms))
        raw = left_store.read_aux("join_stream_time")
        self._stream_time = None if raw is None else _I64.unpack(raw)[0]
        self._next_offset = {LEFT: 0, RIGHT: 0}
        #: Messages dropped: None key or timestamp, or too late to find every partner.
        self.dropped_records = 0

    @property
    def stream_time(self) -> int | None:
        return self._stream_time

    def advance(self, ts: int) -> None:
        """Move stream time forward to ``ts`` (never back) as if a message at
        ``ts`` had arrived, without one: later messages are judged late against it,
        and both buffers drop what no message that can still arrive may pair with.

        Operators call it with the query's event time before each batch, so that a
        partition whose keys went quiet still expires its buffers (and judges
        lateness as the partitions that saw the later rows do)."""
        ts = check_timestamp("ts", ts)
        if self._stream_time is not None and ts <= self._stream_time:
            return
        with self.left.batch():
            self._stream_time = ts
            self.left.write_aux("join_stream_time", _I64.pack(ts))
            for store in (self.left, self.right):
                store.advance_stream_time(ts)

    def process(
        self, side: str, key: Any, value: Any, timestamp: int | None, offset: int | None = None
    ) -> list[JoinedPair]:
        """Buffer one message of ``side`` ("left" or "right") and emit its pairs.

        ``offset`` identifies the message within its partition for replay
        de-duplication; without one, messages are numbered in arrival order.
        """
        if side == LEFT:
            mine, other = self.left, self.right
        elif side == RIGHT:
            mine, other = self.right, self.left
        else:
            raise ValueError(f"side must be {LEFT!r} or {RIGHT!r}, got {side!r}")
        if key is None or timestamp is None or value is None:
            self.dropped_records += 1
            return []
        ts = check_timestamp("timestamp", timestamp)
        if offset is None:
            offset = self._next_offset[side]
            self._next_offset[side] += 1
        with mine.batch():
            if self._stream_time is None or ts > self._stream_time:
                self._stream_time = ts
                self.left.write_aux("join_stream_time", _I64.pack(ts))
            if ts < self._stream_time - self.within_ms - self.grace_ms:
                self.dropped_records += 1
                return []
            if mine.has_message(key, ts, offset):
                return []  # a replay: stored and joined when it first came
            mine.put_message(key, ts, offset, value)
            out = []
            for partner_ts, _, partner in other.messages(
                key, ts - self.within_ms, ts + self.within_ms
            ):
                if side == LEFT:
                    joined = JoinedPair(
                        key, ts, partner_ts, self.joiner(value, partner), max(ts, partner_ts)
                    )
                else:
                    joined = JoinedPair(
                        key, partner_ts, ts, self.joiner(partner, value), max(ts, partner_ts)
                    )
                out.append(joined)
        return out

    def process_rows(
        self,
        sides: Sequence[str],
        keys: Sequence[Any],
        timestamps: Sequence[int | None],
        values: Sequence[Any],
        offsets: Sequence[int | None] | None = None,
    ) -> list[JoinedPair]:
        """Process interleaved messages of both sides in arrival order, atomically."""
        if offsets is None:
            offsets = [None] * len(keys)
        out: list[JoinedPair] = []
        with self.left.batch():
            for side, key, ts, value, offset in zip(
                sides, keys, timestamps, values, offsets, strict=True
            ):
                out.extend(self.process(side, key, value, ts, offset))
        return out
