"""CPU time of ``sessionize``'s tasks over the Spark benchmark's stream, without Spark.

The 4-partition Spark benchmark (``bench/spark_sessionize.py``) times Spark and
our tasks together on a shared machine; this one runs only the tasks, in one
process, exactly as Spark's Python workers run them (``SessionizeTask.run``: load
the partition's version, advance to the shared event time read from the durable
records, process the rows, commit to a ``file://`` checkpoint, build the output
batches), and sums their CPU time (``time.process_time``). The input is the
benchmark's: ``--events`` events over ``--keys`` Zipf keys (s=1.1), ~10 ms apart,
in ``--batches`` micro-batches, hash-partitioned into ``--partitions`` partitions
by key (crc32: any fixed split of the keys shows the same work), gap 60 s and
grace 60 s (the watermark the benchmark gives the built-in path). With
``--aggregates`` the aggregates are those of the issue's benchmark (count, avg,
stddev, approx_count_distinct), else a count. Best of ``--rounds``; ``--profile
FILE`` writes a cProfile of the last round.

Run: ``PYTHONPATH=. .venv/bin/python bench/sessionize_task.py [--aggregates]
[--events N] [--keys N] [--batches N] [--partitions N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import scratch_dir, zipf_users  # noqa: E402
from bench.spark_sessionize import AGGREGATES  # noqa: E402

GAP = GRACE = 60_000


def make_input(events: int, keys: int, batches: int, partitions: int, values: bool):
    """``[batch][partition] -> RecordBatch`` of the task's input columns (the key,
    ``TS`` in ms, and the value columns), in the benchmark's stream."""
    import pyarrow as pa

    from spark_integration.conf.names import TS

    rng = np.random.default_rng(5)
    names = zipf_users(rng, events, keys)
    ts = 1_700_000_000_000 + np.cumsum(rng.integers(0, 20, size=events))
    amounts = np.round(rng.gamma(2.0, 20.0, size=events), 2)
    pages = np.array([f"/p{p}" for p in range(50)], dtype=object)[rng.integers(0, 50, events)]
    part_of = {k: zlib.crc32(k.encode()) % partitions for k in set(names.tolist())}
    parts = np.array([part_of[k] for k in names.tolist()])
    per = events // batches
    out = []
    for b in range(batches):
        sl = slice(b * per, (b + 1) * per)
        row = []
        for p in range(partitions):
            m = parts[sl] == p
            cols = {"user": pa.array(names[sl][m].tolist()), TS: pa.array(ts[sl][m], pa.int64())}
            if values:
                cols["amount"] = pa.array(amounts[sl][m], pa.float64())
                cols["page"] = pa.array(pages[sl][m].tolist(), pa.string())
            row.append(pa.RecordBatch.from_pydict(cols))
        out.append(row)
    return out


def make_task(folder: str, partitions: int, aggregates: bool):
    """The task ``sessionize`` plans for this input (emit on close)."""
    from pyspark.sql import types as T

    from spark_integration.conf.backend import StateBackend
    from spark_integration.execution.output import OperatorOutput
    from spark_integration.operators.sessionize import SessionizeTask
    from spark_integration.planning.aggregation_specs import parse_aggregations, value_type

    fields = {
        "user": T.StructField("user", T.StringType()),
        "ts": T.StructField("ts", T.TimestampType()),
        "amount": T.StructField("amount", T.DoubleType()),
        "page": T.StructField("page", T.StringType()),
    }
    spec = AGGREGATES if aggregates else {"count": "count"}
    others = ["amount", "page"] if aggregates else []
    aggregation, value_cols, plan = parse_aggregations(spec, others, fields, "error", "timestamp")
    out_fields = [fields["user"], T.StructField("session_start", T.TimestampType()),
                  T.StructField("session_end", T.TimestampType())]  # fmt: skip
    for out_name, fn, column in plan:
        out_fields.append(T.StructField(out_name, value_type(fn, column, fields, spec[out_name])))
    output = OperatorOutput(
        T.StructType(out_fields).json(), ["user"], plan, True, "session_start", "session_end"
    )
    backend = StateBackend(f"file://{folder}/state", local_dir=f"{folder}/local")
    return SessionizeTask(
        backend=backend, name="sessionize", num_partitions=partitions, value_cols=value_cols,
        emit="final", aggregation=aggregation, output=output, key_types=["string"],
        gap_ms=GAP, grace_ms=GRACE,
    )  # fmt: skip


def run_once(inputs, folder: str, aggregates: bool, profile: str | None = None):
    """Run every task of every micro-batch; returns (CPU seconds, output rows)."""
    from spark_integration.execution.context import TaskContext, TaskInfo

    os.makedirs(folder)
    task = make_task(folder, len(inputs[0]), aggregates)
    prof = cProfile.Profile() if profile else None
    rows = 0
    cpu = 0.0
    for b, row in enumerate(inputs):
        for p, batch in enumerate(row):
            context = TaskContext(TaskInfo(p, b, 0, "bench"), outlives_task=True)
            t0 = time.process_time()
            if prof:
                prof.enable()
            out = list(task.run(iter([batch]), context))
            if prof:
                prof.disable()
            cpu += time.process_time() - t0
            rows += sum(o.num_rows for o in out)
    if prof:
        prof.dump_stats(profile)
    return cpu, rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--aggregates", action="store_true")
    parser.add_argument("--profile", default=None)
    args = parser.parse_args(argv)
    inputs = make_input(args.events, args.keys, args.batches, args.partitions, args.aggregates)
    from sessionstore.checkpoint.service.store_service import StoreService

    service = StoreService.instance()
    best, rows = float("inf"), 0
    with scratch_dir("sessionize-task-") as scratch:
        for r in range(args.rounds):
            last = r == args.rounds - 1
            # a fresh checkpoint and local folder per round: the store service keeps
            # each round's databases open under their own keys
            folder = os.path.join(scratch, f"round-{r}")
            cpu, rows = run_once(inputs, folder, args.aggregates, args.profile if last else None)
            best = min(best, cpu)
            print(f"round {r}: {cpu:.3f} s CPU, {rows:,} rows out", flush=True)
            # the round's background snapshot uploads end before the next round's
            # CPU is counted (process_time counts every thread)
            service.drain()
        service.close_all()  # before the scratch folder goes
    which = "aggregates" if args.aggregates else "count"
    print(f"best of {args.rounds} ({which}): {best:.3f} s CPU, {rows:,} rows out")


if __name__ == "__main__":
    main()
