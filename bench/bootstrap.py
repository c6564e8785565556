"""Bootstrapping ``sessionize`` from a history against the query processing it.

The 1M-event stream of ``bench/spark_sessionize.py`` and ``bench/spark_scale.py``
(same generator: --events events over --keys Zipf keys, --batches Parquet files),
a count per session, gap 60 s, --partitions state partitions on local[2], the
checkpoint on ``file://``. In the same run, after an untimed warm-up of both (the
JVM's first jobs, the state servers' start), in interleaved rounds (best of
--rounds):

1. ``query``: ``sessionize`` over the stream, one file per micro-batch,
   ``trigger(availableNow=True)``, noop sink: the time the query takes to process
   the events;
2. ``bootstrap``: ``bootstrap_sessionize`` of the same events read as one batch
   DataFrame: one Spark job, one task per state partition.

Then, once, the exactness check: ``bootstrap_sessionize`` from every file but the
last, the query on the last file, against the query on every file; both outputs
collected and compared row for row.

Run: ``.venv/bin/python bench/bootstrap.py [--events N] [--keys N] [--batches N]
[--partitions N] [--rounds N] [--no-check]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, print_table, scratch_dir  # noqa: E402
from bench.spark_sessionize import write_input  # noqa: E402

SCHEMA = "user string, ts timestamp"
SESSIONS = {"key": "user", "timestamp": "ts", "gap": "60 seconds"}


def _backend(tmp: str, run: str) -> Any:
    from spark_integration import StateBackend

    return StateBackend(f"file://{tmp}/state-{run}", local_dir=os.path.join(tmp, f"local-{run}"))


def _query(spark: Any, source: str, tmp: str, run: str, n: int, sink: str = "noop") -> Any:
    """``sessionize`` over the files of ``source``, started: to the noop sink, or
    to a memory table named ``run`` (``sink="memory"``)."""
    from spark_integration import sessionize

    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    out = sessionize(stream, **SESSIONS, backend=_backend(tmp, run), num_partitions=n)
    writer = out.writeStream.format(sink).outputMode("append")
    if sink == "memory":
        writer = writer.queryName(run.replace("-", "_"))
    return (
        writer.option("checkpointLocation", os.path.join(tmp, f"ck-{run}"))
        .trigger(availableNow=True)
        .start()
    )


def _timed_query(spark: Any, source: str, tmp: str, run: str, n: int) -> float:
    start = time.perf_counter()
    _query(spark, source, tmp, run, n).awaitTermination()
    return time.perf_counter() - start


def _timed_bootstrap(spark: Any, source: str, tmp: str, run: str, n: int) -> tuple[float, dict]:
    from spark_integration import bootstrap_sessionize

    start = time.perf_counter()
    history = spark.read.schema(SCHEMA).parquet(source)
    done = bootstrap_sessionize(history, **SESSIONS, backend=_backend(tmp, run), num_partitions=n)
    return time.perf_counter() - start, done


def _collected(spark: Any, source: str, tmp: str, run: str, n: int) -> Counter:
    _query(spark, source, tmp, run, n, sink="memory").awaitTermination()
    return Counter(tuple(r) for r in spark.table(run.replace("-", "_")).collect())


def _check(spark: Any, source: str, tmp: str, n: int) -> tuple[int, bool]:
    """Bootstrapped from every file but the last, then the query on the last,
    against the query on every file: ``(rows, equal)``."""
    files = sorted(f for f in os.listdir(source) if f.endswith(".parquet"))
    history, rest = os.path.join(tmp, "check-history"), os.path.join(tmp, "check-rest")
    os.makedirs(history), os.makedirs(rest)
    for f in files[:-1]:
        shutil.copy2(os.path.join(source, f), history)
    shutil.copy2(os.path.join(source, files[-1]), rest)
    whole = _collected(spark, source, tmp, "check-whole", n)
    _timed_bootstrap(spark, history, tmp, "check-boot", n)
    got = _collected(spark, rest, tmp, "check-boot", n)
    return sum(whole.values()), got == whole


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-check", action="store_true", help="skip the exactness check")
    args = ap.parse_args(argv)
    from spark_integration.conf.local_spark import local_spark

    n = args.partitions
    spark = local_spark("sessionstore-bench", partitions=n, spark__driver__memory="4g")
    best: dict[str, float] = {}
    with scratch_dir("bench-bootstrap-") as tmp:
        source = os.path.join(tmp, "in")
        write_input(source, args.events, args.keys, args.batches)
        warm = os.path.join(tmp, "warm")
        os.makedirs(warm)
        shutil.copy2(os.path.join(source, "part-0000.parquet"), warm)
        _timed_query(spark, warm, tmp, "warm-query", n)
        _timed_bootstrap(spark, warm, tmp, "warm-boot", n)
        done: dict = {}
        for r in range(args.rounds):
            cases = ["query", "bootstrap"] if r % 2 == 0 else ["bootstrap", "query"]
            for case in cases:
                if case == "query":
                    took = _timed_query(spark, source, tmp, f"query-{r}", n)
                else:
                    took, done = _timed_bootstrap(spark, source, tmp, f"boot-{r}", n)
                best[case] = min(best.get(case, took), took)
        assert done["events"] == args.events, done
        checked = None if args.no_check else _check(spark, source, tmp, n)
    spark.stop()
    head = (
        f"{args.events:,} events, {args.keys:,} Zipf keys, {args.batches} files, "
        f"{n} partitions, best of {args.rounds} interleaved rounds ({machine()})"
    )
    rows = [
        [case, f"{best[case]:.1f}", f"{args.events / best[case]:,.0f}"]
        for case in ("query", "bootstrap")
    ]
    text = print_table(head, ["case", "seconds", "events/s"], rows)
    if checked is not None:
        line = f"bootstrapped + last file == every file: {checked[1]} ({checked[0]:,} sessions)"
        print(line)
        text += "\n" + line
    return text


if __name__ == "__main__":
    main()
