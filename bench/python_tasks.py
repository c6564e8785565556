"""The fixed cost of a Python task in Spark: JVM-Python transport over TCP vs a Unix socket.

Every ``mapInArrow`` task of every micro-batch pays it, whatever the operator does.
Each transport runs in its own Spark session (the setting is read when the
SparkContext starts): a job of --tasks trivial tasks (10 rows each) on ``local[2]``
is timed with and without a ``mapInArrow`` that counts rows; the difference per
task and slot is the Python hop's fixed cost. Median of --repeat jobs after warm-up.

Run: ``.venv/bin/python bench/python_tasks.py [--tasks N] [--repeat N]``.
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


def measure(unix_socket: bool, tasks: int, repeat: int) -> dict[str, float]:
    """Median job times (s) for ``tasks`` trivial tasks, JVM only and with Python."""
    from spark_integration.conf.local_spark import local_spark

    spark = local_spark(
        "sessionstore-bench-python-tasks",
        spark__python__unix__domain__socket__enabled=str(unix_socket).lower(),
    )
    try:
        jvm = spark.range(0, tasks * 10, numPartitions=tasks)
        python = jvm.mapInArrow(count_rows, "n long")
        out = {}
        for name, df in (("jvm", jvm), ("python", python)):
            times = []
            for i in range(repeat + 3):
                t0 = time.perf_counter()
                df.write.format("noop").mode("overwrite").save()
                if i >= 3:  # the first jobs start the Python workers and warm the JIT
                    times.append(time.perf_counter() - t0)
            out[name] = statistics.median(times)
        return out
    finally:
        spark.stop()


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--child", choices=["tcp", "unix"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child == "unix", args.tasks, args.repeat)))
        return ""
    rows = []
    for transport in ("tcp", "unix"):
        # one process per transport: the setting is fixed for a SparkContext's life
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", transport,
             "--tasks", str(args.tasks), "--repeat", str(args.repeat)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        t = json.loads(done.stdout.strip().splitlines()[-1])
        slots = args.tasks / 2  # local[2]
        rows.append(
            [
                "loopback TCP (Spark's default)" if transport == "tcp" else "Unix domain socket",
                f"{1e3 * t['jvm']:.0f} ms",
                f"{1e3 * t['python']:.0f} ms",
                f"{1e3 * (t['python'] - t['jvm']) / slots:.1f} ms",
            ]
        )
    return print_table(
        f"Fixed cost of a Python task, {args.tasks} trivial tasks on local[2] ({machine()})",
        ["JVM-Python transport", "job, JVM only", "job with mapInArrow", "Python hop per task"],
        rows,
    )


if __name__ == "__main__":
    main()
