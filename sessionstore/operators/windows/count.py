"""Count-based (tuple) tumbling windows (SAMZA-552): N messages per key per window.

Each key's messages, in offset order, fill windows of ``size`` messages: the first
``size`` go to window 0, the next to window 1, and so on. Offsets decide
membership: a message whose offset is not above the key's last counted offset is
a replay and is ignored, so a replay cannot double count. The open window of each
key (index, count, accumulator, last offset) lives in a key-value store.

``emit="final"`` forwards a window once, when it is full; ``emit="update"`` forwards
every change (the full window's last update has ``kind="final"``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from sessionstore.operators.aggregations import Aggregation, make_aggregation, record_output_plan
from sessionstore.stores.kv import KeyValueStore

__all__ = ["CountWindowAggregator", "CountWindowUpdate"]


class CountWindowUpdate(NamedTuple):
    key: Any
    window: int  # the window's index among the key's windows
    count: int
    value: Any
    kind: str  # "update" or "final"


class CountWindowAggregator:
    """Tumbling windows of ``size`` messages per key."""

    def __init__(
        self,
        store: KeyValueStore,
        size: int,
        initializer: Callable[[], Any] | None = None,
        aggregator: Callable[[Any, Any, Any], Any] | None = None,
        merger: Callable[[Any, Any, Any], Any] | None = None,
        *,
        aggregations: Aggregation | Mapping | None = None,
        emit: str = "final",
    ) -> None:
        if type(size) is not int or size < 1:
            raise ValueError(f"size must be a positive int of messages, got {size!r}")
        if emit not in ("update", "final"):
            raise ValueError(f"emit must be 'update' or 'final', got {emit!r}")
        if not isinstance(store, KeyValueStore):
            raise TypeError(f"store must be a KeyValueStore, got {type(store).__name__}")
        if merger is None and aggregations is None:
            merger = _never
        self.store, self.size, self.emit = store, size, emit
        self.aggregation = make_aggregation(initializer, aggregator, merger, aggregations)
        record_output_plan(store, self.aggregation, "count_window")
        #: Messages dropped for a None key; replays are ignored, not counted.
        self.dropped_records = 0
        self.replayed_records = 0

    def process(self, key: Any, value: Any, offset: int) -> list[CountWindowUpdate]:
        """Count one message; ``offset`` orders the key's messages and spots replays."""
        if key is None:
            self.dropped_records += 1
            return []
        if offset is None or isinstance(offset, bool):
            raise ValueError(f"count windows need an int offset per message, got {offset!r}")
        offset = operator.index(offset)
        agg, store = self.aggregation, self.store
        state = store.get(key)
        if state is None:
            state = [0, 0, agg.initializer(), None]
        index, count, acc, last = state
        if last is not None and offset <= last:
            self.replayed_records += 1
            return []
        acc = agg.add(key, value, offset, acc)
        count += 1
        out = []
        if count == self.size:
            out.append(CountWindowUpdate(key, index, count, agg.finish(acc), "final"))
            state = [index + 1, 0, agg.initializer(), offset]
        else:
            if self.emit == "update":
                out.append(CountWindowUpdate(key, index, count, agg.finish(acc), "update"))
            state = [index, count, acc, offset]
        store.put(key, state)
        return out

    def process_rows(
        self, keys: Sequence[Any], offsets: Sequence[int], values: Sequence[Any]
    ) -> list[CountWindowUpdate]:
        """Process a batch in order, as one atomic write."""
        out: list[CountWindowUpdate] = []
        with self.store.batch():
            for key, offset, value in zip(keys, offsets, values, strict=True):
                out.extend(self.process(key, value, offset))
        return out


def _never(key: Any, a: Any, b: Any) -> Any:
    raise AssertionError("count windows never merge")
