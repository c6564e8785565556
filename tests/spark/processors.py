"""StatefulProcessor classes shared by the Spark tests and bench/processors.py:
the same classes run under Spark's transformWithState(InPandas) and ours.

Each comes in a pandas flavour (DataFrames in and out) and a row flavour (Rows in
and out) over the same logic, written as PySpark's documentation writes them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

OUT_SCHEMA = "id string, total long, distinct_items long, recent string"


class _Tracker:
    """Count per key (ValueState), distinct items (MapState, TTL), the last three
    items (ListState); initial state seeds the count."""

    ttl_ms: int | None = None

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n long")
        self.seen = handle.getMapState("seen", "item string", "first long", self.ttl_ms)
        self.recent = handle.getListState("recent", "item string")

    def _update(self, items: list[str]) -> tuple[int, int, str]:
        total = (self.count.get() or (0,))[0] + len(items)
        self.count.update((total,))
        for i, item in enumerate(items):
            if not self.seen.containsKey((item,)):
                self.seen.updateValue((item,), (total - len(items) + i,))
        kept = [r[0] for r in self.recent.get()] + items
        self.recent.clear()
        self.recent.appendList([(x,) for x in kept[-3:]])
        return total, len(list(self.seen.keys())), ",".join(kept[-3:])

    def close(self) -> None:
        pass


class PandasTracker(_Tracker, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        items = [x for df in rows for x in df["item"].tolist()]
        total, distinct, recent = self._update(items)
        yield pd.DataFrame(
            {"id": [key[0]], "total": [total], "distinct_items": [distinct], "recent": [recent]}
        )

    def handleInitialState(self, key, initialState, timerValues) -> None:
        self.count.update((int(initialState["start"].sum()),))


class RowTracker(_Tracker, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        total, distinct, recent = self._update([r.item for r in rows])
        yield Row(id=key[0], total=total, distinct_items=distinct, recent=recent)

    def handleInitialState(self, key, initialState, timerValues) -> None:
        self.count.update(((self.count.get() or (0,))[0] + initialState.start,))


class PandasTrackerTTL(PandasTracker):
    ttl_ms = 3_600_000


class RowTrackerTTL(RowTracker):
    ttl_ms = 3_600_000


TIMER_SCHEMA = "id string, events long, fired_at long"


class _Expiry:
    """Counts a key's events; a timer 10 ms after its latest event (event time) or
    at the batch's processing time (processing time) emits the count once."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.events = handle.getValueState("events", "n long")

    def _seen(self, n: int, latest: int | None, tv: Any) -> None:
        self.events.update(((self.events.get() or (0,))[0] + n,))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        if latest is not None:  # event time
            self.handle.registerTimer(latest + 10)
        else:
            self.handle.registerTimer(tv.getCurrentProcessingTimeInMs())

    def _fired(self, info: Any) -> tuple[int, int]:
        n = self.events.get()[0]
        self.events.clear()
        return n, info.getExpiryTimeInMs()

    def close(self) -> None:
        pass


class PandasExpiry(_Expiry, StatefulProcessor):
    event_time = True

    def handleInputRows(self, key, rows, timerValues):
        frames = list(rows)
        n = sum(len(f) for f in frames)
        latest = max(int(f["ts"].max()) for f in frames) if self.event_time else None
        self._seen(n, latest, timerValues)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        n, at = self._fired(expiredTimerInfo)
        fired = at if self.event_time else -1
        yield pd.DataFrame({"id": [key[0]], "events": [n], "fired_at": [fired]})


class RowExpiry(_Expiry, StatefulProcessor):
    event_time = True

    def handleInputRows(self, key, rows, timerValues):
        rows = list(rows)
        latest = max(r.ts for r in rows) if self.event_time else None
        self._seen(len(rows), latest, timerValues)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        n, at = self._fired(expiredTimerInfo)
        yield Row(id=key[0], events=n, fired_at=at if self.event_time else -1)


class PandasProcessingExpiry(PandasExpiry):
    event_time = False


class RowProcessingExpiry(RowExpiry):
    event_time = False


class BadStateSchema(StatefulProcessor):
    """Declares a state with a DDL string that does not parse."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        handle.getValueState("count", "n lonng!")

    def handleInputRows(self, key, rows, timerValues):
        return iter([])

    def close(self) -> None:
        pass


class TimerWithoutTimeMode(StatefulProcessor):
    """Registers a timer in time mode None."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle

    def handleInputRows(self, key, rows, timerValues):
        list(rows)
        self.handle.registerTimer(1000)
        return iter([])

    def close(self) -> None:
        pass
