"""StatefulProcessor classes shared by the Spark tests and bench/processors.py:
the same classes run under Spark's transformWithState(InPandas) and ours.

Each comes in a pandas flavour (DataFrames in and out) and a row flavour (Rows in
and out) over the same logic, written as PySpark's documentation writes them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

if TYPE_CHECKING:
    import pandas as pd

OUT_SCHEMA = "id string, total long, distinct_items long, recent string"


def _data_frame(*args: Any, **kwargs: Any) -> pd.DataFrame:
    """``pandas.DataFrame(...)``, pandas imported on first use: a process that only
    unpickles a processor (Spark's transformWithState driver worker), or runs a
    row flavour, then never imports it (about 0.4 CPU-s a process)."""
    import pandas

    return pandas.DataFrame(*args, **kwargs)


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
        yield _data_frame(
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
        yield _data_frame({"id": [key[0]], "events": [n], "fired_at": [fired]})


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


# --------------------------------------------------------------------- parity
# Processors of the parity tests (tests/spark/test_transform_with_state_parity.py):
# each shows one behaviour of Spark's operator that a user's processor can see.

PARITY_SCHEMA = "id string, kind string, value long"


class _WatermarkTimer:
    """Event time: each key's rows register a timer at the batch's watermark and
    emit their latest event time; a firing timer emits its expiry. Spark fires a
    timer that is already due in the batch that registers it."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.latest = handle.getValueState("latest", "ts long")

    def _seen(self, key: tuple, ts: list[int], tv: Any) -> tuple:
        latest = max([*ts, *(self.latest.get() or ())])
        self.latest.update((latest,))
        self.handle.registerTimer(tv.getCurrentWatermarkInMs())
        return key[0], "seen", latest

    def _fired(self, key: tuple, info: Any) -> tuple:
        return key[0], "fired", info.getExpiryTimeInMs()

    def close(self) -> None:
        pass


class PandasWatermarkTimer(_WatermarkTimer, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        ts = [int(x) for df in rows for x in df["ts"]]
        yield _frame([self._seen(key, ts, timerValues)])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield _frame([self._fired(key, expiredTimerInfo)])


class RowWatermarkTimer(_WatermarkTimer, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        yield Row(*_PARITY_NAMES)(*self._seen(key, [r.ts for r in rows], timerValues))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield Row(*_PARITY_NAMES)(*self._fired(key, expiredTimerInfo))


_PARITY_NAMES = ("id", "kind", "value")


def _frame(rows: list[tuple]) -> pd.DataFrame:
    return _data_frame(rows, columns=list(_PARITY_NAMES))


class PandasTimestamps(StatefulProcessor):
    """Reports the dtype of the timestamp column ``event`` and its seconds the way
    Spark's examples compute them (``astype("int64") // 10**9``)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues):
        for df in rows:
            seconds = (df["event"].astype("int64") // 10**9).tolist()
            yield _frame([(key[0], str(df["event"].dtype), s) for s in seconds])

    def close(self) -> None:
        pass


class _DeletedState:
    """Deletes its state variables in ``init`` (after defining them), then uses
    them: Spark refuses each call but iterators, which come back empty."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n long")
        self.value = handle.getValueState("gone_value", "n long")
        self.list = handle.getListState("gone_list", "n long")
        self.map = handle.getMapState("gone_map", "k string", "n long")
        for name in ("gone_value", "gone_list", "gone_map"):
            handle.deleteIfExists(name)

    def _calls(self, key: tuple) -> list[tuple]:
        calls = {
            "value.exists": self.value.exists,
            "value.get": self.value.get,
            "value.update": lambda: self.value.update((1,)),
            "value.clear": self.value.clear,
            "list.exists": self.list.exists,
            "list.get": lambda: list(self.list.get()),
            "list.appendValue": lambda: self.list.appendValue((1,)),
            "list.clear": self.list.clear,
            "map.exists": self.map.exists,
            "map.getValue": lambda: self.map.getValue(("k",)),
            "map.containsKey": lambda: self.map.containsKey(("k",)),
            "map.updateValue": lambda: self.map.updateValue(("k",), (1,)),
            "map.keys": lambda: list(self.map.keys()),
            "map.removeKey": lambda: self.map.removeKey(("k",)),
            "map.clear": self.map.clear,
        }
        out = []
        for name, call in calls.items():
            try:
                result = call()
            except Exception as e:  # what Spark raises is what the test compares
                # the message's first words name the call; the rest is the JVM's
                out.append((key[0], f"{name}: {type(e).__name__}: {str(e).split(':')[0]}", 0))
            else:
                out.append((key[0], f"{name}: {result!r}", 1))
        n = (self.count.get() or (0,))[0] + 1
        self.count.update((n,))
        out.append((key[0], "count", n))
        return out

    def close(self) -> None:
        pass


class PandasDeletedState(_DeletedState, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        list(rows)
        yield _frame(self._calls(key))


class RowDeletedState(_DeletedState, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        list(rows)
        for r in self._calls(key):
            yield Row(*_PARITY_NAMES)(*r)


class RowNestedValue(StatefulProcessor):
    """Keeps per key a value whose field is a struct and reports what it reads back:
    Spark gives a nested struct as a ``Row`` (its fields read by name)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.last = handle.getValueState("last", "item struct<name: string, n: long>")

    def handleInputRows(self, key, rows, timerValues):
        items = [r.item for r in rows]
        got = self.last.get()
        if got is None:
            yield Row(*_PARITY_NAMES)(key[0], "none", 0)
        else:
            nested = got[0]
            yield Row(*_PARITY_NAMES)(key[0], f"{type(nested).__name__} {nested.name}", nested.n)
        self.last.update(((max(items), len(items)),))

    def close(self) -> None:
        pass


class _BareMapKey:
    """Map state keyed by a one-field schema, called with bare strings (no tuple)
    as Spark's own examples sometimes do."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.map = handle.getMapState("names", "name string", "n long")

    def _calls(self, key: tuple, items: list[str]) -> list[tuple]:
        for item in items:
            n = (self.map.getValue(item) or (0,))[0] + 1
            self.map.updateValue(item, (n,))
        out = [(key[0], f"key {k!r}", v[0]) for k, v in sorted(self.map.iterator())]
        out += [(key[0], f"contains {x!r}", int(self.map.containsKey(x))) for x in ("a", "b")]
        return out

    def close(self) -> None:
        pass


class PandasBareMapKey(_BareMapKey, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        yield _frame(self._calls(key, [x for df in rows for x in df["item"]]))


class RowBareMapKey(_BareMapKey, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        for r in self._calls(key, [r.item for r in rows]):
            yield Row(*_PARITY_NAMES)(*r)


class PandasFrameSizes(StatefulProcessor):
    """The sizes of the DataFrames a key's rows arrive in, in order."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues):
        sizes = [len(df) for df in rows]
        yield _frame([(key[0], ",".join(map(str, sizes)), sum(sizes))])

    def close(self) -> None:
        pass


class PandasIntForDecimal(StatefulProcessor):
    """Returns an int column for a ``decimal(10,2)`` field of the output."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(df) for df in rows)
        yield _data_frame({"id": [key[0]], "amount": [n * 100]})

    def close(self) -> None:
        pass


class _FirstEventTime:
    """Emits each key's first event time of the batch, as the output's event time."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def close(self) -> None:
        pass


class PandasFirstEventTime(_FirstEventTime, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        first = min(t for df in rows for t in df["event"])
        yield _data_frame({"id": [key[0]], "out_time": [first]})


class RowFirstEventTime(_FirstEventTime, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        yield Row(id=key[0], out_time=min(r.event for r in rows))


class _Profile:
    """A value state of the schema ``value_schema``: each batch's rows of a key
    emit what the state held, then store ``(1, item)`` by field name."""

    value_schema: Any = "a int, b string"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.profile = handle.getValueState("profile", self.value_schema)

    def _seen(self, key: tuple, item: str) -> tuple:
        held = self.profile.get()
        fields = getattr(self.value_schema, "names", None) or [
            part.split()[0] for part in self.value_schema.split(",")
        ]
        self.profile.update(tuple(1 if f in ("a", "c") else item for f in fields))
        return key[0], repr(None if held is None else tuple(held)), len(fields)

    def close(self) -> None:
        pass


class RowProfile(_Profile, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        yield Row(*_PARITY_NAMES)(*self._seen(key, [r.item for r in rows][-1]))


class RowProfileEvolved(RowProfile):
    """Adds ``c``, reorders, and widens ``a`` from int to long."""

    value_schema = "c long, b string, a long"


class PandasProfile(_Profile, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        items = [item for pdf in rows for item in pdf["item"]]
        yield _data_frame([self._seen(key, items[-1])], columns=list(_PARITY_NAMES))


class PandasProfileEvolved(PandasProfile):
    value_schema = RowProfileEvolved.value_schema


class RowProfileLong(RowProfile):
    value_schema = "a long, b string"


class RowProfileNarrowed(RowProfile):
    """Narrows ``a`` from long (:class:`RowProfileLong`) to int: Spark refuses."""

    value_schema = "a int, b string"


def _not_nullable() -> Any:
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    return StructType([StructField("a", IntegerType(), False), StructField("b", StringType())])


class RowProfileNotNullable(RowProfile):
    """A non-nullable field: Spark refuses it with the Avro state encoding."""

    value_schema = _not_nullable()


# composite state values (issue 43): structs given as dicts, Rows and tuples,
# nested in arrays, map values and structs, with nulls at each level
COMPOSITE_SCHEMA = (
    "id string, kind string, value string, detail array<struct<key: string, value: string>>"
)
COMPOSITE_PROFILE = (
    "tags array<struct<key: string, value: string>>, "
    "attrs map<string, struct<n: long, note: string>>, "
    "inner struct<names: array<string>, pos: struct<x: long, y: long>>"
)
COMPOSITE_EVENT = "items array<struct<k: string, v: long>>, meta struct<tags: array<string>>"
COMPOSITE_PAIR = (
    "pairs array<struct<a: string, b: long>>, extra map<string, array<struct<c: string>>>"
)
#: a processing-time timer that never fires in a test (2096-10-02)
COMPOSITE_TIMER_MS = 4_000_000_000_000


def show(v: Any) -> str:
    """A value as text that says its types: a ``Row`` with its field names, lists,
    tuples, and dicts in key order (Spark's JVM hands maps back in hash order)."""
    fields = getattr(v, "__fields__", None)
    if fields is not None:
        return "Row(" + ", ".join(f"{k}={show(x)}" for k, x in zip(fields, v, strict=True)) + ")"
    if isinstance(v, list):
        return "[" + ", ".join(map(show, v)) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(map(show, v)) + ")"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {show(x)}" for k, x in sorted(v.items())) + "}"
    return repr(v)


class _Composite:
    """Value, list and map state (TTL) of composite types written as PySpark users
    write them, read back in the batch and the next one; a timer per key."""

    ttl_ms = 3_600_000

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.profile = handle.getValueState("profile", COMPOSITE_PROFILE, self.ttl_ms)
        self.events = handle.getListState("events", COMPOSITE_EVENT, self.ttl_ms)
        self.pairs = handle.getMapState("pairs", "item string", COMPOSITE_PAIR, self.ttl_ms)

    def _state(self, key: str, tag: str) -> list[tuple]:
        detail = [Row(value="v", key=tag), {"key": "d"}, None]  # a Row by name, as Spark
        return [
            (key, f"{tag} profile", show(self.profile.get()), detail),
            (key, f"{tag} events", show(list(self.events.get())), None),
            (key, f"{tag} pairs", show(dict(self.pairs.iterator())), []),
        ]

    def _update(self, key: str, items: list[str]) -> list[tuple]:
        out = self._state(key, "before")
        n, item = len(items), max(items)
        self.profile.update((
            [{"key": "env", "value": item}, None, {"value": "only"}, Row("k", "v"), ("t1", None)],
            {"a": {"note": "z", "n": n}, "b": None, item: (2, "w"), "r": Row(n=5, note=None)},
            {"names": [item, None], "pos": (n, None)} if n > 1 else None,
        ))  # fmt: skip
        self.events.appendValue(([{"k": item, "v": n}, None, {"v": 3}], {"tags": [item, None]}))
        self.events.appendList([([], None), (None, {"tags": None}), ([("p", 1)], {})])
        self.pairs.updateValue(
            (item,), ([{"a": item, "b": None}, ("x", 1)], {"e": [{"c": item}, None], "f": None})
        )
        self.pairs.updateValue(("z",), (None, {"g": []}))
        self.handle.registerTimer(COMPOSITE_TIMER_MS)
        return out + self._state(key, "after")

    def _seed(self, tags: Any) -> None:
        self.profile.update((tags, None, {"names": None, "pos": {"y": 7}}))

    def close(self) -> None:
        pass


class RowComposite(_Composite, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        for r in self._update(key[0], [r.item for r in rows]):
            yield Row(id=r[0], kind=r[1], value=r[2], detail=r[3])

    def handleInitialState(self, key, initialState, timerValues) -> None:
        self._seed(initialState.tags)  # nested structs arrive as dicts


class RowRescaled(StatefulProcessor):
    """Value, list and map state and an event-time timer per key, each emitted as
    a number that depends on every row the key ever had (test_rescale.py)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.amounts = handle.getListState("amounts", "amount long")
        self.by_amount = handle.getMapState("by_amount", "amount long", "n long")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        rows = list(rows)
        self.count.update(((self.count.get() or (0,))[0] + len(rows),))
        self.amounts.appendList([(r.amount,) for r in rows])
        for r in rows:
            seen = (
                self.by_amount.getValue((r.amount,))
                if self.by_amount.containsKey((r.amount,))
                else None
            )
            self.by_amount.updateValue((r.amount,), ((seen or (0,))[0] + 1,))
        self.handle.registerTimer(max(r.ts for r in rows) + 20_000)
        listed = sum(a for (a,) in self.amounts.get())
        mapped = sum(k * 100 + v for (k,), (v,) in self.by_amount.iterator())
        yield Row(id=key[0], kind="count", value=self.count.get()[0])
        yield Row(id=key[0], kind="list", value=listed)
        yield Row(id=key[0], kind="map", value=mapped)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[Row]:
        yield Row(id=key[0], kind="fired", value=expiredTimerInfo.getExpiryTimeInMs())
        yield Row(id=key[0], kind="fired count", value=(self.count.get() or (0,))[0])


# --------------------------------------------------------------- quiet streams
# Processors of tests/spark/test_quiet_timers.py: timers that fire with no input.

IDLE_SCHEMA = "id string, events long"


class _IdleExpiry:
    """Counts a key's events; 5 s of processing time after the key's latest row,
    a timer emits the count and forgets the key (a cart expired after inactivity);
    ``idle_ms`` sets another wait."""

    def __init__(self, idle_ms: int = 5_000) -> None:
        self.idle_ms = idle_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.events = handle.getValueState("events", "n long")

    def _seen(self, n: int, tv: Any) -> None:
        self.events.update(((self.events.get() or (0,))[0] + n,))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(tv.getCurrentProcessingTimeInMs() + self.idle_ms)

    def _fired(self) -> int:
        n = self.events.get()[0]
        self.events.clear()
        return n

    def close(self) -> None:
        pass


RESCALED_SCHEMA = "id string, kind string, value long"


class PandasIdleExpiry(_IdleExpiry, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        self._seen(sum(len(f) for f in rows), timerValues)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield _data_frame({"id": [key[0]], "events": [self._fired()]})


class RowIdleExpiry(_IdleExpiry, StatefulProcessor):
    def handleInputRows(self, key, rows, timerValues):
        self._seen(len(list(rows)), timerValues)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield Row(id=key[0], events=self._fired())
