"""Aggregation specs of the Spark aggregate operators (``sessionize``,
``window_aggregate``): what users write, the engine-agnostic
:class:`~sessionstore.operators.Aggregation` it becomes, the Spark types of its
output columns and the input columns an aggregate task needs. The planning of an
aggregate operator's run is :mod:`spark_integration.planning.aggregate_operator`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessionstore.operators import Aggregation, Aggregations
from sessionstore.operators.aggregate_functions import MOMENTS, parse_spec

__all__ = ["SessionAggregation", "parse_aggregations", "value_type"]

#: Functions whose input must be numeric (Spark casts strings; say so instead).
_NUMERIC = {"sum", "avg", "percentile_approx"} | MOMENTS
#: Functions that keep a decimal's value in their slot (as text or as a double).
_DECIMAL_OK = {"sum", "avg", "percentile_approx", "count", "approx_count_distinct"} | MOMENTS


@dataclass(frozen=True)
class SessionAggregation:
    """A custom aggregation producing one output column of Spark type ``output_type``
    (a DDL string such as ``"bigint"`` or a DataType). ``value`` is a dict of the
    input's non-key, non-timestamp columns. Several may sit beside built-in
    aggregates in one ``aggregations`` dict."""

    initializer: Callable[[], Any]
    aggregator: Callable[[Any, Any, Any], Any]
    merger: Callable[[Any, Any, Any], Any]
    output_type: Any
    finish: Callable[[Any], Any] | None = None

    def as_aggregation(self) -> Aggregation:
        """The engine-agnostic :class:`~sessionstore.operators.Aggregation`."""
        finish = self.finish or (lambda acc: acc)
        return Aggregation(self.initializer, self.aggregator, self.merger, finish)


def parse_aggregations(
    aggregations: Mapping[str, Any], columns: Sequence[str], fields: Mapping[str, Any] | None = None
):
    """``(Aggregation, value columns, [(output name, function, input column)])``.

    Every bad spec fails here, on the driver, with one message naming the
    aggregate: an unknown function, a wrong arity, an argument out of range, a
    column the input lacks (``columns``) or, given the input's ``fields``, of a
    type the function does not take."""
    if not isinstance(aggregations, Mapping) or not aggregations:
        raise ValueError(f"aggregations must be a non-empty dict, got {aggregations!r}")
    if len(aggregations) == 1:
        ((out_name, how),) = aggregations.items()
        if isinstance(how, SessionAggregation):
            # alone, its accumulator is the stored value itself, as checkpoints
            # written before custom aggregations could sit beside others hold it
            finish = how.finish or (lambda acc: acc)
            aggregation = Aggregation(
                how.initializer, how.aggregator, how.merger, lambda acc: {out_name: finish(acc)}
            )
            return aggregation, list(columns), [(out_name, "custom", None)]
    spec: dict[str, Any] = {}
    needed: list[str] = []
    plan = []
    for out_name, how in aggregations.items():
        if isinstance(how, SessionAggregation):
            spec[out_name] = how.as_aggregation()
            plan.append((out_name, "custom", None))
            continue
        parsed = parse_spec(out_name, how)
        for column in parsed.columns:
            if column not in columns:
                raise ValueError(
                    f"aggregation {out_name!r} = {how!r} reads column {column!r}, which the "
                    f"input does not have (it has {sorted(columns)})"
                )
            if fields is not None:
                _check_type(out_name, how, parsed.fn, column, fields[column].dataType)
            if column not in needed:
                needed.append(column)
        spec[out_name] = "count" if parsed.fn == "count" and parsed.column is None else how
        plan.append((out_name, parsed.fn, parsed.column))
    if any(fn == "custom" for _, fn, _ in plan):
        needed = list(columns)  # a custom aggregate sees every value column
    return Aggregations(spec), needed, plan


def _check_type(out_name: str, how: Any, fn: str, column: str, dtype: Any) -> None:
    from pyspark.sql import types as T

    why = None
    if fn in _NUMERIC and not isinstance(dtype, T.NumericType):
        why = f"{fn} needs a numeric column"
    elif isinstance(dtype, T.DecimalType) and fn not in _DECIMAL_OK:
        why = f"{fn} does not take decimals here: cast the column to double or string"
    if why is not None:
        raise ValueError(
            f"aggregation {out_name!r} = {how!r}: {why}, and {column!r} is {dtype.simpleString()}"
        )


def value_type(fn: str, column: str | None, fields: dict[str, Any], custom: Any = None) -> Any:
    """The Spark type of an aggregate's output column (Spark's own result types;
    ``custom``: the :class:`SessionAggregation` of a custom one)."""
    from pyspark.sql import types as T

    if fn in ("count", "count_distinct", "approx_count_distinct"):
        return T.LongType()
    if fn == "custom":
        dtype = custom.output_type
        return T._parse_datatype_string(dtype) if isinstance(dtype, str) else dtype
    if fn == "avg" or fn in MOMENTS:
        return T.DoubleType()
    source = fields[column].dataType
    if fn == "sum":
        if isinstance(source, T.IntegralType):
            return T.LongType()
        if isinstance(source, T.DecimalType):
            return T.DecimalType(min(38, source.precision + 10), source.scale)
        return T.DoubleType()
    if fn in ("collect", "collect_list", "collect_set"):
        return T.ArrayType(source)
    return source  # min, max, first, last, min_by, max_by, percentile_approx (one p)
