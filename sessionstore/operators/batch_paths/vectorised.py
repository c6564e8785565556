"""What the vectorised batch paths of sessions and windows share.

The numpy paths (:mod:`~sessionstore.operators.sessions.vectorised_keys` and the columnar
paths of :mod:`~sessionstore.operators.sessions.columns` and
:mod:`~sessionstore.operators.windows.columns`) compute only built-in aggregates
whose result cannot depend on the order numpy adds them in: count, sum, min, max,
first and last over exact ints (never collect, never floats). The columnar paths
add ``avg``, ``count(c)``, the moments and ``min_by``/``max_by`` over numeric
columns with nulls; their double results may differ from the record path's in the
last bits (numpy adds in another order). This module names
those functions, the int bounds that keep int64 arithmetic exact, how two of
their slots combine, and the time the paths give a dropped row.
"""

from __future__ import annotations

from typing import Any

from sessionstore.operators.aggregate_functions import FOLDED, MERGES, MOMENTS

__all__ = ["VECTORISED_FUNCTIONS", "INT_LIMIT", "SUM_LIMIT", "FAR_PAST"]
__all__ += ["COLUMNAR_FUNCTIONS", "built_in_functions", "columnar_functions", "merge_slot"]

#: The built-in functions the vectorised paths compute.
VECTORISED_FUNCTIONS = frozenset({"count", "sum", "min", "max", "first", "last"})
#: What the columnar paths compute besides: over numeric columns, nulls allowed
#: (``count`` of a column counts its non-null values there).
COLUMNAR_FUNCTIONS = VECTORISED_FUNCTIONS | MOMENTS | {"avg", "min_by", "max_by"}
#: ... and, folding each group's values in order with the record path's own slot
#: functions (a Python step per value, no replay), lists, sets and sketches.
COLUMNAR_FUNCTIONS |= FOLDED
INT_LIMIT = 2**53  # ints that numpy holds exactly
SUM_LIMIT = 2**62  # a bound on |sum| that keeps int64 arithmetic exact
#: The batch paths' time of a dropped row: below any real time, far from overflow.
FAR_PAST = -(2**62)


def built_in_functions(aggregation: Any) -> list[str] | None:
    """The aggregation's functions when all are built-in count(*), sum, min, max,
    first or last (what every vectorised path computes), else None."""
    functions = columnar_functions(aggregation)
    if functions is None or not set(functions) <= VECTORISED_FUNCTIONS:
        return None
    if any(
        fn == "count" and c is not None
        for fn, c in zip(functions, aggregation.columns, strict=True)
    ):
        return None  # count(c) counts non-null values: the columnar paths only
    return functions


def columnar_functions(aggregation: Any) -> list[str] | None:
    """The aggregation's functions when the columnar paths compute all of them
    (:data:`COLUMNAR_FUNCTIONS`), else None."""
    functions = getattr(aggregation, "functions", None)
    if functions is None or not set(functions) <= COLUMNAR_FUNCTIONS:
        return None
    if getattr(aggregation, "decimals", False):
        return None  # exact decimals: only the record path's slots compare their text
    return functions


def merge_slot(fn: str, older: Any, newer: Any) -> Any:
    """Slot ``fn`` of an older session (or window value) combined with a newer one's,
    as the record path merges them: the older keeps ``first`` on a tie, the newer
    takes ``last``."""
    return MERGES[fn](older, newer)
