"""Rescale on restart, as a Spark job of the query's own session, before its first
batch (:func:`located_backend`, called when an operator is planned).

The engine-agnostic steps are :mod:`sessionstore.checkpoint.offline.rescale` (checks, the
generation, the atomic switch) and :mod:`sessionstore.checkpoint.offline.repartition`
(routing, target databases): what runs here is the copy between them, written
with DataFrames so that it runs alike on a classic session and on a Spark Connect
client: a range of one row per source partition, ``mapInArrow`` loading each
source partition and emitting ``(target, family, key, value)`` rows, a
``repartition`` by target, and ``mapInArrow`` writing each target partition's
database and uploading it as its snapshot. The driver (or Connect client) then
commits the rescale with one metadata write and logs one line.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

from sessionstore.checkpoint.offline.rescale import (
    RescaleError,
    RescalePlan,
    commit_rescale,
    drop_state,
    plan_rescale,
    resume_rescale,
    source_rows,
    write_targets,
)
from sessionstore.checkpoint.partition.identity import layout_of, recorded_layout
from sessionstore.checkpoint.records.generation import state_root
from spark_integration.conf.backend import StateBackend

__all__ = ["located_backend", "locate", "finish_interrupted", "rescale", "copy_state"]

log = logging.getLogger(__name__)

_ROUTED = "before boolean, target int, family string, key binary, value binary"
_COLUMNS = ("before", "target", "family", "key", "value")
_WRITTEN = "partition int, rows long"
#: Rows per Arrow batch a source task emits.
_BATCH_ROWS = 8192


def finish_interrupted(backend: StateBackend, name: str) -> None:
    """Finish the fences and cleanup of a rescale of operator ``name`` that died
    between its switch and its fences (one read when there is nothing to finish);
    before anything reads the operator's layout."""
    uri, options = backend.checkpoint_uri, backend.storage_options
    if resume_rescale(uri, name, options):
        log.warning("sessionstore finished the fences of the rescale of operator %r of %s",
                    name, uri)  # fmt: skip


def located_backend(
    spark: Any, backend: StateBackend, name: str, slabs: int, partitions: int | None = None
) -> StateBackend:
    """``backend`` pointed at the state root of operator ``name`` (the checkpoint
    root, or the generation a rescale made), after rescaling the operator's
    checkpoint to ``partitions`` partitions in ``slabs`` databases (default: one
    each) when it records another layout. The tasks, the coordinator and the
    due-batch reader all open the state there."""
    finish_interrupted(backend, name)
    return locate(spark, backend, name, slabs, slabs if partitions is None else partitions)[0]


def locate(
    spark: Any,
    backend: StateBackend,
    name: str,
    slabs: int,
    partitions: int,
    may_defer: bool = False,
    recorded: tuple[int, int] | None | bool = False,
) -> tuple[StateBackend, int]:
    """:func:`located_backend` once :func:`finish_interrupted` ran, with the
    databases the state is in: ``slabs``, or with ``may_defer`` the recorded ones
    when the rescale is only a spread of the same partitions over more databases
    and the checkpoint cannot take it now (its plan is refused: not at one whole
    batch, nothing committed, another rescale's claim), which is logged once.
    Nothing is written then; a refusal later in a rescale (another driver, a
    commit racing its switch) is raised as ever. ``recorded``: the layout the
    caller read after :func:`finish_interrupted` (None: no checkpoint); read here
    when not given."""
    uri, options = backend.checkpoint_uri, backend.storage_options
    if recorded is False:
        recorded = recorded_layout(uri, name, options)
    if recorded is not None and recorded != (slabs, partitions):
        started = time.perf_counter()
        try:
            plan = plan_rescale(
                uri, name, slabs, options, backend.allow_pickle, key_groups=partitions
            )  # fmt: skip
        except RescaleError as exc:
            if not (may_defer and recorded[1] == partitions and slabs > recorded[0]):
                raise
            log.warning(
                "sessionstore kept operator %r of %s in its %d databases (this cluster "
                "would spread it over %d): %s", name, uri, recorded[0], slabs, exc,
            )  # fmt: skip
            slabs = recorded[0]
        else:
            _run(spark, backend, name, plan, started)
    root = state_root(uri, name, options)
    located = backend if root == uri else dataclasses.replace(backend, checkpoint_uri=root)
    return located, slabs


def rescale(
    spark: Any, backend: StateBackend, name: str, slabs: int, partitions: int | None = None
) -> dict[str, Any]:
    """Rescale operator ``name``'s checkpoint to ``partitions`` partitions in
    ``slabs`` databases (default: one each) with a Spark job of ``spark``; logs
    one line and returns ``{"operator", "version", "from_partitions",
    "partitions", "from_slabs", "slabs", "rows", "seconds"}``.
    :class:`~sessionstore.checkpoint.offline.rescale.RescaleError` (before anything is
    switched) when it cannot be done."""
    started = time.perf_counter()
    partitions = slabs if partitions is None else partitions
    plan = plan_rescale(
        backend.checkpoint_uri, name, slabs, backend.storage_options, backend.allow_pickle,
        key_groups=partitions,
    )  # fmt: skip
    return _run(spark, backend, name, plan, started)


def _run(
    spark: Any, backend: StateBackend, name: str, plan: RescalePlan, started: float
) -> dict[str, Any]:
    """Copy, switch and clean up the planned rescale (:func:`rescale`), logging one
    line."""
    slabs = plan.copy.partitions
    partitions = plan.copy.key_groups or slabs
    before = layout_of(plan.copy.metadata) or (plan.copy.source_partitions,) * 2
    rows = copy_state(spark, plan)
    commit_rescale(plan)
    _drop_previous(plan)
    seconds = time.perf_counter() - started
    copy = plan.copy
    log.warning(
        "sessionstore rescaled operator %r of %s from %d to %d partitions%s at version %d "
        "(%d rows, a Spark job) in %.1f s",
        name, backend.checkpoint_uri, before[1], partitions,
        "" if before[0] == before[1] and slabs == partitions
        else f" (in {before[0]}, now {slabs} databases)",
        copy.version, rows, seconds,
    )  # fmt: skip
    return {
        "operator": name,
        "version": copy.version,
        "from_partitions": before[1],
        "partitions": partitions,
        "from_slabs": copy.source_partitions,
        "slabs": slabs,
        "rows": rows,
        "seconds": seconds,
    }


def _drop_previous(plan: RescalePlan) -> None:
    try:
        drop_state(plan)
    except OSError as exc:  # never read again; the next rescale's cleanup removes it
        log.warning("sessionstore could not delete the state before the rescale: %s", exc)


def copy_state(spark: Any, plan: RescalePlan) -> int:
    """Write every target partition of ``plan``'s new generation (the versions it
    copies: replayable.py) with DataFrame jobs of ``spark`` (classic or Connect);
    returns the rows written. Raises when a target partition was not written."""
    from pyspark.sql import functions as F

    copy = plan.copy
    n = copy.source_partitions
    sources = spark.range(0, n, 1, n).select(F.col("id").cast("int").alias("source"))
    routed = sources.mapInArrow(partial(_route, plan), _ROUTED)
    # one task per target partition (a hash of the target: a task may get several)
    by_target = routed.repartition(copy.partitions, "target")
    written = by_target.mapInArrow(partial(_write, plan), _WRITTEN).collect()
    done = sorted(row["partition"] for row in written)
    if done != list(range(copy.partitions)):
        raise RuntimeError(
            f"the rescale of {copy.operator!r} wrote partitions {done}, not 0..{copy.partitions - 1}"
        )
    return sum(row["rows"] for row in written)


def _route(plan: RescalePlan, batches: Iterator[Any]) -> Iterator[Any]:
    """Source task: every row of its source partitions, with its target."""
    import pyarrow as pa

    schema = pa.schema(
        [("before", pa.bool_()), ("target", pa.int32()), ("family", pa.string()),
         ("key", pa.binary()), ("value", pa.binary())]
    )  # fmt: skip
    workdir = tempfile.mkdtemp(prefix="sessionstore-rescale-")
    try:
        for batch in batches:
            for source in batch.column("source").to_pylist():
                columns: list[list[Any]] = [[] for _ in _COLUMNS]
                for row in source_rows(plan, source, workdir):
                    for column, value in zip(columns, row, strict=True):
                        column.append(value)
                    if len(columns[0]) >= _BATCH_ROWS:
                        yield pa.RecordBatch.from_arrays(columns, schema=schema)
                        columns = [[] for _ in _COLUMNS]
                if columns[0]:
                    yield pa.RecordBatch.from_arrays(columns, schema=schema)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _write(plan: RescalePlan, batches: Iterator[Any]) -> Iterator[Any]:
    """Target task: the target partitions whose rows it got."""
    import pyarrow as pa

    def rows() -> Iterator[tuple[Any, ...]]:
        for batch in batches:
            yield from zip(*(batch.column(c).to_pylist() for c in _COLUMNS), strict=True)

    workdir = tempfile.mkdtemp(prefix="sessionstore-rescale-")
    try:
        done = write_targets(plan, rows(), workdir)
        yield pa.RecordBatch.from_pylist(
            done, schema=pa.schema([("partition", pa.int32()), ("rows", pa.int64())])
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
