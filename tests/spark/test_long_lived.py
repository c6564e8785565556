"""A long-lived process keeps what it imported out of its garbage collections
(spark_integration.execution.long_lived): PySpark's reused worker collects every
object it holds after each task, and ours hold a whole operator's modules."""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys

import pyarrow as pa

from spark_integration.execution.context import SparkTask
from tests.packaging import checkout_pythonpath

#: What the probe task imports, as an operator task does in its worker.
OPERATOR_MODULES = (
    "spark_integration.operators.sessionize",
    "spark_integration.execution.aggregator_task",
    "sessionstore.checkpoint.partition.provider",
)


#: Run in a fresh interpreter (a freeze in the test's process would outlive the
#: test, and forking it would copy its JVM gateway's threads and sockets).
FREEZES = """
import gc, json, os, sys, types
from spark_integration.execution.long_lived import MAX_FREEZES, freeze_long_lived

def more_modules(n=1):  # as if the process imported a module
    for _ in range(n):
        name = f"_probe_{len(sys.modules)}"
        sys.modules[name] = types.ModuleType(name)

counts = [gc.get_freeze_count()]
freeze_long_lived()
counts.append(gc.get_freeze_count())  # 1: the first call freezes
kept = [[i] for i in range(1000)]
freeze_long_lived()
counts.append(gc.get_freeze_count())  # 2: nothing imported since: no freeze
more_modules()
freeze_long_lived()
counts.append(gc.get_freeze_count())  # 3: an import: a freeze, the lists with it
between = [[i] for i in range(1000)]
del sys.modules[next(n for n in sys.modules if n.startswith("_probe_"))]
more_modules()
freeze_long_lived()
counts.append(gc.get_freeze_count())  # 4: as many modules as before: no freeze
for _ in range(MAX_FREEZES - 2):
    more_modules(2)
    freeze_long_lived()
counts.append(gc.get_freeze_count())  # 5: freezes up to the cap
capped = [[i] for i in range(1000)]
more_modules(2)
freeze_long_lived()
counts.append(gc.get_freeze_count())  # 6: past the cap: none
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # a forked child freezes at its own first call
    fresh = [[i] for i in range(1000)]
    start = gc.get_freeze_count()
    freeze_long_lived()
    os.write(write, json.dumps([start, gc.get_freeze_count() - start]).encode())
    os._exit(0)
os.close(write)
child = json.loads(os.read(read, 1000))
os.waitpid(pid, 0)
print(json.dumps({"counts": counts, "child": child}))
"""


def test_a_process_freezes_when_it_holds_new_modules_and_at_most_max_freezes_times():
    env = {**os.environ, "PYTHONPATH": checkout_pythonpath()}
    done = subprocess.run(
        [sys.executable, "-c", FREEZES], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    before, first, same, imported, as_many, at_cap, past_cap = result["counts"]
    assert first > before + 5_000  # everything the process held
    assert same == first  # no new module: the new lists stay collectable
    assert imported >= first + 1000  # a new module: what exists now is frozen
    assert as_many <= imported  # a module swapped for another: no freeze (of the lists)
    assert at_cap >= imported + 2  # freezes up to MAX_FREEZES
    assert past_cap <= at_cap  # and none after, whatever is imported
    inherited, added = result["child"]
    assert abs(inherited - past_cap) < 100  # a fork keeps its parent's frozen objects
    assert added >= 1000  # and freezes what it holds at its own first call


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
    modules frozen once it ends: a later task's collection walks a few thousand
    objects, not the ~80,000 a worker holding an operator's modules has, and no
    later task freezes more (the same modules: the frozen count never grows)."""
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
            assert walked < 20_000 and frozen > 40_000, (pid, tasks)
        later = [frozen for _, frozen in tasks[1:]]
        assert later == sorted(later, reverse=True), (pid, tasks)
