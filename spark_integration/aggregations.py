"""Aggregation specs of the Spark aggregate operators (``sessionize``,
``window_aggregate``): what users write, the engine-agnostic
:class:`~sessionstore.operators.Aggregation` it becomes, the Spark types of its
output columns, the input columns an aggregate task needs, and the planning of an
aggregate operator's run (:meth:`AggregateInput.state_map`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessionstore.operators import Aggregation, Aggregations
from spark_integration.backend import StateBackend
from spark_integration.output import OperatorOutput
from spark_integration.placement import state_map
from spark_integration.planning import (
    TS,
    checked_fields,
    key_types,
    operator_coordinator,
    resolve,
    time_column,
)
from spark_integration.runtime import AggregatorTask

__all__ = ["SessionAggregation", "AggregateInput", "aggregate_input", "parse_aggregations"]

_BUILTIN = {"count", "sum", "min", "max", "first", "last", "collect"}


@dataclass(frozen=True)
class SessionAggregation:
    """A custom aggregation producing one output column of Spark type ``output_type``
    (a DDL string such as ``"bigint"`` or a DataType). ``value`` is a dict of the
    input's non-key, non-timestamp columns."""

    initializer: Callable[[], Any]
    aggregator: Callable[[Any, Any, Any], Any]
    merger: Callable[[Any, Any, Any], Any]
    output_type: Any
    finish: Callable[[Any], Any] | None = None


def parse_aggregations(aggregations: Mapping[str, Any], columns: Sequence[str]):
    """``(Aggregation, value columns, [(output name, function, input column)])``."""
    if not isinstance(aggregations, Mapping) or not aggregations:
        raise ValueError(f"aggregations must be a non-empty dict, got {aggregations!r}")
    custom = {k: v for k, v in aggregations.items() if isinstance(v, SessionAggregation)}
    if custom:
        if len(aggregations) != 1:
            raise ValueError(
                "a SessionAggregation must be the only aggregation (it produces one column); "
                f"got {sorted(aggregations)}"
            )
        ((out_name, agg),) = custom.items()
        finish = agg.finish or (lambda acc: acc)
        aggregation = Aggregation(
            agg.initializer, agg.aggregator, agg.merger, lambda acc: {out_name: finish(acc)}
        )
        return aggregation, list(columns), [(out_name, "custom", None)]
    plan, spec, needed = [], {}, []
    for out_name, how in aggregations.items():
        if how == "count":
            fn, column = "count", None
        elif isinstance(how, (tuple, list)) and len(how) == 2 and how[0] in _BUILTIN - {"count"}:
            fn, column = how
            if column not in columns:
                raise ValueError(
                    f"aggregation {out_name!r} reads column {column!r}, which the input does not "
                    f"have (it has {sorted(columns)})"
                )
            if column not in needed:
                needed.append(column)
        else:
            raise ValueError(
                f"aggregation {out_name!r}: expected 'count', (function, column) with function in "
                f"{sorted(_BUILTIN - {'count'})}, or a SessionAggregation; got {how!r}"
            )
        spec[out_name] = "count" if fn == "count" else (fn, column)
        plan.append((out_name, fn, column))
    return Aggregations(spec), needed, plan


def value_type(fn: str, column: str | None, fields: dict[str, Any], aggregations: Any) -> Any:
    """The Spark type of an aggregate's output column."""
    from pyspark.sql import types as T

    if fn == "count":
        return T.LongType()
    if fn == "custom":
        dtype = next(iter(aggregations.values())).output_type
        return T._parse_datatype_string(dtype) if isinstance(dtype, str) else dtype
    source = fields[column].dataType
    if fn == "sum":
        return T.LongType() if isinstance(source, T.IntegralType) else T.DoubleType()
    if fn == "collect":
        return T.ArrayType(source)
    return source


@dataclass
class AggregateInput:
    """What ``sessionize`` and ``window_aggregate`` derive alike from their input."""

    keys: list[str]
    #: the input reduced to key columns, event time in ms as ``TS``, and value columns
    selected: Any
    #: the key fields, then the start and end time fields, then one per aggregate
    out_fields: list[Any]
    aggregation: Aggregation
    value_cols: list[str]
    plan: list[tuple[str, str, str | None]]
    time_is_timestamp: bool
    #: the names of the start and end time columns
    start: str
    end: str

    def output(self, schema: Any) -> OperatorOutput:
        """What tasks need to build output rows of the Spark ``schema`` (which
        extends :attr:`out_fields`)."""
        return OperatorOutput(
            schema.json(), self.keys, self.plan, self.time_is_timestamp, self.start, self.end
        )

    def state_map(
        self,
        df: Any,
        task_class: type[AggregatorTask],
        out_schema: Any,
        backend: StateBackend | None,
        num_partitions: int | None,
        name: str,
        **settings: Any,
    ) -> Any:
        """The operator ``name`` over this input of ``df``, output rows of the Spark
        ``out_schema``: its backend and partition count resolved, its coordinator
        started, and tasks of ``task_class`` (the operator's own ``settings`` added to
        the common fields) run by :func:`~spark_integration.placement.state_map`."""
        backend, n = resolve(df, backend, num_partitions, name)
        task = task_class(
            backend=backend,
            name=name,
            num_partitions=n,
            value_cols=self.value_cols,
            aggregation=self.aggregation,
            output=self.output(out_schema),
            key_types=key_types(self.selected, self.keys),
            coordinator=operator_coordinator(df, backend, name, n),
            **settings,
        )
        return state_map(self.selected, self.keys, n, task, out_schema, name)


def aggregate_input(
    df: Any,
    key: str | Sequence[str],
    timestamp: str,
    aggregations: Mapping[str, Any] | None,
    start: str,
    end: str,
) -> AggregateInput:
    """Check the input, parse ``aggregations`` (default: a count) and build the
    common part of the output schema (time columns named ``start`` and ``end``)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    keys = [key] if isinstance(key, str) else list(key)
    if not keys:
        raise ValueError("key must name at least one column")
    fields = checked_fields(df, [*keys, timestamp])
    ts_col, time_type = time_column(fields, timestamp)
    others = [c for c in fields if c not in keys and c != timestamp]
    aggregations = aggregations or {"count": "count"}
    aggregation, value_cols, plan = parse_aggregations(aggregations, others)
    out_fields = [fields[k] for k in keys]
    out_fields += [T.StructField(start, time_type), T.StructField(end, time_type)]
    out_fields += [
        T.StructField(out_name, value_type(fn, column, fields, aggregations))
        for out_name, fn, column in plan
    ]
    selected = df.select(
        *[F.col(k) for k in keys], ts_col.alias(TS), *[F.col(c) for c in value_cols]
    )
    return AggregateInput(
        keys, selected, out_fields, aggregation, value_cols, plan,
        isinstance(time_type, T.TimestampType), start, end,
    )  # fmt: skip
