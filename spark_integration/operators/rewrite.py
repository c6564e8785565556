"""``rewrite_state``: :func:`sessionstore.rewrite` as a Spark job, one task per
partition, for checkpoints larger than one machine.

Two passes over the partitions, both through DataFrames (``mapInArrow`` over
``spark.range``), so that a Spark Connect session runs them as a classic one
does: the first calls ``fn`` on every row and checks what it returns, writing
nothing; only when every partition passed does the second build and stage each
partition (change.py's step 2, in its task). The driver then commits and applies
the change as the Python form does. ``fn`` therefore runs twice per row and must
give the same result both times (a pure function of the row).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from sessionstore.checkpoint.offline.change import (
    DEFAULT_QUIET_S,
    ChangeError,
    abandon_change,
    begin_change,
    commit_change,
    partition_answers,
    stage_partition,
)
from sessionstore.tools.rewrite import RewritePlan, plan_rewrite

__all__ = ["rewrite_state"]

_SCHEMA = "partition long, commit string, counts string, error string"


def _tasks(plan: RewritePlan, change_id: str | None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of a pass: check (``change_id`` None) or stage."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            out = []
            for partition in batch.column(0).to_pylist():
                commit, counts, error = None, None, None
                try:
                    if change_id is None:
                        counts = plan.check_partition(partition)
                    else:
                        rewriter = plan.rewriter()
                        commit = stage_partition(plan.target, partition, rewriter.change,
                                                 change_id, rewriter.prepare)  # fmt: skip
                        counts = rewriter.counts
                except ChangeError as exc:  # the driver raises it, by its own words
                    error = str(exc)
                out.append({"partition": partition, "commit": commit, "error": error,
                            "counts": None if counts is None else json.dumps(counts)})  # fmt: skip
            yield pa.RecordBatch.from_pylist(out, schema=_arrow_schema())

    return run


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("partition", pa.int64()), ("commit", pa.string()),
                      ("counts", pa.string()), ("error", pa.string())])  # fmt: skip


def _pass(spark: Any, plan: RewritePlan, change_id: str | None) -> list[dict[str, Any]]:
    """One task per partition; the rows in partition order, the first error raised."""
    n = plan.target.partitions
    ids = spark.range(0, n, 1, n)
    rows = ids.mapInArrow(_tasks(plan, change_id), _SCHEMA).collect()
    return partition_answers((r.asDict() for r in rows), n)


def rewrite_state(
    spark: Any,
    checkpoint: str,
    operator: str,
    fn: Callable[[dict[str, Any]], dict[str, Any] | None],
    store: str | None = None,
    raw: bool = False,
    storage_options: dict[str, Any] | None = None,
    force: bool = False,
    quiet_s: float = DEFAULT_QUIET_S,
    allow_pickle: bool = False,
) -> dict[str, Any]:
    """:func:`sessionstore.rewrite` on the executors of ``spark`` (a classic or a
    Spark Connect session), one task per partition: the same arguments, checks
    and result. ``fn`` is shipped to the executors (it must pickle, as a UDF does)
    and runs twice per row, a check pass before anything is written and the
    writing pass: it must be deterministic."""
    plan = plan_rewrite(checkpoint, operator, fn, store, raw, storage_options, force,
                        quiet_s, allow_pickle)  # fmt: skip
    if plan.finished is not None:
        return plan.finished
    _pass(spark, plan, None)
    change_id = begin_change(plan.target)
    try:
        staged = _pass(spark, plan, change_id)
    except BaseException:
        abandon_change(plan.target, change_id)
        raise
    counts = {"rows": 0, "changed": 0, "deleted": 0}
    for row in staged:
        for name, n in json.loads(row["counts"]).items():
            counts[name] += n
    record = commit_change(plan.target, change_id, [r["commit"] for r in staged],
                           plan.audit | {"counts": counts})  # fmt: skip
    return plan.result(record["version"], counts)
