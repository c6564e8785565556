"""Aggregations for window operators: an initializer, an aggregator and a merger.

A custom aggregation is any :class:`Aggregation`; the built-ins (Spark's aggregate
functions, :mod:`~sessionstore.operators.aggregate_functions`) and custom ones
combine into named outputs over value columns::

    Aggregations({"clicks": "count", "avg": ("avg", "amount"), "pages": ("collect_set", "page")})

The accumulator of a combination is a list with one slot per output, so it
serialises with msgpack (sketches as their bytes). ``finish`` turns it into a
``{name: result}`` dict.

``first`` and ``last`` are by event time (ties: first arrival wins for ``first``,
last arrival for ``last``), so they do not depend on the order records arrive in.
``collect`` keeps values in session order: merged sessions oldest first, then
records in arrival order.

An operator that keeps accumulators of built-in aggregates in a store records an
*output plan* there (:func:`record_output_plan`): the aggregates' names, functions
and columns, and how its stored values wrap the accumulator. It is written in the
store's metadata, so it travels in the checkpoint's changelogs and snapshots, and a
reader (the CLI, the Spark data source) turns stored values back into the
operator's output with :func:`recorded_output`, without the job's code. The plan
also says whether the operator shows its event times as timestamps
(:func:`recorded_time_type`); an operator without aggregates records only that
(:func:`record_time_type`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import msgpack

from sessionstore.operators.aggregate_functions import (
    AggregateSpec,
    Slot,
    bind,
    decimal_type,
    parse_spec,
)

__all__ = [
    "Aggregation",
    "Aggregations",
    "OUTPUT_PLAN_AUX",
    "make_aggregation",
    "output_plan",
    "record_output_plan",
    "record_time_type",
    "recorded_output",
    "recorded_plan",
    "recorded_time_type",
]


def _identity(acc: Any) -> Any:
    return acc


@dataclass(frozen=True)
class Aggregation:
    """``initializer() -> acc``, ``aggregator(key, value, acc) -> acc``,
    ``merger(key, acc1, acc2) -> acc`` and ``finish(acc) -> output``.

    ``aggregator_ts(key, value, ts, acc)``, when given, is used instead of
    ``aggregator`` so that an aggregation can depend on event time.
    """

    initializer: Callable[[], Any]
    aggregator: Callable[[Any, Any, Any], Any]
    merger: Callable[[Any, Any, Any], Any]
    finish: Callable[[Any], Any] = _identity
    aggregator_ts: Callable[[Any, Any, int, Any], Any] | None = None

    def add(self, key: Any, value: Any, ts: int, acc: Any) -> Any:
        if self.aggregator_ts is not None:
            return self.aggregator_ts(key, value, ts, acc)
        return self.aggregator(key, value, acc)


# How a part reads its input from a record's value
_WHOLE, _FIELD, _PAIR, _CUSTOM, _CONVERTED = range(5)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DAY = date(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


def _epoch_micros(value: Any) -> Any:
    """A ``datetime`` as epoch microseconds (a naive one read as UTC); other
    values as they are."""
    if not isinstance(value, datetime):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _MICROSECOND


def _epoch_days(value: Any) -> Any:
    """A ``date`` as days since 1970-01-01; other values as they are."""
    if isinstance(value, date) and not isinstance(value, datetime):
        return (value - _EPOCH_DAY).days
    return value


#: The number a built-in reads for a value of each type that arrives as an object.
_AS_NUMBER: dict[str, Callable[[Any], Any]] = {"timestamp": _epoch_micros, "date": _epoch_days}


def _parsed(
    spec: Mapping[str, Any], types: Mapping[str, str], overflow: str
) -> tuple[list[AggregateSpec], list[Slot], list[Aggregation | None]]:
    """Each aggregate of ``spec`` parsed and bound to its slot functions (a custom
    :class:`Aggregation` as itself, beside a placeholder spec and slot)."""
    specs: list[AggregateSpec] = []
    slots: list[Slot] = []
    customs: list[Aggregation | None] = []
    for name, how in spec.items():
        if isinstance(how, Aggregation):
            specs.append(AggregateSpec(name, "custom", None))
            slots.append(Slot(how.initializer, _no_add, _no_merge, how.finish))
            customs.append(how)
            continue
        if how == ("count", None) or how == ["count", None]:
            how = "count"
        parsed = parse_spec(name, how)
        decimals = tuple(decimal_type(types.get(c)) for c in parsed.columns)
        if any(decimals):
            parsed = replace(parsed, decimals=decimals, overflow=overflow)
        specs.append(parsed)
        slots.append(bind(parsed))
        customs.append(None)
    return specs, slots, customs


def _reads(
    specs: list[AggregateSpec],
    customs: list[Aggregation | None],
    converters: Mapping[str, Callable[[Any], Any]],
) -> tuple[list[int], list[Any]]:
    """How each aggregate reads its input from a record's value: its kind
    (``_WHOLE``, ``_FIELD``, ``_PAIR``, ``_CUSTOM``, ``_CONVERTED``) and what it
    reads (a column, a pair of columns with their converters, ...)."""
    kinds, reads = [], []
    for s, custom in zip(specs, customs, strict=True):
        if custom is not None:
            kinds.append(_CUSTOM)
            reads.append(None)
        elif s.fn in ("min_by", "max_by"):
            kinds.append(_PAIR)
            pair = (s.column, s.extra[0])
            reads.append((*pair, *(converters.get(c, _identity) for c in pair)))
        elif s.column in converters:
            kinds.append(_CONVERTED)
            reads.append((s.column, converters[s.column]))
        else:
            kinds.append(_WHOLE if s.column is None else _FIELD)
            reads.append(s.column)
    return kinds, reads


class Aggregations(Aggregation):
    """Several named aggregates as one Aggregation: built-in functions over value
    columns, and custom :class:`Aggregation` objects beside them.

    ``spec`` maps an output name to a spec of
    :mod:`~sessionstore.operators.aggregate_functions` (``"count"``, ``("avg",
    "amount")``, ``("min_by", "page", "ts")``, ...) or to an :class:`Aggregation`,
    which sees the whole value. A column of ``None`` aggregates the whole value;
    otherwise values must be mappings (rows). A bad spec raises ``ValueError``
    naming the aggregate.

    ``types`` names the type of the value columns whose values the built-ins must
    know it for: ``"decimal(p,s)"`` (``Decimal`` values, aggregated exactly with
    Spark's result types, see :mod:`~sessionstore.operators.aggregate_functions`),
    and ``"timestamp"`` or ``"date"`` for columns whose values arrive as
    ``datetime``/``date`` (the built-ins read them as epoch microseconds / days,
    the numbers their slots store; custom aggregations see them as they are).
    ``overflow``: what a decimal sum or average its type cannot hold gives,
    ``"error"`` (Spark's ANSI mode) or ``"null"``. ``time_type``: ``"timestamp"``
    when the operator's event time (its windows' bounds) is a timestamp where it
    is shown (a Spark timestamp column), recorded in the output plan for readers.
    """

    def __init__(
        self,
        spec: Mapping[str, Any],
        types: Mapping[str, str] | None = None,
        overflow: str = "error",
        time_type: str | None = None,
    ) -> None:
        if not isinstance(spec, Mapping) or not spec:
            raise ValueError(f"aggregations must be a non-empty dict, got {spec!r}")
        if overflow not in ("error", "null"):
            raise ValueError(f"overflow must be 'error' or 'null', got {overflow!r}")
        types = dict(types or {})
        converters = {c: _AS_NUMBER[t] for c, t in types.items() if t in _AS_NUMBER}
        specs, slots, customs = _parsed(spec, types, overflow)
        self.spec = dict(spec)
        #: the value columns' types the built-ins were bound to (see above)
        self.types = types
        #: "timestamp" when the operator shows its event times as timestamps
        self.time_type = time_type
        #: whether a built-in reads a decimal column (its slots hold decimal text,
        #: which only the record path's slot functions compare)
        self.decimals = any(any(s.decimals) for s in specs)
        #: every aggregate, parsed (``fn`` "custom" for an Aggregation)
        self.specs = specs
        self.names = [s.name for s in specs]
        self.columns = [s.column for s in specs]
        self.functions = [s.fn for s in specs]
        inits = [s.init for s in slots]
        adds = [s.add for s in slots]
        merges = [s.merge for s in slots]
        results = [s.result for s in slots]
        kinds, reads = _reads(specs, customs, converters)
        names = self.names
        width = range(len(specs))
        parts = list(zip(width, kinds, reads, adds, strict=True))

        def initializer() -> list:
            return [init() for init in inits]

        def aggregator_ts(key: Any, value: Any, ts: int, acc: list) -> list:
            for i, kind, read, add in parts:
                if kind == _FIELD:
                    v = None if value is None else value[read]
                elif kind == _WHOLE:
                    v = value
                elif kind == _PAIR:
                    if value is None:
                        v = (None, None)
                    else:
                        v = (read[2](value[read[0]]), read[3](value[read[1]]))
                elif kind == _CONVERTED:
                    v = None if value is None else read[1](value[read[0]])
                else:
                    acc[i] = customs[i].add(key, value, ts, acc[i])
                    continue
                acc[i] = add(acc[i], v, ts)
            return acc

        def merger(key: Any, a: list, b: list) -> list:
            return [
                merges[i](a[i], b[i]) if customs[i] is None else customs[i].merger(key, a[i], b[i])
                for i in width
            ]

        def finish(acc: list) -> dict[str, Any]:
            return {names[i]: results[i](acc[i]) for i in width}

        def aggregator(key: Any, value: Any, acc: list) -> list:
            raise TypeError("built-in aggregations need the event time: call add()")

        object.__setattr__(self, "initializer", initializer)
        object.__setattr__(self, "aggregator", aggregator)
        object.__setattr__(self, "merger", merger)
        object.__setattr__(self, "finish", finish)
        object.__setattr__(self, "aggregator_ts", aggregator_ts)
        self._slots = slots

    def finish_columns(self, accs: list[list]) -> dict[str, Any]:
        """What :meth:`finish` gives each of ``accs``, per aggregate: ``{name:
        column}``, a column a list or an Arrow array of the same values, computed
        column-wise where the function allows (counts, avg, the moments, HLL)."""
        by_slot = list(zip(*accs, strict=True)) if accs else [()] * len(self.names)
        return {
            name: slot.column(list(values))
            for name, slot, values in zip(self.names, self._slots, by_slot, strict=True)
        }

    def __repr__(self) -> str:
        return f"Aggregations({self.spec!r})"


def _no_add(slot: Any, value: Any, ts: int) -> Any:
    raise AssertionError("a custom aggregate adds through its Aggregation")


def _no_merge(a: Any, b: Any) -> Any:
    raise AssertionError("a custom aggregate merges through its Aggregation")


def make_aggregation(
    initializer: Callable | None,
    aggregator: Callable | None,
    merger: Callable | None,
    aggregations: Aggregation | Mapping | None,
) -> Aggregation:
    """The aggregation an operator was given: ``aggregations`` (an
    :class:`Aggregation`, or a spec for :class:`Aggregations`) or the three
    callables of a custom one, never both."""
    if aggregations is not None:
        if initializer or aggregator or merger:
            raise ValueError("pass either aggregations= or initializer/aggregator/merger, not both")
        if isinstance(aggregations, Aggregation):
            return aggregations
        return Aggregations(aggregations)
    if not (callable(initializer) and callable(aggregator) and callable(merger)):
        raise ValueError(
            "a custom aggregation needs initializer, aggregator and merger callables "
            f"(got {initializer!r}, {aggregator!r}, {merger!r})"
        )
    return Aggregation(initializer, aggregator, merger)


#: The store metadata entry (``write_aux``) that holds an operator's output plan.
OUTPUT_PLAN_AUX = "output_plan"

#: How each operator wraps its accumulator in a stored value: ``value -> (fields
#: shown beside the aggregates, accumulator)``. "acc": the value is the
#: accumulator (sessions, time windows); "acc_offsets": ``[acc, record offsets]``
#: (sessions with ``track_offsets``); "count_window": ``[window index, count, acc,
#: last offset]`` (the open window of count windows).
_LAYOUTS: dict[str, Callable[[Any], tuple[dict[str, Any], Any]]] = {
    "acc": lambda value: ({}, value),
    "acc_offsets": lambda value: ({}, value[0]),
    "count_window": lambda value: ({"window": value[0], "count": value[1]}, value[2]),
}


#: A custom aggregate as a reader sees it: its accumulator, shown as stored.
_RAW = Aggregation(lambda: None, lambda key, value, acc: acc, lambda key, a, b: a)


def output_plan(aggregation: Aggregation, layout: str) -> dict[str, Any] | None:
    """The record of how to finish stored values of ``aggregation`` wrapped as
    ``layout`` (see ``_LAYOUTS``), or None when the aggregation is custom code,
    which cannot be recorded (its stored values are then read raw). Each aggregate
    is ``[name, function, column, *arguments]``; a custom one of
    :class:`Aggregations` is recorded as function "custom" and read as its
    accumulator."""
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(_LAYOUTS)}, got {layout!r}")
    if not isinstance(aggregation, Aggregations):
        return None
    plan: dict[str, Any] = {
        "layout": layout,
        "aggregates": [s.recorded() for s in aggregation.specs],
    }
    # the decimal columns' types: a reader finishes their slots as the operator does
    decimals = {c: t for c, t in aggregation.types.items() if decimal_type(t) is not None}
    if decimals:
        plan["types"] = decimals
    if aggregation.time_type is not None:
        plan["time"] = aggregation.time_type
    return plan


def record_output_plan(store: Any, aggregation: Aggregation, layout: str) -> None:
    """Record in ``store``'s metadata how a reader finishes its values (or that it
    cannot, for a custom aggregation); written only when it changes, in the
    store's current batch, so it is committed with the operator's state."""
    _record_plan(store, output_plan(aggregation, layout))


def record_time_type(store: Any, time_type: str | None) -> None:
    """Record in ``store``'s metadata the type of its event times for an operator
    whose stored values are shown as they are (a temporal join's versioned table):
    an output plan with no layout, holding only ``"time"``. ``time_type``:
    ``"timestamp"`` when the operator's input time column is a timestamp, None
    (nothing recorded) for epoch milliseconds. Written as
    :func:`record_output_plan` writes, so committed with the operator's state."""
    _record_plan(store, None if time_type is None else {"time": time_type})


def _record_plan(store: Any, plan: dict[str, Any] | None) -> None:
    packed = None if plan is None else msgpack.packb(plan)
    if store.read_aux(OUTPUT_PLAN_AUX) != packed:
        store.write_aux(OUTPUT_PLAN_AUX, packed)


def _recorded_plan(store: Any) -> dict[str, Any] | None:
    read = getattr(store, "read_aux", None)
    packed = None if read is None else read(OUTPUT_PLAN_AUX)
    return None if packed is None else msgpack.unpackb(packed, raw=False)


def recorded_plan(store: Any) -> dict[str, Any] | None:
    """The output plan recorded in ``store`` (see :func:`output_plan`), or None."""
    return _recorded_plan(store)


def recorded_time_type(store: Any) -> str | None:
    """``"timestamp"`` when the operator that recorded ``store``'s output plan shows
    its event times (window bounds, version validity) as timestamps, else None
    (epoch milliseconds, or no plan)."""
    plan = _recorded_plan(store)
    return None if plan is None else plan.get("time")


def recorded_output(store: Any) -> Callable[[Any], tuple[dict[str, Any], dict[str, Any]]] | None:
    """The output plan recorded in ``store`` as a function ``stored value ->
    (fields beside the aggregates, {aggregate name: result})``, or None when the
    store has no plan (a plain store, a custom aggregation, an older checkpoint, or
    a layout this release does not know). Results come from the operators' own
    :meth:`Aggregations.finish`."""
    plan = _recorded_plan(store)
    if plan is None:
        return None
    unwrap = _LAYOUTS.get(plan.get("layout"))
    if unwrap is None:
        return None
    try:
        spec = {
            name: _RAW if fn == "custom" else (fn, column, *extra)
            for name, fn, column, *extra in plan["aggregates"]
        }
        # a reader shows what it can: a sum or average past its type as null
        finish = Aggregations(spec, plan.get("types"), overflow="null").finish
    except ValueError:  # a function of a newer release
        return None

    def finished(value: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        fields, acc = unwrap(value)
        return fields, finish(acc)

    return finished
