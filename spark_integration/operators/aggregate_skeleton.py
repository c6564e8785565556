"""The planning of an aggregate operator (``sessionize``, ``window_aggregate``) on
the driver, in the order it runs: check the input and derive what both operators
need from it (:func:`aggregate_input`: key and time columns, the parsed
aggregations, the output fields), then plan the run
(:meth:`AggregateInput.state_map`: the operator's conf snapshot taken, its
backend and partition count resolved, the coordinator started, the task built and
placed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessionstore.operators import Aggregation
from spark_integration.conf.backend import StateBackend
from spark_integration.conf.names import TS
from spark_integration.execution.aggregator_task import AggregatorTask
from spark_integration.execution.output import OperatorOutput
from spark_integration.planning.aggregation_specs import parse_aggregations, value_type
from spark_integration.planning.due_batches import with_due_batches
from spark_integration.planning.input_columns import checked_fields, key_types, time_column
from spark_integration.planning.operator_conf import operator_conf
from spark_integration.planning.placement import state_map

__all__ = ["AggregateInput", "aggregate_input"]


def _time_as_number(column: str, dtype: Any) -> Any:
    """The value column as the operators read it: a timestamp as epoch microseconds
    and a date as epoch days (numbers that order, and that msgpack stores), else
    itself. Outputs turn them back (Arrow casts the numbers to the Spark type)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.TimestampType):
        return F.unix_micros(F.col(column)).alias(column)
    if isinstance(dtype, T.DateType):
        return F.unix_date(F.col(column)).alias(column)
    return F.col(column)


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
    #: a batch (bounded) input: every session and window is emitted at its end
    bounded: bool = False

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
        the common fields) run by :func:`~spark_integration.planning.placement.state_map`."""
        conf = operator_conf(df, backend, num_partitions, name)
        n = conf.partitions
        task = self.task(
            task_class, out_schema, conf.backend, n, name, conf.coordinator,
            key_groups=conf.key_groups, **settings,
        )  # fmt: skip
        selected = with_due_batches(self.selected, conf.backend, name, n, allowed=conf.due_batches)
        return state_map(selected, self.keys, n, task, out_schema, name, conf)

    def task(
        self,
        task_class: type[AggregatorTask],
        out_schema: Any,
        backend: StateBackend,
        num_partitions: int,
        name: str,
        coordinator: Any = None,
        key_groups: int | None = None,
        **settings: Any,
    ) -> AggregatorTask:
        """The task of operator ``name`` that each state partition runs (what
        :meth:`state_map` runs, and a bootstrap runs over a history)."""
        return task_class(
            backend=backend,
            name=name,
            num_partitions=num_partitions,
            value_cols=self.value_cols,
            aggregation=self.aggregation,
            output=self.output(out_schema),
            key_types=key_types(self.selected, self.keys),
            coordinator=coordinator,
            bounded=self.bounded,
            key_groups=key_groups,
            **settings,
        )


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
    fields = checked_fields(df, [timestamp], keys=keys)
    ts_col, time_type = time_column(fields, timestamp)
    others = [c for c in fields if c not in keys and c != timestamp]
    aggregations = aggregations or {"count": "count"}
    ansi = str(df.sparkSession.conf.get("spark.sql.ansi.enabled", "true")).lower() == "true"
    as_timestamp = "timestamp" if isinstance(time_type, T.TimestampType) else None
    aggregation, value_cols, plan = parse_aggregations(
        aggregations, others, fields, "error" if ansi else "null", as_timestamp
    )
    out_fields = [fields[k] for k in keys]
    out_fields += [T.StructField(start, time_type), T.StructField(end, time_type)]
    for out_name, fn, column in plan:
        how = aggregations[out_name]
        dtype = value_type(fn, column, fields, how)
        if fn == "percentile_approx" and isinstance(how[2], (list, tuple)):
            dtype = T.ArrayType(dtype)
        out_fields.append(T.StructField(out_name, dtype))
    # a custom aggregate sees its columns as Spark gives them; built-ins read times
    # as numbers
    as_numbers = not any(fn == "custom" for _, fn, _ in plan)
    selected = df.select(
        *[F.col(k) for k in keys],
        ts_col.alias(TS),
        *[_time_as_number(c, fields[c].dataType) if as_numbers else F.col(c) for c in value_cols],
    )
    return AggregateInput(
        keys, selected, out_fields, aggregation, value_cols, plan,
        isinstance(time_type, T.TimestampType), start, end, not df.isStreaming,
    )  # fmt: skip
