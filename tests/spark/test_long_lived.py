"""A long-lived process keeps what it imported out of its garbage collections
(spark_integration.execution.long_lived): PySpark's reused worker collects every
object it holds after each task, and ours hold a whole operator's modules."""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys

import pyarrow as pa

from spark_integration.execution.context import SparkTask
from spark_integration.execution.long_lived import freeze_long_lived

#: What the probe task imports, as an operator task does in its worker.
OPERATOR_MODULES = (
    "spark_integration.operators.sessionize",
    "spark_integration.execution.aggregator_task",
    "sessionstore.checkpoint.partition.provider",
)


def _in_child(check) -> dict:
    """``check()``'s JSON result, computed in a forked child (a freeze in this
    process would outlive the test)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, json.dumps(check()).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        chunks = []
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
        return json.loads(b"".join(chunks))
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def test_a_process_freezes_once_and_again_only_after_new_imports():
    def check():
        before = gc.get_freeze_count()
        freeze_long_lived()
        first = gc.get_freeze_count()
        kept = [[i] for i in range(1000)]  # new objects, no new module
        freeze_long_lived()
        unchanged = gc.get_freeze_count()
        importlib.import_module("colorsys" if "colorsys" not in sys.modules else "wave")
        freeze_long_lived()
        again = gc.get_freeze_count()

        def forked():  # no import since the parent's freeze, but a process of its own
            fresh = [[i] for i in range(1000)]
            start = gc.get_freeze_count()
            freeze_long_lived()
            return [start, gc.get_freeze_count() - start, len(fresh)]

        return [before, first, unchanged, again, len(kept), _in_child(forked)]

    before, first, unchanged, again, kept, grandchild = _in_child(check)
    assert before == 0 and first > 10_000  # everything the process held
    assert unchanged == first  # nothing imported since: the new lists stay collectable
    assert again >= first + kept  # an import freezes what exists now
    inherited, added, fresh = grandchild
    assert inherited > 10_000  # a fork keeps its parent's frozen objects
    assert added >= fresh  # and freezes what it holds at its own first call


class _Probe:
    """An operator task that imports an operator's modules and reports its worker's
    pid and the objects the worker's collections walk (not frozen) and skip."""

    def run(self, batches, context):
        for name in OPERATOR_MODULES:
            importlib.import_module(name)
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict(
            {
                "pid": pa.array([os.getpid()], pa.int64()),
                "walked": pa.array([len(gc.get_objects())], pa.int64()),
                "frozen": pa.array([gc.get_freeze_count()], pa.int64()),
            }
        )


def test_a_reused_worker_collects_only_what_its_later_tasks_allocate(spark):
    """Spark's reused workers, running an operator task (``SparkTask``), hold its
    modules frozen from their second task on: a collection walks a few thousand
    objects, not the ~80,000 a worker holding an operator's modules has."""
    df = spark.range(0, 40, numPartitions=2)
    seen: dict[int, list[tuple[int, int]]] = {}
    for _ in range(4):
        for row in df.mapInArrow(
            SparkTask(_Probe()), "pid long, walked long, frozen long"
        ).collect():
            seen.setdefault(row.pid, []).append((row.walked, row.frozen))
    reused = {pid: tasks for pid, tasks in seen.items() if len(tasks) > 1}
    assert reused, seen  # Spark reused its workers
    for pid, tasks in reused.items():
        for walked, frozen in tasks[1:]:
            assert walked < 10_000 and frozen > 40_000, (pid, tasks)
