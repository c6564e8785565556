"""The planning of a two-input join (``window_join``, ``temporal_join``) on the
driver, once its inputs are checked: the inputs tagged and unioned into one
(:func:`~spark_integration.planning.input_columns.tagged_union`), the operator's
conf snapshot taken (:mod:`spark_integration.planning.operator_conf`: backend and
partition count resolved, the coordinator started), the task built, the due source
unioned in, and the one shuffle and per-partition run placed
(:func:`~spark_integration.planning.placement.state_map`). The task's side is
:class:`~spark_integration.execution.join_task.JoinTask`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spark_integration.conf.backend import StateBackend
from spark_integration.coordinator.protocol import CoordinatorAddress
from spark_integration.execution.join_task import JoinTask
from spark_integration.planning.due_batches import with_due_batches
from spark_integration.planning.input_columns import key_types, tagged_union
from spark_integration.planning.operator_conf import operator_conf
from spark_integration.planning.placement import state_map

__all__ = ["join_state_map", "join_task"]


def join_state_map(
    sides: Sequence[tuple[Any, Any, list[str], str]],
    keys: list[str],
    task_class: type[JoinTask],
    out_schema: Any,
    backend: StateBackend | None,
    num_partitions: int | None,
    name: str,
    **settings: Any,
) -> Any:
    """The join ``name`` of ``sides`` (``(DataFrame, millisecond time column, its
    columns, tag)`` each, in side-number order; the first's session plans it) by
    ``keys``, output rows of the Spark ``out_schema``, run by tasks of
    ``task_class`` (the operator's own ``settings`` added to the common fields)."""
    conf = operator_conf(sides[0][0], backend, num_partitions, name)
    combined, task = join_task(
        sides, keys, task_class, out_schema, conf.backend, conf.partitions, name,
        conf.coordinator, key_groups=conf.key_groups, **settings,
    )  # fmt: skip
    n = conf.partitions
    combined = with_due_batches(combined, conf.backend, name, n, allowed=conf.due_batches)
    return state_map(combined, keys, n, task, out_schema, name, conf)


def join_task(
    sides: Sequence[tuple[Any, Any, list[str], str]],
    keys: list[str],
    task_class: type[JoinTask],
    out_schema: Any,
    backend: StateBackend,
    num_partitions: int,
    name: str,
    coordinator: CoordinatorAddress | None = None,
    key_groups: int | None = None,
    **settings: Any,
) -> tuple[Any, JoinTask]:
    """``(the tagged union of sides, the task each state partition runs)`` for the
    join ``name`` at a resolved backend and partition count (what
    :func:`join_state_map` runs, and a bootstrap runs over a history)."""
    combined = tagged_union(keys, list(sides))
    task = task_class(
        backend=backend,
        name=name,
        num_partitions=num_partitions,
        keys=keys,
        tags=[tag for *_, tag in sides],
        out_schema_json=out_schema.json(),
        key_types=key_types(combined, keys),
        coordinator=coordinator,  # event time, metrics to the driver
        key_groups=key_groups,
        **settings,
    )
    return combined, task
