"""Aggregation specs of the Spark aggregate operators (``sessionize``,
``window_aggregate``): what users write, the engine-agnostic
:class:`~sessionstore.operators.Aggregation` it becomes, the Spark types of its
output columns and the input columns an aggregate task needs. The planning of an
aggregate operator's run is :mod:`spark_integration.operators.aggregate_skeleton`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessionstore.operators import Aggregation, Aggregations
from sessionstore.operators.aggregate_functions import MOMENTS, decimal_result_type, parse_spec

__all__ = ["SessionAggregation", "parse_aggregations", "value_type"]

#: Functions whose input must be numeric (Spark casts strings; say so instead).
_NUMERIC = {"sum", "avg", "percentile_approx"} | MOMENTS


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
    aggregations: Mapping[str, Any],
    columns: Sequence[str],
    fields: Mapping[str, Any] | None = None,
    overflow: str = "error",
    time_type: str | None = None,
):
    """``(Aggregation, value columns, [(output name, function, input column)])``.

    Every bad spec fails here, on the driver, with one message naming the
    aggregate: an unknown function, a wrong arity, an argument out of range, a
    column the input lacks (``columns``) or, given the input's ``fields``, of a
    type the function does not take. Given ``fields``, the built-ins are bound to
    the types of the columns they read (:func:`value_types`); ``overflow`` is what a
    decimal sum or average past its type gives ("error" under Spark's ANSI mode,
    else "null"); ``time_type`` "timestamp" when the output's time columns are
    timestamps (recorded for readers)."""
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
    raw = any(fn == "custom" for _, fn, _ in plan)
    if raw:
        needed = list(columns)  # a custom aggregate sees every value column
    types = {} if fields is None else value_types(fields, needed, raw)
    return Aggregations(spec, types, overflow, time_type), needed, plan


def value_types(fields: Mapping[str, Any], columns: Sequence[str], raw: bool) -> dict[str, str]:
    """The types of ``columns`` the built-in aggregates must know (see
    :class:`~sessionstore.operators.Aggregations`): decimals, and, when the
    columns reach the operator as Spark gives them (``raw``: a custom aggregate
    sees them), timestamps and dates, which the built-ins then read as numbers.
    Without a custom aggregate the query itself turns those into numbers
    (:func:`_time_as_number`)."""
    from pyspark.sql import types as T

    out = {}
    for c in columns:
        dtype = fields[c].dataType
        if isinstance(dtype, T.DecimalType):
            out[c] = dtype.simpleString()
        elif raw and isinstance(dtype, T.TimestampType):
            out[c] = "timestamp"
        elif raw and isinstance(dtype, T.DateType):
            out[c] = "date"
    return out


def _check_type(out_name: str, how: Any, fn: str, column: str, dtype: Any) -> None:
    from pyspark.sql import types as T

    if fn in _NUMERIC and not isinstance(dtype, T.NumericType):
        raise ValueError(
            f"aggregation {out_name!r} = {how!r}: {fn} needs a numeric column, and "
            f"{column!r} is {dtype.simpleString()}"
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
    source = fields[column].dataType
    if fn in ("sum", "avg") and isinstance(source, T.DecimalType):
        return T.DecimalType(*decimal_result_type(fn, source.precision, source.scale))
    if fn == "avg" or fn in MOMENTS:
        return T.DoubleType()
    if fn == "sum":
        return T.LongType() if isinstance(source, T.IntegralType) else T.DoubleType()
    if fn in ("collect", "collect_list", "collect_set"):
        return T.ArrayType(source)
    return source  # min, max, first, last, min_by, max_by, percentile_approx (one p)
