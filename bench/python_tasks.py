"""The fixed cost of a Python task in Spark: JVM-Python transport over TCP vs a Unix
socket, and the garbage collection a reused worker runs after each task.

Every ``mapInArrow`` task of every micro-batch pays it, whatever the operator does.
Each case runs in its own Spark session, in a process of its own (the transport is
read when the SparkContext starts; a worker's frozen objects stay frozen for its
life): a job of --tasks trivial tasks (10 rows each) on ``local[2]`` is timed with
and without a ``mapInArrow`` that counts rows; the difference per task and slot is
the Python hop's fixed cost. Median of --repeat jobs after warm-up.

The collection cases (Unix socket): the counting function alone; the same after
importing what an operator task imports (a worker that ran one holds those
modules, and PySpark's worker collects all its objects after every task); and that
function run as our operators run, through ``SparkTask``, which freezes the
imports out of those collections (``spark_integration.execution.long_lived``).
Their processes alternate, --rounds of each.

Run: ``.venv/bin/python bench/python_tasks.py [--tasks N] [--repeat N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, print_table  # noqa: E402
from bench.spark_sessionize import count_rows  # noqa: E402

#: What an operator task imports in its worker (a ``sessionize`` task's modules).
OPERATOR_MODULES = (
    "spark_integration.operators.sessionize",
    "spark_integration.execution.aggregator_task",
    "spark_integration.execution.partition_state",
    "sessionstore.checkpoint.partition.provider",
    "sessionstore.checkpoint.storage.filesystem",
    "pyarrow.fs",
)


def _count_after_imports(batches):
    """``count_rows`` in a worker that holds an operator task's modules, with the
    number of objects its collections walk."""
    import gc
    import importlib

    import pyarrow as pa

    for name in OPERATOR_MODULES:
        importlib.import_module(name)
    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})
    yield pa.RecordBatch.from_pydict({"n": pa.array([-len(gc.get_objects())], pa.int64())})


class _CountTask:
    """:func:`_count_after_imports` as an operator task (``ContextTask``)."""

    def run(self, batches, context):
        yield from _count_after_imports(batches)


def _operator_task(batches):
    """:func:`_count_after_imports` run as an operator's ``mapInArrow`` function."""
    from spark_integration.execution.context import SparkTask

    yield from SparkTask(_CountTask())(batches)


#: The collection cases: the function each one's tasks run.
GC_CASES = {
    "count only": count_rows,
    "operator modules, collected": _count_after_imports,
    "operator modules, frozen (SparkTask)": _operator_task,
}


def measure(unix_socket: bool, tasks: int, repeat: int, case: str = "count only") -> dict:
    """Median job times (s) for ``tasks`` trivial tasks, JVM only and with Python
    (``case``'s function); with the most objects a task saw its worker hold
    outside the frozen ones, where the function reports them."""
    from spark_integration.conf.local_spark import local_spark

    spark = local_spark(
        "sessionstore-bench-python-tasks",
        spark__python__unix__domain__socket__enabled=str(unix_socket).lower(),
    )
    try:
        jvm = spark.range(0, tasks * 10, numPartitions=tasks)
        python = jvm.mapInArrow(GC_CASES[case], "n long")
        out = {}
        for name, df in (("jvm", jvm), ("python", python)):
            times = []
            for i in range(repeat + 3):
                t0 = time.perf_counter()
                df.write.format("noop").mode("overwrite").save()
                if i >= 3:  # the first jobs start the Python workers and warm the JIT
                    times.append(time.perf_counter() - t0)
            out[name] = statistics.median(times)
        # the objects a collection walks, seen by the last job's tasks
        seen = [r.n for r in python.collect() if r.n < 0]
        out["objects"] = -min(seen) if seen else None
        return out
    finally:
        spark.stop()


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=["tcp", "unix"], help=argparse.SUPPRESS)
    ap.add_argument("--case", choices=list(GC_CASES), default="count only", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child == "unix", args.tasks, args.repeat, args.case)))
        return ""

    def child(transport: str, case: str = "count only") -> dict:
        # a process per case: the transport is fixed for a SparkContext's life,
        # and a worker's frozen objects for the worker's
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", transport, "--case", case,
             "--tasks", str(args.tasks), "--repeat", str(args.repeat)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        return json.loads(done.stdout.strip().splitlines()[-1])

    slots = args.tasks / 2  # local[2]
    rows = []
    for transport in ("tcp", "unix"):
        t = child(transport)
        rows.append(
            [
                "loopback TCP (Spark's default)" if transport == "tcp" else "Unix domain socket",
                f"{1e3 * t['jvm']:.0f} ms",
                f"{1e3 * t['python']:.0f} ms",
                f"{1e3 * (t['python'] - t['jvm']) / slots:.1f} ms",
            ]
        )
    text = print_table(
        f"Fixed cost of a Python task, {args.tasks} trivial tasks on local[2] ({machine()})",
        ["JVM-Python transport", "job, JVM only", "job with mapInArrow", "Python hop per task"],
        rows,
    )
    runs: dict[str, list[dict]] = {case: [] for case in GC_CASES}
    for _ in range(args.rounds):
        for case in GC_CASES:  # interleaved: this VM drifts
            runs[case].append(child("unix", case))
    rows = []
    for case, results in runs.items():
        hops = [1e3 * (r["python"] - r["jvm"]) / slots for r in results]
        objects = results[-1]["objects"]
        rows.append([
            case, f"{min(hops):.1f} ms", f"{statistics.median(hops):.1f} ms",
            "" if objects is None else f"{objects:,}",
        ])  # fmt: skip
    return text + print_table(
        f"A reused worker's collection after each task, Unix socket, {args.rounds} processes"
        f" per case, interleaved ({machine()})",
        ["task function", "hop per task, best", "median", "objects a collection walks"],
        rows,
    )


if __name__ == "__main__":
    main()
