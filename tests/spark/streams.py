"""Driving streaming queries in tests: JSON file sources fed one micro-batch at a time."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def json_source(spark: Any, folder: Path, schema: str) -> Any:
    """A streaming JSON source reading one file per micro-batch."""
    folder.mkdir(parents=True, exist_ok=True)
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(folder))


def two_json_sources(
    spark: Any, root: Path, first: tuple[str, str], second: tuple[str, str]
) -> tuple[Any, Any, Callable[[int, Sequence[dict], Sequence[dict]], Callable[[], None]]]:
    """Two streaming JSON sources (a join's inputs), each ``(folder name, schema)``
    under ``root``, and ``step(i, first_rows, second_rows)``: a step writing batch
    ``i``'s file of each."""
    folders = (root / first[0], root / second[0])
    dfs = [
        json_source(spark, folder, schema)
        for folder, (_, schema) in zip(folders, (first, second), strict=True)
    ]

    def step(i: int, rows: Sequence[dict], others: Sequence[dict]) -> Callable[[], None]:
        return lambda: (write_json(folders[0], i, rows), write_json(folders[1], i, others))

    return dfs[0], dfs[1], step


def write_json(folder: Path, index: int, rows: Sequence[dict]) -> None:
    """Write one batch file atomically (the source must never see half a file),
    modified after every batch file already in ``folder``.

    Spark's file source takes files in order of modification time. Files written
    within one tick of the file system's clock tie, and a tie goes by listing
    order: ext4's happens to follow the names, tmpfs's is the reverse, so two
    files written before a query reads them would be read last first."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".part-{index:04d}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # a millisecond apart at least: Spark reads modification times in milliseconds
    after = max((p.stat().st_mtime_ns for p in folder.glob("part-*.json")), default=0)
    stamp = max(tmp.stat().st_mtime_ns, after + 1_000_000)
    os.utime(tmp, ns=(stamp, stamp))
    tmp.rename(folder / f"part-{index:04d}.json")


def run_stream(out: Any, checkpoint: Path, steps: Sequence[Callable[[], None]]) -> list[dict]:
    """Start ``out`` in append mode, run each step (writing a batch's files) and let
    the query process it before the next, so no file source can reorder batches.
    Returns every emitted row."""
    return [row for rows in run_stream_batches(out, checkpoint, steps) for row in rows]


def run_stream_batches(
    out: Any, checkpoint: Path, steps: Sequence[Callable[[], None]], mode: str = "append"
) -> list[list[dict]]:
    """:func:`run_stream` in output mode ``mode``; the rows of each micro-batch apart."""
    collected: list[list[dict]] = []
    query = (
        out.writeStream.outputMode(mode)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(lambda batch, _: collected.append([r.asDict() for r in batch.collect()]))
        .start()
    )
    drive(query, steps)
    return collected


def drive(query: Any, steps: Sequence[Callable[[], None]]) -> None:
    """Run each step and let ``query`` process what it wrote before the next; stop
    ``query`` at the end, also on an error."""
    try:
        for step in steps:
            step()
            query.processAllAvailable()
    finally:
        query.stop()


@contextmanager
def without_due_batches(spark: Any) -> Iterator[None]:
    """Queries planned in the block run no due batches
    (spark_integration/planning/due_batches.py): for tests whose claim is about
    each data batch's own output, metrics or versions, one batch per input file."""
    from spark_integration.planning.due_batches import DUE_BATCHES_CONF

    spark.conf.set(DUE_BATCHES_CONF, "false")
    try:
        yield
    finally:
        spark.conf.unset(DUE_BATCHES_CONF)


@contextmanager
def spark_confs(spark: Any, confs: dict[str, str]) -> Iterator[None]:
    """``confs`` set on ``spark`` for the block; each key's value before it (or its
    absence) comes back after, also on an error."""
    saved = {key: spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
