"""The built-in aggregate functions: how a spec is spelled and checked, and each
function's slot (initial value, add, merge, result).

A spec is Spark's function name and its arguments, so ``F.fn("c", ...)`` becomes
``("fn", "c", ...)``:

=============================================  =====================================
spec                                           slot (msgpack data)
=============================================  =====================================
``"count"``, ``("count", None)``               rows: int
``("count", c)``                               non-null values of ``c``: int
``("sum", c)``                                 None, a number, or a decimal's text
``("avg", c)``, ``("mean", c)``                ``[n, sum]``
``("min"|"max", c)``                           None or the value
``("first"|"last", c)``                        None or ``[time, value]`` (by event time)
``("collect", c)``                             every value, nulls too (in order)
``("collect_list", c)``                        non-null values (in order)
``("collect_set", c)``, ``("count_distinct",   distinct non-null values (first seen
c)``                                           first)
``("stddev"|"stddev_samp"|"stddev_pop"|        ``[n, mean, m2]`` (Welford; Chan's
"variance"|"var_samp"|"var_pop", c)``          merge)
``("min_by"|"max_by", c, o)``                  None or ``[o, c, time]`` at the least
                                               / greatest non-null ``o``
``("approx_count_distinct", c[, rsd])``        HLL: ``[lg_k, bytes, pending]``
``("percentile_approx", c, p[, accuracy])``    KLL: ``[k, bytes, pending]``
=============================================  =====================================

Nulls are skipped as Spark skips them, and a function over no non-null value
gives what Spark gives: null, except the counts (0). ``first``, ``last`` and
``collect`` keep the meaning they always had here (event time order, nulls kept).
Ties: ``min_by``/``max_by`` keep the value of the earliest event time (then the
first arrival, and in a merge the older session's), as ``first`` does.

**Exact decimals.** A spec bound to a decimal input column (its ``decimals``, see
:class:`AggregateSpec`) keeps every decimal of its slot as the value's exact text
(``"12.30"``: msgpack stores no Decimal), compares them as decimals and gives
``Decimal`` results of Spark's types: ``min``, ``max``, ``first``, ``last``, the
lists and sets and ``min_by``/``max_by`` keep the column's ``decimal(p,s)``;
``sum`` is ``decimal(min(38, p+10), s)``; ``avg`` is ``decimal(min(38, p+4),
min(38, s+4))`` with slot ``[n, sum's text]``, computed as Spark does (the sum
divided by n at scale 39, then rounded half up to the result's scale). A sum or
average that the result type cannot hold is an ``ArithmeticError`` (Spark's ANSI
mode, its default) or null (``overflow="null"``, Spark without ANSI).
The slot layouts of count(*), sum, min, max, first, last and collect are those of
the checkpoints written before the others existed.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Context, Decimal
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from sessionstore.operators import sketches

__all__ = [
    "AggregateSpec", "Slot", "FUNCTIONS", "MERGES", "parse_spec", "bind",
    "MOMENTS", "ONE_COLUMN", "FOLDED", "decimal_type", "decimal_result_type",
]  # fmt: skip

#: Functions of one column (``(fn, c)``); count takes a column or none.
ONE_COLUMN = frozenset({
    "sum", "avg", "min", "max", "first", "last", "collect", "collect_list", "collect_set",
    "count_distinct", "stddev_samp", "stddev_pop", "var_samp", "var_pop",
})  # fmt: skip
MOMENTS = frozenset({"stddev_samp", "stddev_pop", "var_samp", "var_pop"})
#: Functions whose slot holds values (lists, sets, sketches): the columnar paths
#: fold each group's values with the slot's own ``add``.
FOLDED = frozenset(
    {"collect_list", "collect_set", "count_distinct", "approx_count_distinct", "percentile_approx"}
)
_ALIASES = {"mean": "avg", "stddev": "stddev_samp", "variance": "var_samp"}
#: Every function name a spec may use.
FUNCTIONS = frozenset(
    ONE_COLUMN | set(_ALIASES) | {"count", "min_by", "max_by", "approx_count_distinct",
                                   "percentile_approx"}
)  # fmt: skip
_SHAPES = {
    "count": "'count' or ('count', column)",
    "min_by": "(fn, column, ordering column)",
    "max_by": "(fn, column, ordering column)",
    "approx_count_distinct": "(fn, column) or (fn, column, rsd)",
    "percentile_approx": "(fn, column, percentage) or (fn, column, percentage, accuracy)",
}
DEFAULT_RSD = 0.05
DEFAULT_ACCURACY = 10000


@dataclass(frozen=True)
class AggregateSpec:
    """One parsed aggregate: output name, canonical function, input column (None
    for the whole value), and the function's other arguments (``min_by``'s
    ordering column; ``rsd``; ``percentage, accuracy``)."""

    name: str
    fn: str
    column: str | None
    extra: tuple = ()
    #: ``(precision, scale)`` of each of :attr:`columns` that holds decimals (None
    #: for the others); empty when none does
    decimals: tuple = ()
    #: a decimal sum or average that its type cannot hold: "error" or "null"
    overflow: str = "error"

    @property
    def columns(self) -> list[str]:
        """The input columns it reads."""
        cols = [] if self.column is None else [self.column]
        if self.fn in ("min_by", "max_by"):
            cols.append(self.extra[0])
        return cols

    def recorded(self) -> list[Any]:
        """Its entry in an output plan: ``[name, fn, column, *extra]``."""
        extra = list(self.extra)
        if self.fn == "percentile_approx" and isinstance(extra[0], tuple):
            extra[0] = list(extra[0])
        return [self.name, self.fn, self.column, *extra]


def _fail(name: Any, how: Any, why: str) -> ValueError:
    return ValueError(f"aggregation {name!r} = {how!r}: {why}")


def parse_spec(name: str, how: Any) -> AggregateSpec:
    """The :class:`AggregateSpec` of ``name: how``; ``ValueError`` naming the
    aggregate when the function is unknown, the arity wrong, or an argument out of
    range."""
    if how == "count":
        return AggregateSpec(name, "count", None)
    if isinstance(how, list):
        how = tuple(how)
    if not isinstance(how, tuple) or not how or not isinstance(how[0], str):
        raise _fail(name, how, "expected 'count' or a tuple (function, column, ...)")
    fn = _ALIASES.get(how[0], how[0])
    args = how[1:]
    if fn not in FUNCTIONS:
        raise _fail(name, how, f"unknown function {how[0]!r}; known: {sorted(FUNCTIONS)}")
    shape = _SHAPES.get(fn, "(fn, column)")
    column = args[0] if args else None
    if not args or not (column is None or isinstance(column, str)):
        raise _fail(name, how, f"expected {shape}")
    if fn == "count" or fn in ONE_COLUMN:
        if len(args) != 1:
            raise _fail(name, how, f"{how[0]} takes one column: expected {shape}")
        return AggregateSpec(name, fn, column)
    if fn in ("min_by", "max_by"):
        if len(args) != 2 or not isinstance(args[1], str) or column is None:
            raise _fail(name, how, f"expected {shape}")
        return AggregateSpec(name, fn, column, (args[1],))
    if fn == "approx_count_distinct":
        if len(args) > 2:
            raise _fail(name, how, f"expected {shape}")
        rsd = args[1] if len(args) == 2 else DEFAULT_RSD
        try:
            sketches.hll_lg_k(rsd)
        except ValueError as e:
            raise _fail(name, how, str(e)) from None
        return AggregateSpec(name, fn, column, (float(rsd),))
    # percentile_approx
    if len(args) not in (2, 3):
        raise _fail(name, how, f"expected {shape}")
    p = args[1]
    ps = list(p) if isinstance(p, (list, tuple)) else [p]
    if not ps or any(
        isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0 for x in ps
    ):
        raise _fail(name, how, f"percentage must be in [0, 1] (or a list of such), got {p!r}")
    accuracy = args[2] if len(args) == 3 else DEFAULT_ACCURACY
    if type(accuracy) is not int or accuracy < 1:
        raise _fail(name, how, f"accuracy must be a positive int, got {accuracy!r}")
    pct = tuple(float(x) for x in ps) if isinstance(p, (list, tuple)) else float(p)
    return AggregateSpec(name, fn, column, (pct, accuracy))


@dataclass(frozen=True)
class Slot:
    """A function bound to its arguments: ``init() -> slot``, ``add(slot, value,
    ts) -> slot``, ``merge(older, newer) -> slot``, ``result(slot)``; slots that
    ignore the time may also have ``extend(slot, values) -> slot``, equal to
    ``groups(values, starts, ends) -> slots``, the slot of each group
    ``values[a:b]`` as adding its values to ``init()`` in order gives it (the
    columnar paths fold every group of a batch with one call), and
    ``results(slots) -> column``, the results of many slots at once (a list of
    what ``result`` gives each, or an Arrow array of the same values)."""

    init: Callable[[], Any]
    add: Callable[[Any, Any, int], Any]
    merge: Callable[[Any, Any], Any]
    result: Callable[[Any], Any]
    groups: Callable[[list, Sequence[int], Sequence[int]], list] | None = None
    results: Callable[[list], Any] | None = None

    def column(self, slots: list) -> Any:
        """The results of ``slots`` (a list, or an Arrow array of equal values)."""
        if self.results is not None:
            return self.results(slots)
        return list(map(self.result, slots))


def _identity(slot: Any) -> Any:
    return slot


# -- counts, sums, extremes --------------------------------------------------------
def _count_add(slot, value, ts):
    return slot + 1


def _count_col_add(slot, value, ts):
    return slot if value is None else slot + 1


#: Adds decimals exactly: no sum of 2**63 values of decimal(38) has 100 digits.
_EXACT = Context(prec=100)


def _add_numbers(a: Any, b: Any) -> Any:
    # a decimal sum is kept as its text: msgpack stores no Decimal
    if isinstance(a, (str, Decimal)) or isinstance(b, (str, Decimal)):
        return str(_EXACT.add(Decimal(a), Decimal(b)))
    return a + b


def _sum_add(slot, value, ts):
    if value is None:
        return slot
    if slot is None:
        return str(value) if type(value) is Decimal else value
    if type(slot) is str or type(value) is Decimal:
        return str(_EXACT.add(Decimal(slot), value))
    return slot + value


def _sum_merge(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return _add_numbers(a, b)


def _sum_result(slot):
    return Decimal(slot) if isinstance(slot, str) else slot


def _min_add(slot, value, ts):
    return value if slot is None or (value is not None and value < slot) else slot


def _max_add(slot, value, ts):
    return value if slot is None or (value is not None and value > slot) else slot


def _min_merge(a, b):
    return _min_add(a, b, 0) if b is not None else a


def _max_merge(a, b):
    return _max_add(a, b, 0) if b is not None else a


# -- first, last -------------------------------------------------------------------
def _first_add(slot, value, ts):
    return [ts, value] if slot is None or ts < slot[0] else slot


def _last_add(slot, value, ts):
    return [ts, value] if slot is None or ts >= slot[0] else slot


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


# -- lists and sets ----------------------------------------------------------------
def _collect_add(slot, value, ts):
    slot.append(value)
    return slot


def _collect_list_add(slot, value, ts):
    if value is not None:
        slot.append(value)
    return slot


def _set_add(slot, value, ts):
    if value is not None and value not in slot:
        slot.append(value)
    return slot


def _set_merge(a, b):
    try:
        seen = set(a)
    except TypeError:  # unhashable values (arrays): compare as lists
        seen = a
    return a + [v for v in b if v not in seen]


# -- avg and moments ---------------------------------------------------------------
def _avg_add(slot, value, ts):
    if value is None:
        return slot
    return [slot[0] + 1, slot[1] + float(value)]


def _avg_merge(a, b):
    return [a[0] + b[0], a[1] + b[1]]


def _avg_result(slot):
    return None if slot[0] == 0 else slot[1] / slot[0]


def _numbers(slots: list, width: int) -> np.ndarray:
    """Slots that are lists of ``width`` numbers as a ``(len, width)`` float array
    (their counts are exact as doubles below 2**53 values)."""
    flat = np.fromiter(chain.from_iterable(slots), np.float64, count=len(slots) * width)
    return flat.reshape(len(slots), width)


def _avg_results(slots: list) -> pa.Array:
    # the same IEEE division as _avg_result's, for all slots at once
    a = _numbers(slots, 2)
    n, total = a[:, 0], a[:, 1]
    return pa.array(np.divide(total, n, out=np.zeros(len(n)), where=n > 0), mask=n == 0)


def _moments_add(slot, value, ts):
    if value is None:
        return slot
    n, mean, m2 = slot
    n += 1
    x = float(value)
    delta = x - mean
    mean += delta / n
    return [n, mean, m2 + delta * (x - mean)]


def _moments_merge(a, b):
    na, nb = a[0], b[0]
    if nb == 0:
        return a
    if na == 0:
        return b
    n = na + nb
    delta = b[1] - a[1]
    return [n, a[1] + delta * nb / n, a[2] + b[2] + delta * delta * na * nb / n]


def _sqrt(v: float | None) -> float | None:
    if v is None or v != v:
        return v
    return math.sqrt(max(v, 0.0))


# Spark's results (spark.sql.legacy.statisticalAggregate=false): null for no value,
# and for one value the sample statistics are null too
def _var_pop(slot):
    return None if slot[0] == 0 else slot[2] / slot[0]


def _var_samp(slot):
    return None if slot[0] < 2 else slot[2] / (slot[0] - 1)


_MOMENT_RESULTS = {
    "var_pop": _var_pop,
    "var_samp": _var_samp,
    "stddev_pop": lambda slot: _sqrt(_var_pop(slot)),
    "stddev_samp": lambda slot: _sqrt(_var_samp(slot)),
}


def _moment_results(fn: str) -> Callable[[list], pa.Array]:
    """``fn``'s results over many slots, equal to its ``_MOMENT_RESULTS`` entry's."""
    pop, root = fn.endswith("_pop"), fn.startswith("stddev")
    least = 1 if pop else 2

    def results(slots: list) -> pa.Array:
        a = _numbers(slots, 3)
        n, m2 = a[:, 0], a[:, 2]
        with np.errstate(invalid="ignore"):  # NaN moments give NaN, as one by one
            var = np.divide(m2, n if pop else n - 1, out=np.zeros(len(n)), where=n >= least)
            if root:
                var = np.sqrt(np.maximum(var, 0.0))
        return pa.array(var, mask=n < least)

    return results


# -- min_by, max_by ----------------------------------------------------------------
# A slot is [order, value, time]: a tie on the order goes to the earlier time, and
# on the same time to the value seen first (the older session's in a merge), so
# the result does not depend on the order records arrive in. A decimal order or
# value is kept as its text; orders then compare as decimals.
def _by_slot(better: Callable[[Any, Any], bool], order_decimal: bool, value_decimal: bool) -> Slot:
    def add(slot, pair, ts):
        value, order = pair
        if order is None:
            return slot
        if order_decimal:
            order = Decimal(order)  # a Decimal, or the text of a merged slot
        if slot is not None:
            held = Decimal(slot[0]) if order_decimal else slot[0]
            if not (better(order, held) or (order == held and ts < slot[2])):
                return slot
        if order_decimal:
            order = str(order)
        if value_decimal and value is not None:
            value = str(value)
        return [order, value, ts]

    def merge(a, b):
        return a if b is None else add(a, (b[1], b[0]), b[2])

    def result(slot):
        if slot is None or slot[1] is None:
            return None
        return Decimal(slot[1]) if value_decimal else slot[1]

    return Slot(_none, add, merge, result)


def _zero() -> int:
    return 0


def _none() -> None:
    return None


_FIXED: dict[str, Slot] = {
    "count": Slot(_zero, _count_add, lambda a, b: a + b, _identity, results=_identity),
    "sum": Slot(_none, _sum_add, _sum_merge, _sum_result),
    "min": Slot(_none, _min_add, _min_merge, _identity),
    "max": Slot(_none, _max_add, _max_merge, _identity),
    "first": Slot(_none, _first_add, _first_merge, _stamped_value),
    "last": Slot(_none, _last_add, _last_merge, _stamped_value),
    "collect": Slot(list, _collect_add, lambda a, b: a + b, _identity),
    "collect_list": Slot(list, _collect_list_add, lambda a, b: a + b, _identity),
    "collect_set": Slot(list, _set_add, _set_merge, _identity),
    "count_distinct": Slot(list, _set_add, _set_merge, len),
    "avg": Slot(lambda: [0, 0.0], _avg_add, _avg_merge, _avg_result, results=_avg_results),
    "min_by": _by_slot(operator.lt, False, False),
    "max_by": _by_slot(operator.gt, False, False),
}
for _fn, _result in _MOMENT_RESULTS.items():
    _FIXED[_fn] = Slot(
        lambda: [0, 0.0, 0.0], _moments_add, _moments_merge, _result, results=_moment_results(_fn)
    )

#: How two slots of each function combine (older, newer): the merge needs no
#: argument of the spec (sketch slots carry their size).
MERGES: dict[str, Callable[[Any, Any], Any]] = {fn: s.merge for fn, s in _FIXED.items()}
MERGES["approx_count_distinct"] = sketches.hll_merge
MERGES["percentile_approx"] = sketches.kll_merge


def bind(spec: AggregateSpec) -> Slot:
    """The slot functions of ``spec``."""
    fn = spec.fn
    if fn == "count" and spec.column is not None:
        return Slot(_zero, _count_col_add, _FIXED["count"].merge, _identity, results=_identity)
    if any(spec.decimals):
        decimal = _decimal_slot(spec)
        if decimal is not None:
            return decimal
    if fn in _FIXED:
        return _FIXED[fn]
    if fn == "approx_count_distinct":
        lg_k = sketches.hll_lg_k(spec.extra[0])
        return Slot(
            lambda: sketches.hll_slot(lg_k),
            lambda slot, value, ts: sketches.hll_add(slot, value),
            sketches.hll_merge,
            sketches.hll_estimate,
            sketches.group_slots(lg_k, sketches.hll_extend),
            sketches.hll_estimates,
        )
    pct, accuracy = spec.extra
    k = sketches.kll_k(accuracy)
    ranks = list(pct) if isinstance(pct, (list, tuple)) else [pct]

    def result(slot: list) -> Any:
        values = sketches.kll_quantiles(slot, ranks)
        if values is None:
            return None
        return values if isinstance(pct, (list, tuple)) else values[0]

    return Slot(
        lambda: sketches.kll_slot(k),
        lambda slot, value, ts: sketches.kll_add(slot, value),
        sketches.kll_merge,
        result,
        sketches.group_slots(k, sketches.kll_extend),
    )


# -- exact decimals ----------------------------------------------------------------
_DECIMAL_TYPE = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")
#: Spark's largest decimal precision and scale.
_MAX_DIGITS = 38
#: The scale Spark divides a decimal average at before rounding to its result.
_DIVIDE_SCALE = 39


def decimal_type(name: str | None) -> tuple[int, int] | None:
    """``(precision, scale)`` of a type name ``"decimal(p,s)"``, else None."""
    match = None if name is None else _DECIMAL_TYPE.fullmatch(name.strip().lower())
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def decimal_result_type(fn: str, precision: int, scale: int) -> tuple[int, int]:
    """Spark's result type of ``fn`` over a ``decimal(precision, scale)`` column
    (sum and avg widen it; the functions returning the column's values keep it)."""
    if fn == "sum":
        return min(_MAX_DIGITS, precision + 10), scale
    if fn == "avg":
        return min(_MAX_DIGITS, precision + 4), min(_MAX_DIGITS, scale + 4)
    return precision, scale


def _text(value: Any) -> Any:
    return None if value is None else str(value)


def _round_half_up(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` (denominator > 0) rounded half away from zero,
    as Java's ``RoundingMode.HALF_UP``."""
    q, r = divmod(abs(numerator), denominator)
    if 2 * r >= denominator:
        q += 1
    return q if numerator >= 0 else -q


def _fits(unscaled: int, spec: AggregateSpec, precision: int, scale: int) -> bool:
    """Whether ``unscaled`` has at most ``precision`` digits; if not, an
    ``ArithmeticError`` (overflow "error") or False (overflow "null")."""
    if abs(unscaled) < 10**precision:
        return True
    if spec.overflow == "null":
        return False
    value = Decimal(f"{unscaled}E-{scale}")
    raise ArithmeticError(
        f"aggregation {spec.name!r} = ({spec.fn!r}, {spec.column!r}): {value} cannot be "
        f"represented as decimal({precision},{scale}), its result type, as in Spark; set "
        "spark.sql.ansi.enabled=false to get null instead"
    )


def _decimal_sum_result(spec: AggregateSpec, precision: int, scale: int) -> Callable:
    def result(slot):
        if slot is None:
            return None
        total = Decimal(slot)
        return total if _fits(int(total.scaleb(scale, _EXACT)), spec, precision, scale) else None

    return result


def _decimal_avg(spec: AggregateSpec, precision: int, scale: int) -> Slot:
    """``avg`` over ``decimal(precision, scale)``: slot ``[n, exact sum's text]``;
    the result is Spark's: the sum (null past ``decimal(min(38, p+10), s)``) divided
    by n at scale 39 half up, then rounded half up to ``decimal(min(38, p+4),
    min(38, s+4))``."""
    sum_digits = decimal_result_type("sum", precision, scale)[0]
    out_precision, out_scale = decimal_result_type("avg", precision, scale)

    def add(slot, value, ts):
        if value is None:
            return slot
        return [slot[0] + 1, str(_EXACT.add(Decimal(slot[1]), value))]

    def merge(a, b):
        return [a[0] + b[0], str(_EXACT.add(Decimal(a[1]), Decimal(b[1])))]

    def result(slot):
        n = slot[0]
        if n == 0:
            return None
        unscaled_sum = int(Decimal(slot[1]).scaleb(scale, _EXACT))
        if not _fits(unscaled_sum, spec, sum_digits, scale):
            return None
        at_39 = _round_half_up(unscaled_sum * 10 ** (_DIVIDE_SCALE - scale), n)
        unscaled = _round_half_up(at_39, 10 ** (_DIVIDE_SCALE - out_scale))
        if not _fits(unscaled, spec, out_precision, out_scale):
            return None
        return Decimal(f"{unscaled}E-{out_scale}")

    return Slot(lambda: [0, "0"], add, merge, result)


def _decimal_min_max(better: Callable[[Any, Any], bool]) -> Slot:
    def add(slot, value, ts):
        if value is None:
            return slot
        if slot is None or better(Decimal(value), Decimal(slot)):
            return str(value)
        return slot

    def merge(a, b):
        return a if b is None else add(a, b, 0)

    return Slot(_none, add, merge, _to_decimal)


def _to_decimal(text: Any) -> Any:
    return None if text is None else Decimal(text)


def _texts_added(slot: Slot, result: Callable[[Any], Any]) -> Slot:
    """``slot`` fed each decimal as its text, its result turned by ``result``."""
    add = slot.add
    return Slot(slot.init, lambda acc, value, ts: add(acc, _text(value), ts), slot.merge, result)


def _decimals(texts: list) -> list:
    return [_to_decimal(t) for t in texts]


def _stamped_decimal(slot):
    return None if slot is None else _to_decimal(slot[1])


def _decimal_slot(spec: AggregateSpec) -> Slot | None:
    """The slot of ``spec`` over a decimal column, or None where the plain slot
    takes decimals as they are (counts, moments)."""
    fn = spec.fn
    value_type = spec.decimals[0] if spec.decimals else None
    if fn in ("min_by", "max_by"):
        order_type = spec.decimals[1] if len(spec.decimals) > 1 else None
        better = operator.lt if fn == "min_by" else operator.gt
        return _by_slot(better, order_type is not None, value_type is not None)
    if value_type is None:
        return None
    precision, scale = value_type
    if fn == "sum":
        out = decimal_result_type("sum", precision, scale)
        return Slot(_none, _sum_add, _sum_merge, _decimal_sum_result(spec, *out))
    if fn == "avg":
        return _decimal_avg(spec, precision, scale)
    if fn in ("min", "max"):
        return _decimal_min_max(operator.lt if fn == "min" else operator.gt)
    if fn in ("first", "last"):
        return _texts_added(_FIXED[fn], _stamped_decimal)
    if fn in ("collect", "collect_list", "collect_set"):
        return _texts_added(_FIXED[fn], _decimals)
    if fn == "count_distinct":
        return _texts_added(_FIXED[fn], len)
    if fn == "approx_count_distinct":
        plain = bind(AggregateSpec(spec.name, fn, spec.column, spec.extra))
        return _texts_added(plain, plain.result)
    if fn == "percentile_approx":
        plain = bind(AggregateSpec(spec.name, fn, spec.column, spec.extra))
        exponent = Decimal(1).scaleb(-scale)

        def as_decimal(v: float) -> Decimal:
            return Decimal(repr(v)).quantize(exponent, context=_EXACT)

        def result(slot):
            got = plain.result(slot)
            if got is None:
                return None
            return [as_decimal(v) for v in got] if isinstance(got, list) else as_decimal(got)

        # the sketch holds doubles (Spark's holds doubles too)
        return Slot(
            plain.init, lambda acc, v, ts: plain.add(acc, _float(v), ts), plain.merge, result
        )
    return None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
