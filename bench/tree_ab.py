"""Same-run A/B of two source trees on the 1M-event ``sessionize`` stream.

A refactor must not slow the product down, and this VM drifts by more than the
differences worth seeing, so two trees are compared in one run, alternating:
``--a`` and ``--b`` are source trees (a git worktree each, for example the commit
before a change and after it). Each timed query runs in a fresh process whose
``PYTHONPATH`` starts with its tree, so the driver, Spark's Python workers and the
state servers all run that tree's code. Each process runs an untimed warm-up
query (the JVM's first query, the state servers' start) and then the timed one.

The workload is the one of ``bench/spark_sessionize.py`` (``--events`` events over
``--keys`` Zipf keys in ``--batches`` Parquet files, one per micro-batch,
``trigger(availableNow=True)``, ``local[2]``, noop sink), ``sessionize`` with a
count, its checkpoint in a local folder, at each partition count of
``--partitions`` (``num_partitions=P`` and ``spark.sql.shuffle.partitions=P``).
Rounds alternate A and B (A first in even rounds, B first in odd ones); the table
gives the best and the median of ``--rounds``.

Run: ``.venv/bin/python bench/tree_ab.py --a ../old --b . [--partitions 4,200]
[--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(args: argparse.Namespace) -> None:
    """One process: warm up, then time one query; print the seconds as JSON."""
    try:
        from spark_integration.conf.local_spark import local_spark
    except ImportError:  # a tree from before spark_integration had folders
        from spark_integration.local import local_spark
    from spark_integration import StateBackend, sessionize

    p = args.worker_partitions
    spark = local_spark("sessionstore-tree-ab", partitions=p, spark__driver__memory="4g")

    def run(name: str, source: str) -> float:
        stream = (
            spark.readStream.schema("user string, ts timestamp")
            .option("maxFilesPerTrigger", 1).parquet(source)
        )  # fmt: skip
        backend = StateBackend(
            f"file://{args.scratch}/state-{name}", local_dir=f"{args.scratch}/local-{name}"
        )
        out = sessionize(
            stream, key="user", timestamp="ts", gap="60 seconds",
            aggregations={"count": "count"}, backend=backend, num_partitions=p,
        )  # fmt: skip
        t0 = time.perf_counter()
        query = (
            out.writeStream.format("noop").outputMode("append")
            .option("checkpointLocation", f"{args.scratch}/ck-{name}")
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination()
        return time.perf_counter() - t0

    run("warm", args.warm_source)
    seconds = run("timed", args.source)
    spark.stop()
    print(json.dumps({"seconds": seconds}), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="source tree A (the baseline)")
    ap.add_argument("--b", required=True, help="source tree B (the change)")
    ap.add_argument("--partitions", default="4,200")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-partitions", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--source", help=argparse.SUPPRESS)
    ap.add_argument("--warm-source", help=argparse.SUPPRESS)
    ap.add_argument("--scratch", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return

    sys.path.insert(0, os.path.dirname(HERE))
    from bench.common import machine, print_table, scratch_dir
    from bench.spark_sessionize import write_input

    trees = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    results: dict[tuple[int, str], list[float]] = {}
    with scratch_dir("bench-tree-ab-") as tmp:
        source, warm = os.path.join(tmp, "in"), os.path.join(tmp, "warm")
        write_input(source, args.events, args.keys, args.batches)
        write_input(warm, args.events // 20, args.keys // 20, 2)
        for p in [int(x) for x in args.partitions.split(",")]:
            for r in range(args.rounds):
                for label in ("AB" if r % 2 == 0 else "BA"):
                    scratch = os.path.join(tmp, f"run-{p}-{r}-{label}")
                    os.makedirs(scratch)
                    env = dict(os.environ, PYTHONPATH=trees[label])
                    out = subprocess.run(
                        [sys.executable, os.path.abspath(__file__), "--a", "-", "--b", "-",
                         "--worker", "--worker-partitions", str(p), "--source", source,
                         "--warm-source", warm, "--scratch", scratch],
                        env=env, cwd=trees[label], capture_output=True, text=True, timeout=900,
                    )  # fmt: skip
                    if out.returncode != 0:
                        sys.exit(f"tree {label} at {p} partitions failed:\n{out.stderr[-3000:]}")
                    seconds = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
                    results.setdefault((p, label), []).append(seconds)
                    print(f"P={p} round {r} {label}: {seconds:.2f} s", flush=True)
    rows = []
    for p in sorted({p for p, _ in results}):
        a, b = results[(p, "A")], results[(p, "B")]
        rows.append([
            str(p), f"{min(a):.2f} s", f"{min(b):.2f} s", f"{min(a) / min(b):.2f}x",
            f"{statistics.median(a):.2f} s", f"{statistics.median(b):.2f} s",
            f"{statistics.median(a) / statistics.median(b):.2f}x",
        ])  # fmt: skip
    print_table(
        f"Tree A/B, sessionize count, {args.events:,} events, {args.rounds} rounds ({machine()})",
        ["partitions", "A best", "B best", "A/B best", "A median", "B median", "A/B median"],
        rows,
    )


if __name__ == "__main__":
    main()
