"""Aggregations for window operators: an initializer, an aggregator and a merger.

A custom aggregation is any :class:`Aggregation`; the built-ins (count, sum, min,
max, first, last, collect) combine into named outputs over value columns::

    Aggregations({"clicks": "count", "revenue": ("sum", "amount"), "pages": ("collect", "page")})

The accumulator of a combination is a list with one slot per output, so it
serialises with msgpack. ``finish`` turns it into a ``{name: result}`` dict.

``first`` and ``last`` are by event time (ties: first arrival wins for ``first``,
last arrival for ``last``), so they do not depend on the order records arrive in.
``collect`` keeps values in session order: merged sessions oldest first, then
records in arrival order.

An operator that keeps accumulators of built-in aggregates in a store records an
*output plan* there (:func:`record_output_plan`): the aggregates' names, functions
and columns, and how its stored values wrap the accumulator. It is written in the
store's metadata, so it travels in the checkpoint's changelogs and snapshots, and a
reader (the CLI, the Spark data source) turns stored values back into the
operator's output with :func:`recorded_output`, without the job's code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = [
    "Aggregation",
    "Aggregations",
    "BUILTINS",
    "OUTPUT_PLAN_AUX",
    "make_aggregation",
    "output_plan",
    "record_output_plan",
    "recorded_output",
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


# Each built-in: (initial slot, add(slot, value, ts) -> slot, merge(slot, slot) -> slot,
# result(slot)). Slots are msgpack-friendly (numbers, lists, None).
def _count_add(slot, value, ts):
    return slot + 1


def _sum_add(slot, value, ts):
    return slot if value is None else slot + value


def _min_add(slot, value, ts):
    return value if slot is None or (value is not None and value < slot) else slot


def _max_add(slot, value, ts):
    return value if slot is None or (value is not None and value > slot) else slot


def _first_add(slot, value, ts):
    return [ts, value] if slot is None or ts < slot[0] else slot


def _last_add(slot, value, ts):
    return [ts, value] if slot is None or ts >= slot[0] else slot


def _collect_add(slot, value, ts):
    slot.append(value)
    return slot


def _min_merge(a, b):
    return _min_add(a, b, 0) if b is not None else a


def _max_merge(a, b):
    return _max_add(a, b, 0) if b is not None else a


def _first_merge(a, b):
    # a holds older sessions than b, so on a tie a's value came first
    if a is None:
        return b
    if b is None:
        return a
    return b if b[0] < a[0] else a


def _last_merge(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return b if b[0] >= a[0] else a


def _stamped_value(slot):
    return None if slot is None else slot[1]


BUILTINS: dict[str, tuple[Callable[[], Any], Callable, Callable, Callable]] = {
    "count": (lambda: 0, _count_add, lambda a, b: a + b, _identity),
    "sum": (lambda: 0, _sum_add, lambda a, b: a + b, _identity),
    "min": (lambda: None, _min_add, _min_merge, _identity),
    "max": (lambda: None, _max_add, _max_merge, _identity),
    "first": (lambda: None, _first_add, _first_merge, _stamped_value),
    "last": (lambda: None, _last_add, _last_merge, _stamped_value),
    "collect": (list, _collect_add, lambda a, b: a + b, _identity),
}


class Aggregations(Aggregation):
    """Several named built-in aggregates over value columns, as one Aggregation.

    ``spec`` maps an output name to ``"count"`` or to ``(function, column)``, where
    function is one of sum, min, max, first, last or collect. A column of ``None``
    aggregates the whole value; otherwise values must be mappings (rows).
    """

    def __init__(self, spec: Mapping[str, str | tuple[str, str | None]]) -> None:
        if not isinstance(spec, Mapping) or not spec:
            raise ValueError(f"aggregations must be a non-empty dict, got {spec!r}")
        names, parts = [], []
        for name, how in spec.items():
            if how == "count" or how == ("count", None):
                fn, column = "count", None
            elif isinstance(how, tuple) and len(how) == 2 and how[0] in BUILTINS:
                fn, column = how
            else:
                raise ValueError(
                    f"aggregation {name!r}: expected 'count' or (function, column) with "
                    f"function in {sorted(set(BUILTINS) - {'count'})}, got {how!r}"
                )
            names.append(name)
            parts.append((fn, column) + BUILTINS[fn])
        self.spec = dict(spec)
        self.names = names
        self.columns = [column for _, column, *_ in parts]
        self.functions = [fn for fn, *_ in parts]
        inits = [p[2] for p in parts]
        adds = [p[3] for p in parts]
        merges = [p[4] for p in parts]
        results = [p[5] for p in parts]
        columns = self.columns
        width = range(len(parts))

        def initializer() -> list:
            return [init() for init in inits]

        def aggregator_ts(key: Any, value: Any, ts: int, acc: list) -> list:
            for i in width:
                column = columns[i]
                v = value if column is None else (None if value is None else value[column])
                acc[i] = adds[i](acc[i], v, ts)
            return acc

        def merger(key: Any, a: list, b: list) -> list:
            return [merges[i](a[i], b[i]) for i in width]

        def finish(acc: list) -> dict[str, Any]:
            return {names[i]: results[i](acc[i]) for i in width}

        def aggregator(key: Any, value: Any, acc: list) -> list:
            raise TypeError("built-in aggregations need the event time: call add()")

        object.__setattr__(self, "initializer", initializer)
        object.__setattr__(self, "aggregator", aggregator)
        object.__setattr__(self, "merger", merger)
        object.__setattr__(self, "finish", finish)
        object.__setattr__(self, "aggregator_ts", aggregator_ts)

    def __repr__(self) -> str:
        return f"Aggregations({self.spec!r})"


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


def output_plan(aggregation: Aggregation, layout: str) -> dict[str, Any] | None:
    """The record of how to finish stored values of ``aggregation`` wrapped as
    ``layout`` (see ``_LAYOUTS``), or None when the aggregation is custom code,
    which cannot be recorded (its stored values are then read raw)."""
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(_LAYOUTS)}, got {layout!r}")
    if not isinstance(aggregation, Aggregations):
        return None
    aggregates = zip(aggregation.names, aggregation.functions, aggregation.columns, strict=True)
    return {"layout": layout, "aggregates": [list(a) for a in aggregates]}


def record_output_plan(store: Any, aggregation: Aggregation, layout: str) -> None:
    """Record in ``store``'s metadata how a reader finishes its values (or that it
    cannot, for a custom aggregation); written only when it changes, in the
    store's current batch, so it is committed with the operator's state."""
    plan = output_plan(aggregation, layout)
    packed = None if plan is None else msgpack.packb(plan)
    if store.read_aux(OUTPUT_PLAN_AUX) != packed:
        store.write_aux(OUTPUT_PLAN_AUX, packed)


def recorded_output(store: Any) -> Callable[[Any], tuple[dict[str, Any], dict[str, Any]]] | None:
    """The output plan recorded in ``store`` as a function ``stored value ->
    (fields beside the aggregates, {aggregate name: result})``, or None when the
    store has no plan (a plain store, a custom aggregation, an older checkpoint, or
    a layout this release does not know). Results come from the operators' own
    :meth:`Aggregations.finish`."""
    read = getattr(store, "read_aux", None)
    packed = None if read is None else read(OUTPUT_PLAN_AUX)
    if packed is None:
        return None
    plan = msgpack.unpackb(packed, raw=False)
    unwrap = _LAYOUTS.get(plan.get("layout"))
    if unwrap is None:
        return None
    try:
        spec = {name: (fn, column) for name, fn, column in plan["aggregates"]}
        finish = Aggregations(spec).finish
    except ValueError:  # a function of a newer release
        return None

    def finished(value: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        fields, acc = unwrap(value)
        return fields, finish(acc)

    return finished
