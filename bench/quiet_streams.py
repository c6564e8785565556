"""Quiet streams: what due batches cost when nothing is due, and how soon what is
due gets written when no row arrives (spark_integration/planning/due_batches.py).

Workload: a JSON file source on local[2], processing-time trigger --trigger-ms,
watermark 10 s, gap 30 s. File 1: --keys users' clicks around t0; file 2 (once file
1 is processed): one click 5 minutes of event time later, which passes every
session of file 1. Then no input for --idle-s seconds. Two queries side by side
over the same folder, each writing to a foreachBatch sink that stamps the wall
clock when it receives rows:

1. Spark's built-in ``session_window`` count (its state store: HDFS-backed);
2. ``sessionize`` with a count, state checkpointed to ``file://``.

Reported per query: the micro-batches after the last batch with input (Spark's
no-data batch; our due batch) and their summed ``triggerExecution`` time; the
latency from "due" (the end of file 2's batch, which made the sessions due) to
"written" (the sink has the closed sessions); and for ours the time the due
source's ``latestOffset`` takes per idle trigger (in ``durationMs.latestOffset``,
all sources together).

``--available-now`` measures instead what the due source costs an ``availableNow``
run (a scheduled incremental job): --files files of --keys users' clicks, each 5
minutes of event time after the one before (so each closes the sessions of the
one before), read one file per batch, then the run ends. Three queries, one after
the other (the other way round in odd rounds), each on a new checkpoint: Spark's
``session_window`` count, ``sessionize`` with its due source, and ``sessionize``
without it (``spark.sessionstore.dueBatches.enabled=false``, the same-run
baseline, which leaves the last file's sessions for the next run). Reported per
query: batches run, sessions written, the run's wall time (from ``start()``), the
batches' summed ``triggerExecution`` time (the rest is the query's start), the
summed ``latestOffset`` time (all sources; Spark asks the due source before every
batch of the run) and the time of the batches without input.

Run: ``.venv/bin/python bench/quiet_streams.py [--keys N] [--trigger-ms N]
[--idle-s N] [--rounds N] [--available-now [--files N]]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, print_table, scratch_dir  # noqa: E402

T0 = 1_700_000_000_000
GAP_S = 30


def write(folder: Path, index: int, rows: list[dict]) -> None:
    tmp = folder / f".part-{index}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(folder / f"part-{index}.json")


class Sink:
    """A foreachBatch sink stamping when each batch with rows arrives."""

    def __init__(self) -> None:
        self.written: list[tuple[float, int]] = []

    def __call__(self, batch: Any, batch_id: int) -> None:
        rows = batch.count()
        if rows:
            self.written.append((time.time(), rows))


def one_round(spark: Any, work: Path, args: argparse.Namespace) -> list[list[str]]:
    from pyspark.sql import functions as F

    from spark_integration import StateBackend, sessionize

    source = work / "in"
    source.mkdir()
    stream = spark.readStream.schema("user string, ts long").option(
        "maxFilesPerTrigger", 1
    ).json(str(source))
    timed = stream.withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "10 seconds")
    builtin = timed.groupBy(F.session_window("t", f"{GAP_S} seconds"), "user").count()
    backend = StateBackend(f"file://{work}/state", local_dir=str(work / "local"))
    ours = sessionize(timed.drop("ts"), key="user", timestamp="t", gap=f"{GAP_S} s",
                      backend=backend, name="quiet")  # fmt: skip
    queries = {}
    for name, out in (("spark session_window", builtin), ("sessionize", ours)):
        sink = Sink()
        query = (
            out.writeStream.trigger(processingTime=f"{args.trigger_ms} milliseconds")
            .option("checkpointLocation", str(work / f"ck-{len(queries)}"))
            .foreachBatch(sink).start()
        )  # fmt: skip
        query.processAllAvailable()
        queries[name] = (query, sink)
    write(source, 0, [{"user": f"u{i}", "ts": T0 + i} for i in range(args.keys)])
    for query, _ in queries.values():
        query.processAllAvailable()
    write(source, 1, [{"user": "late", "ts": T0 + 300_000}])
    for query, _ in queries.values():
        query.processAllAvailable()
    time.sleep(args.idle_s)
    rows = []
    for name, (query, sink) in queries.items():
        query.stop()
        progress = query.recentProgress
        last = max(p["batchId"] for p in progress if p["numInputRows"])
        data_end = next(
            _end(p) for p in progress if p["batchId"] == last and p["numInputRows"]
        )
        idle = {p["batchId"]: p for p in progress if p["batchId"] > last}
        idle_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in idle.values())
        closed = [t for t, n in sink.written if n >= args.keys]
        latency = (closed[0] - data_end) * 1000 if closed else float("nan")
        offsets = [p["durationMs"].get("latestOffset", 0) for p in progress
                   if p["batchId"] >= last and not p["numInputRows"]]  # fmt: skip
        rows.append([
            name, str(len(idle)), f"{idle_ms:.0f}", f"{latency:.0f}",
            f"{statistics.median(offsets) if offsets else 0:.0f}",
        ])  # fmt: skip
    return rows


def available_now_round(
    spark: Any, work: Path, args: argparse.Namespace, reverse: bool = False
) -> list[list[str]]:
    """One ``availableNow`` run per query over the same files (see the module doc),
    in the listed order or, with ``reverse``, the other way round."""
    from pyspark.sql import functions as F

    from spark_integration import StateBackend, sessionize
    from spark_integration.planning.due_batches import DUE_BATCHES_CONF

    source = work / "in"
    source.mkdir()
    for f in range(args.files):
        at = T0 + f * 300_000
        write(source, f, [{"user": f"u{i}", "ts": at + i} for i in range(args.keys)])
    rows = []
    names = ["spark session_window", "sessionize", "sessionize, no due source"]
    for name in reversed(names) if reverse else names:
        stream = (
            spark.readStream.schema("user string, ts long")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
        )
        timed = stream.withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "10 seconds")
        if name.startswith("spark"):
            out = timed.groupBy(F.session_window("t", f"{GAP_S} seconds"), "user").count()
        else:
            spark.conf.set(DUE_BATCHES_CONF, str("no due" not in name).lower())
            backend = StateBackend(f"file://{work}/state-{len(rows)}",
                                   local_dir=str(work / f"local-{len(rows)}"))  # fmt: skip
            out = sessionize(timed.drop("ts"), key="user", timestamp="t", gap=f"{GAP_S} s",
                             backend=backend, name="quiet")  # fmt: skip
        sink = Sink()
        began = time.perf_counter()
        query = (
            out.writeStream.trigger(availableNow=True)
            .option("checkpointLocation", str(work / f"ck-{len(rows)}"))
            .foreachBatch(sink).start()
        )  # fmt: skip
        query.awaitTermination()
        run_ms = (time.perf_counter() - began) * 1000
        spark.conf.unset(DUE_BATCHES_CONF)
        progress = query.recentProgress
        offsets = sum(p["durationMs"].get("latestOffset", 0) for p in progress)
        batches_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress)
        empty = sum(p["durationMs"].get("triggerExecution", 0)
                    for p in progress if not p["numInputRows"])  # fmt: skip
        rows.append([
            name, str(len(progress)), str(sum(n for _, n in sink.written)), f"{run_ms:.0f}",
            f"{batches_ms:.0f}", f"{offsets:.0f}", f"{empty:.0f}",
        ])  # fmt: skip
    return rows


def _end(progress: dict) -> float:
    """The wall clock (s) at which a progress record's batch ended."""
    from datetime import datetime

    start = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return start + progress["durationMs"].get("triggerExecution", 0) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--trigger-ms", type=int, default=1000)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--files", type=int, default=5)
    args = parser.parse_args()
    from spark_integration.conf.local_spark import local_spark

    spark = local_spark("bench-quiet", partitions=2)
    print(f"# quiet streams, {machine()}, trigger {args.trigger_ms} ms, idle {args.idle_s} s")
    try:
        for round_ in range(args.rounds):
            with scratch_dir("quiet-") as work:
                if args.available_now:
                    print_table(
                        f"availableNow over {args.files} files of {args.keys} sessions each",
                        ["query", "batches", "sessions written", "run (ms)", "batches (ms)",
                         "latestOffset, all batches (ms)", "batches without input (ms)"],
                        available_now_round(spark, Path(work), args, round_ % 2 == 1),
                    )  # fmt: skip
                    continue
                print_table(
                    f"{args.keys} sessions made due, then {args.idle_s:.0f} s without input",
                    ["query", "idle batches", "their time (ms)", "due -> written (ms)",
                     "latestOffset per idle trigger (ms)"],
                    one_round(spark, Path(work), args),
                )  # fmt: skip
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
