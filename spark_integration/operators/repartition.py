"""``repartition_state``: rescale an operator's checkpoint as a Spark job, for states
larger than one machine.

The same pieces as ``sessionstore repartition``
(:mod:`sessionstore.checkpoint.offline.repartition`), distributed: one task per source
partition loads version V and emits ``(target partition, family, key, value)``
rows, Spark's shuffle brings each target partition's rows together, and one task
per target partition writes its database and uploads it as the snapshot of
version V. The driver plans (every check, before any task runs) and, once every
snapshot is uploaded, writes the event time and, last, ``_metadata``. A target
database depends only on the set of rows it receives, so the result is the CLI's.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from sessionstore.checkpoint.offline.repartition import (
    RepartitionPlan,
    TargetWriter,
    finish_repartition,
    plan_repartition,
    routed_rows,
    summary,
)
from spark_integration.conf.spark_session import require_classic

__all__ = ["repartition_state"]


def repartition_state(
    spark: Any,
    uri: str,
    operator: str,
    partitions: int,
    to: str,
    version: int | None = None,
    key_types: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    target_storage_options: dict[str, Any] | None = None,
    allow_pickle: bool = False,
) -> dict[str, Any]:
    """Repartition version ``version`` (default: the latest) of ``operator``'s state
    at ``uri`` to ``partitions`` partitions, as a new checkpoint at ``to``, on the
    executors of ``spark``. Arguments and result as
    :func:`~sessionstore.checkpoint.offline.repartition.repartition_checkpoint`;
    :class:`~sessionstore.checkpoint.offline.repartition.RepartitionError` (before any task
    runs) names what is wrong."""
    require_classic(spark, "repartition_state", "run `sessionstore repartition` (the CLI)")
    plan = plan_repartition(
        uri, operator, partitions, to, version, key_types, storage_options,
        target_storage_options, allow_pickle,
    )  # fmt: skip
    sources = spark.sparkContext.parallelize(range(plan.source_partitions), plan.source_partitions)
    rows = sources.mapPartitions(lambda ids: _route(plan, ids))
    # the key is the target partition itself
    by_target = rows.partitionBy(plan.partitions, lambda target: target)
    written = by_target.mapPartitionsWithIndex(lambda t, it: _write(plan, t, it)).collect()
    shared, checkpoint_id = finish_repartition(plan)
    return summary(plan, sum(w["rows"] for w in written), shared, checkpoint_id)


def _route(
    plan: RepartitionPlan, partitions: Iterator[int]
) -> Iterator[tuple[int, tuple[str, bytes, bytes]]]:
    workdir = tempfile.mkdtemp(prefix="sessionstore-repartition-")
    try:
        for partition in partitions:
            for target, family, key, value in routed_rows(plan, partition, workdir):
                yield target, (family, key, value)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _write(
    plan: RepartitionPlan, target: int, rows: Iterator[tuple[int, tuple[str, bytes, bytes]]]
) -> Iterator[dict[str, Any]]:
    workdir = tempfile.mkdtemp(prefix="sessionstore-repartition-")
    writer = TargetWriter(plan, target, workdir)
    try:
        for _, (family, key, value) in rows:
            writer.add(family, key, value)
        yield writer.finish()
    finally:
        writer.close()
        shutil.rmtree(workdir, ignore_errors=True)
