"""The StatefulProcessor runner against a plain-Python reference model of PySpark's
semantics (value, list and map state with TTL, processing-time timers), across
batches and reopened databases; Spark's error conditions for misuse; bounded TTL
cleanup; every row routable by its grouping key."""

from __future__ import annotations

import itertools
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import StateDB
from sessionstore.encoding.keys import encode_key
from sessionstore.errors import StatefulProcessorError
from sessionstore.operators.processors import BatchTimes, ProcessorHandle, ProcessorRunner

TTL = 100


class OpsProcessor:
    """Applies each input op to its state and emits a snapshot after it."""

    def __init__(self, ttl: int | None = TTL) -> None:
        self.ttl = ttl

    def init(self, handle):
        self.h = handle
        self.v = handle.getValueState("v", "n long", self.ttl)
        self.l = handle.getListState("l", "x long", self.ttl)
        self.m = handle.getMapState("m", "k string", "x long", self.ttl)

    def _snapshot(self, key, tag):
        return (
            tag,
            key,
            self.v.get(),
            self.v.exists(),
            list(self.l.get()),
            self.l.exists(),
            sorted(self.m.iterator()),
            self.m.exists(),
            list(self.h.listTimers()),
        )

    def handleInputRows(self, key, rows, timerValues):
        for op in rows:
            name, *args = op
            if name == "v_update":
                self.v.update((args[0],))
            elif name == "v_clear":
                self.v.clear()
            elif name == "l_append":
                self.l.appendValue((args[0],))
            elif name == "l_append_list":
                self.l.appendList([(x,) for x in args[0]])
            elif name == "l_put":
                self.l.put([(x,) for x in args[0]])
            elif name == "l_clear":
                self.l.clear()
            elif name == "m_update":
                self.m.updateValue((args[0],), (args[1],))
            elif name == "m_remove":
                self.m.removeKey((args[0],))
            elif name == "m_clear":
                self.m.clear()
            elif name == "timer":
                self.h.registerTimer(args[0])
            elif name == "untimer":
                self.h.deleteTimer(args[0])
            yield self._snapshot(key, name)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield ("fired", key, expiredTimerInfo.getExpiryTimeInMs())
        yield self._snapshot(key, "after-fire")

    def close(self):
        pass


class Reference:
    """PySpark's semantics with dicts: expiry = batch time + TTL; live while
    batch time < expiry; timers due at or before the batch time (those the
    batch's input registered included) fire in (time, key) order and are deleted
    after their handler."""

    def __init__(self, ttl: int | None = TTL) -> None:
        self.ttl = ttl
        self.state: dict = {}

    def _key(self, key):
        return self.state.setdefault(key, {"v": None, "l": [], "m": {}, "t": []})

    def _live(self, expiry, now):
        return expiry is None or now < expiry

    def _snapshot(self, key, tag, now):
        s = self._key(key)
        v = s["v"] if s["v"] is not None and self._live(s["v"][1], now) else None
        items = [x for x, e in s["l"] if self._live(e, now)]
        entries = sorted((k, x) for k, (x, e) in s["m"].items() if self._live(e, now))
        return (
            tag, key, None if v is None else v[0], v is not None, items, bool(items),
            entries, bool(entries), sorted(s["t"]),
        )  # fmt: skip

    def run(self, groups, now):
        out = []
        exp = None if self.ttl is None else now + self.ttl
        for key in sorted(groups):
            s = self._key(key)
            for op in groups[key]:
                name, *args = op
                live_l = [(x, e) for x, e in s["l"] if self._live(e, now)]
                live_m = {k: (x, e) for k, (x, e) in s["m"].items() if self._live(e, now)}
                if name == "v_update":
                    s["v"] = ((args[0],), exp)
                elif name == "v_clear":
                    s["v"] = None
                elif name == "l_append":
                    s["l"] = live_l + [((args[0],), exp)]
                elif name == "l_append_list":
                    s["l"] = live_l + [((x,), exp) for x in args[0]]
                elif name == "l_put":
                    s["l"] = [((x,), exp) for x in args[0]]
                elif name == "l_clear":
                    s["l"] = []
                elif name == "m_update":
                    live_m[(args[0],)] = ((args[1],), exp)
                    s["m"] = live_m
                elif name == "m_remove":
                    live_m.pop((args[0],), None)
                    s["m"] = live_m
                elif name == "m_clear":
                    s["m"] = {}
                elif name == "timer":
                    if args[0] not in s["t"]:
                        s["t"].append(args[0])
                elif name == "untimer":
                    if args[0] in s["t"]:
                        s["t"].remove(args[0])
                out.append(self._snapshot(key, name, now))
        due = sorted((t, k) for k, s in self.state.items() for t in s["t"] if t <= now)
        for t, key in due:
            out.append(("fired", key, t))
            out.append(self._snapshot(key, "after-fire", now))
            self.state[key]["t"].remove(t)
        return out

    def next_deadlines(self, now):
        """The earliest pending timer, and the earliest expiry after ``now`` of a
        stored item (what the batch at ``now`` left to expire): what each commit
        records for the due source (sessionstore/checkpoint/records/deadlines.py)."""
        timers = [t for s in self.state.values() for t in s["t"]]
        expiries = []
        for s in self.state.values():
            expiries += [s["v"][1]] if s["v"] is not None else []
            expiries += [e for _, e in s["l"]] + [e for _, e in s["m"].values()]
        later = [e for e in expiries if e is not None and e > now]
        return (min(timers) if timers else None), (min(later) if later else None)


KEYS = st.sampled_from([("a",), ("b",), ("c",), ("é",)])
OPS = st.one_of(
    st.tuples(st.just("v_update"), st.integers(-5, 5)),
    st.tuples(st.just("v_clear")),
    st.tuples(st.just("l_append"), st.integers(0, 9)),
    st.tuples(st.just("l_append_list"), st.lists(st.integers(0, 9), min_size=1, max_size=3)),
    st.tuples(st.just("l_put"), st.lists(st.integers(0, 9), min_size=1, max_size=3)),
    st.tuples(st.just("l_clear")),
    st.tuples(st.just("m_update"), st.sampled_from("pqr"), st.integers(0, 9)),
    st.tuples(st.just("m_remove"), st.sampled_from("pqr")),
    st.tuples(st.just("m_clear")),
    st.tuples(st.just("timer"), st.sampled_from([0, 1, 50, 100, 101, 150, 200, 300])),
    st.tuples(st.just("untimer"), st.sampled_from([0, 50, 100, 150, 200, 300])),
)
BATCHES = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 49, 50, 51, 100]),  # how far processing time moves (TTL edges)
        st.lists(st.tuples(KEYS, OPS), max_size=12),
        st.booleans(),  # reopen the database after the batch
    ),
    min_size=1,
    max_size=6,
)


def _groups(rows):
    groups: dict = {}
    for key, op in rows:
        groups.setdefault(key, []).append(op)
    return groups


def _run_ours(db, processor, groups, now, ttl_limit=10_000):
    store = db.open_store("processor", "proc")
    handle = ProcessorHandle(store, "ProcessingTime")
    runner = ProcessorRunner(processor, handle, "ProcessingTime")
    items = [
        (k, None, (lambda ops=ops: iter(ops)))
        for k, ops in sorted(groups.items(), key=lambda kv: encode_key(kv[0][0]))
    ]
    with db.batch():
        return runner.run_batch(items, BatchTimes(now, -1), ttl_cleanup_limit=ttl_limit)


def _check_against_reference(path, batches, ttl, processor, check=lambda got: None):
    """Run ``batches`` through ``processor()`` (one per batch, as Spark makes one
    per task) and the reference model; outputs must be equal, and pass ``check``."""
    reference = Reference(ttl)
    db = StateDB.open(path)
    now = 0
    try:
        for step, rows, reopen in batches:
            now += step
            groups = _groups(rows)
            # keys are compared in encoded order, which is str order for these keys
            expected = reference.run(groups, now)
            got = _run_ours(db, processor(), groups, now).outputs
            assert got == expected
            check(got)
            store = db.open_store("processor", "proc")
            pending = (store.index_first(store.timers_cf), store.index_first(store.ttl_cf))
            assert pending == reference.next_deadlines(now)
            if reopen:
                db.close()
                db = StateDB.open(path)
    finally:
        db.close()


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(batches=BATCHES, ttl=st.sampled_from([None, TTL]))
def test_runner_equals_the_reference_model(tmp_path_factory, batches, ttl):
    _check_against_reference(
        tmp_path_factory.mktemp("proc"), batches, ttl, lambda: OpsProcessor(ttl)
    )


One = namedtuple("One", "x")
#: How a processor may hand a value tuple to a state call; every shape stores and
#: reads back as the same plain tuple of Python scalars (PySpark normalises too).
SHAPES = {
    "tuple": lambda t: t,
    "numpy": lambda t: tuple(np.int64(x) if isinstance(x, int) else np.str_(x) for x in t),
    "namedtuple": lambda t: One(*t),
    "list": list,
}


class _Reshaping:
    """A state variable whose tuple arguments arrive in the drawn shapes, in turn."""

    def __init__(self, var, shapes):
        self._var, self._shapes = var, shapes

    def _reshape(self, arg):
        if isinstance(arg, tuple):
            return SHAPES[next(self._shapes)](arg)
        if isinstance(arg, list):
            return [self._reshape(x) for x in arg]
        return arg

    def __getattr__(self, name):
        method = getattr(self._var, name)
        return lambda *args: method(*[self._reshape(a) for a in args])


class ShapedOpsProcessor(OpsProcessor):
    def __init__(self, ttl, shapes):
        super().__init__(ttl)
        self.shapes = itertools.cycle(shapes)

    def init(self, handle):
        super().init(handle)
        self.v, self.l, self.m = (_Reshaping(x, self.shapes) for x in (self.v, self.l, self.m))


def _only_plain_values(obj) -> bool:
    if type(obj) in (tuple, list):
        return all(_only_plain_values(x) for x in obj)
    return type(obj) in (int, str, bool, type(None))


@settings(max_examples=40, deadline=None)
@given(
    batches=BATCHES,
    ttl=st.sampled_from([None, TTL]),
    shapes=st.lists(st.sampled_from(sorted(SHAPES)), min_size=1, max_size=4),
)
def test_values_in_any_shape_are_stored_as_plain_tuples(tmp_path_factory, batches, ttl, shapes):
    # state calls take a fast path for plain tuples of scalars: numpy scalars,
    # namedtuples (Rows) and lists must still be normalised, keys included
    def plain(got):
        assert _only_plain_values(got), got

    _check_against_reference(
        tmp_path_factory.mktemp("proc"), batches, ttl, lambda: ShapedOpsProcessor(ttl, shapes),
        plain,
    )  # fmt: skip


def test_ttl_cleanup_removes_expired_rows_of_untouched_keys_in_bounded_passes(db):
    class Writer:
        def init(self, handle):
            self.m = handle.getMapState("m", "k string", "x long", ttlDurationMs=50)
            self.v = handle.getValueState("v", "x long")

        def handleInputRows(self, key, rows, tv):
            for r in rows:
                self.m.updateValue((r,), (1,))
            self.v.update((7,))
            return iter([])

    groups = {(f"k{i:02d}",): ["x", "y"] for i in range(30)}
    _run_ours(db, Writer(), groups, now=1000)
    store = db.open_store("processor", "proc")
    assert sum(r["state"] == "m" for r in store.read_rows()) == 30
    # nothing is touched at 1049; at 1050 every map has expired: each pass visits
    # at most 12 (key, variable) pairs of the TTL index, never every key
    assert _run_ours(db, Writer(), {}, now=1049).ttl_visited == 0
    visited = [_run_ours(db, Writer(), {}, now=1050, ttl_limit=12).ttl_visited for _ in range(4)]
    assert visited == [12, 12, 6, 0]
    rows = list(store.read_rows())
    assert [r["state"] for r in rows] == ["v"] * 30  # the value without TTL stays
    assert list(db.scan(store.ttl_cf)) == []


def test_every_row_routes_by_its_grouping_key(db):
    class Everything:
        def init(self, handle):
            self.h = handle
            self.l = handle.getListState("l", "x long", ttlDurationMs=10)

        def handleInputRows(self, key, rows, tv):
            self.l.appendValue((1,))
            self.h.registerTimer(5000)
            return iter([])

    keys = ["a", "ab", "a\x00", "ü"]
    _run_ours(db, Everything(), {(k,): [1] for k in keys}, now=100)
    store = db.open_store("processor", "proc")
    for family in (store.kv_cf, store.timers_cf, store.ttl_cf):
        routed = sorted(store.grouping_key_of(family, raw) for raw, _ in db.scan(family))
        per_key = 2 if family == store.kv_cf else 1
        assert routed == sorted(encode_key(k) for k in keys for _ in range(per_key))


def _error(processor, mode="None", groups=None, now=-1):
    with pytest.raises(StatefulProcessorError) as info:
        db_path = pytest.importorskip("tempfile").mkdtemp()
        with StateDB.open(db_path) as db:
            store = db.open_store("processor", "proc")
            runner = ProcessorRunner(processor, ProcessorHandle(store, mode), mode)
            items = [(k, None, lambda: iter([1])) for k in (groups or [("a",)])]
            with db.batch():
                runner.run_batch(items, BatchTimes(now, -1))
    return info.value


class _Base:
    def init(self, handle):
        self.h = handle

    def handleInputRows(self, key, rows, tv):
        return iter([])


def test_misuse_gets_sparks_error_conditions():
    class LateState(_Base):
        def handleInputRows(self, key, rows, tv):
            self.h.getValueState("v", "x long")
            return iter([])

    e = _error(LateState())
    assert e.error_class == "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE"
    assert "operation=get_value_state" in str(e) and "state=INITIALIZED" in str(e)

    class TimerWithoutMode(_Base):
        def handleInputRows(self, key, rows, tv):
            self.h.registerTimer(5)
            return iter([])

    e = _error(TimerWithoutMode())
    assert e.error_class == "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE"
    assert "operation=register_timer" in str(e) and "timeMode=NoTime" in str(e)

    class TimerInInit(_Base):
        def init(self, handle):
            handle.registerTimer(5)

    e = _error(TimerInInit(), "ProcessingTime", now=10)
    assert e.error_class == "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE"

    class TwoOfAName(_Base):
        def init(self, handle):
            handle.getValueState("x", "a long")
            handle.getListState("x", "a long")

    e = _error(TwoOfAName())
    assert e.error_class == "STATEFUL_PROCESSOR_DUPLICATE_STATE_VARIABLE_DEFINED"

    class TtlWithoutProcessingTime(_Base):
        def init(self, handle):
            handle.getValueState("x", "a long", 1000)

    e = _error(TtlWithoutProcessingTime(), "EventTime")
    assert e.error_class == "STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL"
    assert "timeMode=EventTime" in str(e)

    class ZeroTtl(_Base):
        def init(self, handle):
            handle.getValueState("x", "a long", 0)

    e = _error(ZeroTtl(), "ProcessingTime", now=10)
    assert e.error_class == "STATEFUL_PROCESSOR_TTL_DURATION_MUST_BE_POSITIVE"

    class NullValue(_Base):
        def init(self, handle):
            self.v = handle.getValueState("v", "a long")

        def handleInputRows(self, key, rows, tv):
            self.v.update(None)
            return iter([])

    e = _error(NullValue())
    assert str(e) == (
        "[ILLEGAL_STATE_STORE_VALUE.NULL_VALUE] Cannot write null values to State Store "
        "for StateName v."
    )

    class EmptyList(_Base):
        def init(self, handle):
            self.l = handle.getListState("l", "a long")

        def handleInputRows(self, key, rows, tv):
            self.l.put([])
            return iter([])

    e = _error(EmptyList())
    assert e.error_class == "ILLEGAL_STATE_STORE_VALUE.EMPTY_LIST_VALUE"

    class StateInClose(_Base):
        def init(self, handle):
            self.v = handle.getValueState("v", "a long")

        def close(self):
            self.v.get()

    e = _error(StateInClose())
    assert e.error_class == "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE"


def test_an_unknown_time_mode_names_the_accepted_ones():
    from sessionstore.operators.processors import normalise_time_mode

    assert normalise_time_mode("eventtime") == "EventTime"
    with pytest.raises(StatefulProcessorError, match="STATEFUL_PROCESSOR_UNKNOWN_TIME_MODE"):
        normalise_time_mode("wallclock")


def test_session_and_versioned_state_per_key(db):
    class Extra:
        def init(self, handle):
            self.s = handle.getSessionState("sessions", retention_ms=1000)
            self.ver = handle.getVersionedState("prices", history_retention_ms=1000)

        def handleInputRows(self, key, rows, tv):
            for ts, price in rows:
                self.s.put(ts, ts + 5, {"n": 1})
                self.ver.put(price, ts)
            yield (key, self.s.fetch(), self.ver.get(as_of=15).value, self.ver.get().value)

    handle = ProcessorHandle(
        db.open_store("processor", "proc"),
        open_store=lambda kind, name, retention: db.open_store(kind, name, retention),
    )
    runner = ProcessorRunner(Extra(), handle)
    with db.batch():
        out = runner.run_batch(
            [
                (("a",), None, lambda: iter([(10, 1.5), (20, 2.5)])),
                (("b",), None, lambda: iter([(12, 9.0)])),
            ],
            BatchTimes(),
        ).outputs
    assert out == [
        (("a",), [(10, 15, {"n": 1}), (20, 25, {"n": 1})], 1.5, 2.5),
        (("b",), [(12, 17, {"n": 1})], 9.0, 9.0),
    ]
    assert handle.extra_stores == {"sessions": ("session", 1000), "prices": ("versioned", 1000)}


def test_initial_state_comes_first_and_keys_without_rows_get_it_too(db):
    class Seeded:
        def init(self, handle):
            self.v = handle.getValueState("v", "n long")

        def handleInitialState(self, key, initial, tv):
            self.v.update(((self.v.get() or (0,))[0] + initial,))

        def handleInputRows(self, key, rows, tv):
            n = (self.v.get() or (0,))[0] + sum(rows)
            self.v.update((n,))
            yield (key, n)

    store = db.processor_store("proc")
    runner = ProcessorRunner(Seeded(), ProcessorHandle(store))
    with db.batch():
        out = runner.run_batch(
            [(("b",), None, lambda: iter([1, 2]))],
            BatchTimes(),
            initial={("a",): [10], ("b",): [100, 1000], ("c",): [5]},
        ).outputs
    assert out == [(("b",), 1103)]
    assert {r["key"]: r["value"]["value"] for r in store.read_rows()} == {
        "a": [10], "b": [1103], "c": [5]
    }  # fmt: skip


class _DeletesAfterUse(_Base):
    """Batch 1 writes ``v`` and ``m``; from batch 2 ``init`` deletes ``v`` after
    defining it, and the handler tries to write it anyway."""

    def __init__(self, delete: bool) -> None:
        self.delete = delete

    def init(self, handle):
        self.v = handle.getValueState("v", "a long")
        self.m = handle.getMapState("m", "k string", "a long")
        if self.delete:
            handle.deleteIfExists("v")

    def handleInputRows(self, key, rows, tv):
        out = []
        for call in (lambda: self.v.update((2,)), self.v.get, self.v.exists):
            try:
                out.append(call())
            except RuntimeError as e:
                out.append(str(e).split(":")[0])
        self.m.updateValue("x", (1,))  # a bare one-character key: ("x",)
        out.append(sorted(self.m.keys()))
        if not self.delete:
            self.v.update((1,))
        return iter([out])


def test_a_deleted_variable_refuses_calls_and_is_never_written_back(db):
    store = db.open_store("processor", "proc")

    def run(delete):
        runner = ProcessorRunner(_DeletesAfterUse(delete), ProcessorHandle(store, "None"))
        with db.batch():
            return runner.run_batch([(("a",), None, lambda: iter([1]))], BatchTimes()).outputs

    assert run(False) == [[None, (2,), True, [("x",)]]]
    assert store.load(encode_key("a"), [encode_key("v")]) == [((1,), None)]
    # deleted in init: every call refuses (the update too), nothing is written
    assert run(True) == [
        ["Error updating value state", "Error getting value state",
         "Error checking value state exists", [("x",)]],
    ]  # fmt: skip
    assert store.load(encode_key("a"), [encode_key("v")]) == [None]


def test_a_longer_bare_string_map_key_is_refused_as_in_spark(db):
    class LongKey(_Base):
        def init(self, handle):
            self.m = handle.getMapState("m", _OneField(), "a long")

        def handleInputRows(self, key, rows, tv):
            self.m.containsKey("ab")
            return iter([])

    store = db.open_store("processor", "proc")
    handle = ProcessorHandle(store, "None", parse_schema=lambda schema: schema)
    runner = ProcessorRunner(LongKey(), handle)
    with pytest.raises(RuntimeError, match=r"^Error checking if map state contains key: "
                       r"\[STRUCT_ARRAY_LENGTH_MISMATCH\].* 1 fields are required while 2"):  # fmt: skip
        with db.batch():
            runner.run_batch([(("a",), None, lambda: iter([1]))], BatchTimes())


class _OneField:
    """A parsed schema of one field, as the engine's parse_schema returns it."""

    fields = ("k",)


def test_processor_modules_share_the_core_through_public_names_only():
    """The handle, its variables and the runner meet in ProcessorCore: no module of
    the package reads another object's ``_private`` attribute (``self._x`` only),
    and none imports the handle except the runner (no circle through it)."""
    import ast
    import pathlib

    import sessionstore.operators.processors as package

    folder = pathlib.Path(package.__file__).parent
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                owner = node.value
                mine = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
                dunder = node.attr.startswith("__") and node.attr.endswith("__")
                assert mine or dunder, f"{path.name}:{node.lineno} reads .{node.attr}"
            if isinstance(node, ast.ImportFrom) and path.stem not in ("runner", "__init__"):
                assert node.module != "sessionstore.operators.processors.handle", path.name


def test_a_map_state_parses_each_schema_once_and_counts_its_key_fields_from_it(db):
    parsed = []

    class Schema:
        def __init__(self, text):
            self.text = text
            self.fields = text.split(",")

        def jsonValue(self):  # noqa: N802 - PySpark's name
            return {"type": "struct", "fields": [
                {"name": f.split()[0], "type": f.split()[1], "nullable": True, "metadata": {}}
                for f in self.fields
            ]}  # fmt: skip

    def parse(text):
        parsed.append(text)
        return Schema(text)

    handle = ProcessorHandle(db.open_store("processor", "proc"), "None", parse_schema=parse)
    m = handle.getMapState("m", "k string,j long", "a long")
    assert sorted(parsed) == ["a long", "k string,j long"]
    assert m.key_fields == 2
    assert handle.schemas["m"]["key_schema"]["fields"][1]["name"] == "j"


def _type(kind, **parts):
    return {"type": kind, **parts}


def _struct(*fields):
    return {"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields
    ]}  # fmt: skip


KV = _struct(("key", "string"), ("value", "string"))
NOTE = _struct(("n", "long"), ("note", "string"))
COMPOSITE = _struct(
    ("tags", _type("array", elementType=KV, containsNull=True)),
    ("attrs", _type("map", keyType="string", valueType=NOTE, valueContainsNull=True)),
    ("inner", _struct(("names", _type("array", elementType="string", containsNull=True)),
                      ("pos", _struct(("x", "long"), ("y", "long"))))),
)  # fmt: skip
Row = namedtuple("Row", "key value")  # a positional struct value, as PySpark's Row


class _Composite(_Base):
    """Writes composite values in every state kind as PySpark users write them
    (structs as dicts by field name, tuples and Rows by position, None at each
    level) and reports what each reads back."""

    def init(self, handle):
        self.v = handle.getValueState("v", COMPOSITE)
        self.l = handle.getListState("l", COMPOSITE, TTL)
        self.m = handle.getMapState("m", _struct(("k", "string")), COMPOSITE)

    def handleInputRows(self, key, rows, tv):
        seen = (self.v.get(), list(self.l.get()), dict(self.m.iterator()))
        for value in rows:
            self.v.update(value)
            self.l.appendValue(value)
            self.l.appendList([value, (None, None, None)])
            self.m.updateValue(("k",), value)
        yield seen
        yield (self.v.get(), list(self.l.get()), dict(self.m.iterator()))


def test_structs_given_as_dicts_rows_and_tuples_read_back_by_field_at_any_depth(tmp_path):
    """PySpark's ``StructType.toInternal`` rules in every state kind, in the batch
    and after a reopen (issue 43: a dict in an array was stored by its keys)."""

    def make(names):
        return namedtuple("S", names)._make

    given = (
        [{"key": "env", "value": "prod"}, None, {"value": "only", "extra": 1}, ("t1", None),
         Row("k", "v")],
        {"a": {"note": "z", "n": 1}, "b": None},
        {"names": ("p", None), "pos": [3, None]},
    )  # fmt: skip
    s = make(["key", "value"])
    read = (
        [s(("env", "prod")), None, s((None, "only")), s(("t1", None)), s(("k", "v"))],
        {"a": make(["n", "note"])((1, "z")), "b": None},
        make(["names", "pos"])((["p", None], make(["x", "y"])((3, None)))),
    )
    empty = (None, None, None)

    def run(path, rows):
        db = StateDB.open(path)
        try:
            store = db.open_store("processor", "proc")
            handle = ProcessorHandle(store, "ProcessingTime", make_struct=make)
            runner = ProcessorRunner(_Composite(), handle)
            with db.batch():
                return runner.run_batch([(("a",), None, lambda: iter(rows))], BatchTimes()).outputs
        finally:
            db.close()

    after = (read, [read, read, empty], {("k",): read})
    assert run(tmp_path / "db", [given]) == [(None, [], {}), after]
    got = run(tmp_path / "db", [])  # read back from the store, by a new handle
    assert got == [after, after]
    assert type(got[0][0][0][0]).__name__ == "S"  # nested structs by the engine's maker


@pytest.mark.parametrize(
    "value, error, match",
    [
        ((["s"], None, None), StatefulProcessorError,
         r"^\[UNEXPECTED_TUPLE_WITH_STRUCT\] Unexpected tuple 's' with StructType"),
        (([("a",)], None, None), RuntimeError,
         r"^Error updating value state: \[STRUCT_ARRAY_LENGTH_MISMATCH\].* 2 fields are "
         r"required while 1 values are provided"),
        ((None, None), RuntimeError, r"2 values are provided"),
        (("no list", None, None), TypeError, r"array<...> field cannot hold str 'no list'"),
    ],
)  # fmt: skip
def test_a_value_that_does_not_fit_its_struct_gets_sparks_error(db, value, error, match):
    class Writes(_Base):
        def init(self, handle):
            self.v = handle.getValueState("v", COMPOSITE)

        def handleInputRows(self, key, rows, tv):
            self.v.update(value)
            return iter([])

    runner = ProcessorRunner(Writes(), ProcessorHandle(db.open_store("processor", "proc"), "None"))
    with pytest.raises(error, match=match):
        with db.batch():
            runner.run_batch([(("a",), None, lambda: iter([1]))], BatchTimes())
