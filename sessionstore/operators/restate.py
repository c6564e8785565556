"""Setting an aggregate's result in a stored value: the accumulator a changed
result stands for (``sessionstore.rewrite`` with the rows a reader shows).

A stored value holds accumulators, not results (aggregations.py). A result
determines its accumulator only for some functions: a count, a sum, a min or a
max keeps its result as its slot, a first or last keeps ``[time, value]`` and its
time stays. Any other (an average, a collection, a sketch, a decimal extreme)
cannot be set from its result: changing it is refused by name, and a rewrite of
the raw accumulators (``raw=True``) changes it instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from sessionstore.operators.aggregate_functions import decimal_type

__all__ = ["SETTABLE", "with_results"]

#: The functions whose result sets their slot, and how it is kept.
SETTABLE = {"count": "plain", "sum": "plain", "min": "plain", "max": "plain",
            "first": "stamped", "last": "stamped"}  # fmt: skip


def _unwrapped(layout: str | None, value: Any) -> list:
    if layout == "acc":
        return list(value)
    if layout == "acc_offsets":
        return list(value[0])
    if layout == "count_window":
        return list(value[2])
    raise ValueError(f"stored values of layout {layout!r} cannot be rewritten by result")


def _wrapped(layout: str, value: Any, acc: list) -> Any:
    if layout == "acc":
        return acc
    if layout == "acc_offsets":
        return [acc, value[1]]
    return [value[0], value[1], acc, value[3]]


def _typed(name: str, fn: str, old: Any, new: Any, decimal: bool) -> Any:
    """``new`` checked against the type ``old`` had (the column's type)."""
    what = f"aggregate {name!r} ({fn})"
    if new is None or isinstance(new, bool):
        raise ValueError(f"{what}: {new!r} is not a value of it")
    if decimal:
        if fn != "sum" or not isinstance(new, Decimal):
            raise ValueError(f"{what} of a decimal column: {new!r} is not a Decimal it can set")
        return str(new)
    if fn == "count":
        if type(new) is not int or new < 0:
            raise ValueError(f"{what}: {new!r} is not a count (a non-negative int)")
        return new
    if old is None:
        if not isinstance(new, (int, float, str)):
            raise ValueError(f"{what}: {new!r} ({type(new).__name__}) is not a value of it")
        return new
    if type(old) is float and type(new) is int:
        return float(new)
    if type(new) is not type(old):
        raise ValueError(
            f"{what} holds {type(old).__name__} values; got {type(new).__name__} {new!r}"
        )
    return new


def with_results(plan: Mapping[str, Any], value: Any, old: Mapping[str, Any], new: Any) -> Any:
    """The stored ``value`` (finished by ``plan`` into the results ``old``) with
    every aggregate whose result in ``new`` differs from ``old`` set to it;
    ``ValueError`` naming the aggregate and the value when it cannot be."""
    if not isinstance(new, Mapping):
        raise ValueError(f"the value must be a mapping of the aggregates, got {new!r:.200}")
    names = [a[0] for a in plan["aggregates"]]
    if sorted(new) != sorted(names):
        raise ValueError(f"the value's aggregates are {sorted(new)}, the store's {sorted(names)}")
    layout = plan.get("layout")
    acc = _unwrapped(layout, value)
    decimals = plan.get("types") or {}
    for i, (name, fn, column, *_) in enumerate(plan["aggregates"]):
        if new[name] == old[name] and type(new[name]) is type(old[name]):
            continue
        how = SETTABLE.get(fn)
        decimal = decimal_type(decimals.get(column)) is not None
        if how is None or (decimal and fn != "sum"):
            raise ValueError(
                f"aggregate {name!r} ({fn}) cannot be set from its result ({old[name]!r} to "
                f"{new[name]!r:.100}): rewrite its accumulator with raw=True"
            )
        typed = _typed(name, fn, old[name], new[name], decimal)
        if how == "plain":
            acc[i] = typed
        elif acc[i] is None:
            raise ValueError(f"aggregate {name!r} ({fn}) saw no value: it has no time to keep")
        else:
            acc[i] = [acc[i][0], typed]
    return _wrapped(layout, value, acc)
