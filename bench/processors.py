"""StatefulProcessor throughput: Spark's transformWithState(InPandas) vs ours.

The same processor classes run under Spark's own operators (RocksDB state store
provider, every state call a round trip to the JVM) and under
``transform_with_state``/``transform_with_state_in_pandas`` (state in the Python
worker's RocksDB), for both APIs and two workloads:

* ``counter``: per key a count (ValueState), a dedup map of the items seen
  (MapState with a one-hour processing-time TTL) and the last five items
  (ListState); one output row per key and batch;
* ``lists``: per key a list that every event appends to (ListState), trimmed to
  its last 100 with ``put`` when it grows past 200; one row per key and batch.

Input: --events events (a comma-separated list runs each size in turn: the
ratio to Spark grows with the events per batch, because a query's fixed costs,
which every operator pays, are a smaller part of a larger batch) over --keys Zipf keys (s=1.1) and 1,000 items, written as
--batches Parquet files read one per micro-batch, local[2] with 4 partitions,
noop sink, and the floor (the same input, `repartition(4, "user")` and a
`mapInArrow` that only counts) in the same rounds; each query runs until it has processed every file
(``processAllAvailable``; for Spark in ProcessingTime mode, which always runs
another batch, until its progress shows the last file done). Wall time from
start, best of --rounds.

Run: ``.venv/bin/python bench/processors.py [--events N[,N...]] [--keys N] [--batches N]
[--rounds N] [--workloads counter,lists] [--apis rows,pandas]``.

``--profile`` runs no Spark: one partition's share of the same input (the users a
4-way split gives partition 0) goes batch by batch through the operator's own
task code (``ProcessorTask.process``, as ``ProcessorTester`` runs it) in this
process, and the CPU time per batch and a cProfile of batches 2 on (function
level, the task loop over those rows) are printed, per workload and API; first,
the CPU time of batches 2 on without the profiler, best of --rounds runs (CPU
time, not wall time: the figure to compare on a shared machine).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import pstats
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, print_table, scratch_dir, zipf_users  # noqa: E402
from bench.spark_sessionize import count_rows  # noqa: E402

PARTITIONS = 4
OUT = "user string, n long, extra long"


def input_batches(events: int, keys: int, batches: int) -> list:
    """The input, one Arrow table per micro-batch (the same for every run)."""
    import pyarrow as pa

    rng = np.random.default_rng(7)
    users = zipf_users(rng, events, keys)
    items = np.array([f"item-{i:04d}" for i in range(1000)], dtype=object)[
        rng.integers(0, 1000, size=events)
    ]
    per = events // batches
    return [
        pa.table({"user": users[b * per : (b + 1) * per].tolist(),
                  "item": items[b * per : (b + 1) * per].tolist()})
        for b in range(batches)
    ]  # fmt: skip


def write_input(folder: str, events: int, keys: int, batches: int) -> None:
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    for b, table in enumerate(input_batches(events, keys, batches)):
        path = os.path.join(folder, f"part-{b:04d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))


def processors():
    """The processor classes, built here so that Spark pickles them by value."""
    import pandas as pd
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor

    class Counter:
        def init(self, handle):
            self.count = handle.getValueState("count", "n long")
            self.seen = handle.getMapState("seen", "item string", "first long", 3_600_000)
            self.recent = handle.getListState("recent", "item string")

        def update(self, items):
            total = (self.count.get() or (0,))[0]
            new = 0
            for item in items:
                total += 1
                if not self.seen.containsKey((item,)):
                    self.seen.updateValue((item,), (total,))
                    new += 1
            self.count.update((total,))
            kept = [r[0] for r in self.recent.get()] + list(items)
            self.recent.put([(x,) for x in kept[-5:]])
            return total, new

        def close(self):
            pass

    class Lists:
        def init(self, handle):
            self.items = handle.getListState("items", "item string")

        def update(self, items):
            self.items.appendList([(x,) for x in items])
            kept = list(self.items.get())
            if len(kept) > 200:
                self.items.put(kept[-100:])
            return len(kept), len(items)

        def close(self):
            pass

    def pandas_flavour(base):
        class P(base, StatefulProcessor):
            def handleInputRows(self, key, rows, timerValues):
                items = [x for df in rows for x in df["item"].tolist()]
                n, extra = self.update(items)
                yield pd.DataFrame({"user": [key[0]], "n": [n], "extra": [extra]})

        return P

    def row_flavour(base):
        class R(base, StatefulProcessor):
            def handleInputRows(self, key, rows, timerValues):
                n, extra = self.update([r.item for r in rows])
                yield Row(user=key[0], n=n, extra=extra)

        return R

    return {
        ("counter", "pandas"): pandas_flavour(Counter),
        ("counter", "rows"): row_flavour(Counter),
        ("lists", "pandas"): pandas_flavour(Lists),
        ("lists", "rows"): row_flavour(Lists),
    }


def time_mode(workload: str) -> str:
    return "ProcessingTime" if workload == "counter" else "None"


def profile(args, classes) -> None:
    """``--profile``: the task loop over one partition's rows, without Spark (see
    the module doc)."""
    import pyarrow as pa

    tables = input_batches(int(args.events.split(",")[0]), args.keys, args.batches)
    # partition 0 of a 4-way split by user (a stable hash, not Spark's: the same
    # share of hot and cold keys)
    tables = [
        t.filter(
            pa.array([zlib.crc32(u.encode()) % PARTITIONS == 0 for u in t["user"].to_pylist()])
        )
        for t in tables
    ]
    for workload in args.workloads.split(","):
        for api in args.apis.split(","):
            mode = time_mode(workload)
            rows = sum(t.num_rows for t in tables[1:])
            unprofiled = min(
                sum(_run_batches(classes[(workload, api)], api, mode, tables)[1:])
                for _ in range(args.rounds)
            )
            print(f"\n### {workload}, {api}: CPU s of batches 2-{len(tables)} ({rows:,} rows) "
                  f"without the profiler, best of {args.rounds}: {unprofiled:.3f}")  # fmt: skip
            prof = cProfile.Profile()
            seconds = _run_batches(classes[(workload, api)], api, mode, tables, prof)
            print(f"\n### {workload}, {api}: {rows:,} rows in batches 2-{len(tables)}, CPU s per "
                  f"batch (unprofiled first, then profiled): {[round(x, 3) for x in seconds]}")  # fmt: skip
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def _run_batches(cls, api: str, mode: str, tables: list, prof=None) -> list[float]:
    """CPU seconds of each batch of ``tables`` through a ``ProcessorTester`` of
    ``cls``; ``prof`` (a cProfile) profiles batches 2 on."""
    from spark_integration.testing import ProcessorTester

    tester = ProcessorTester(cls(), OUT, time_mode=mode, key="user", api=api,
                             input_schema="user string, item string")  # fmt: skip
    seconds = []
    for b, table in enumerate(tables):
        if mode != "None":
            tester.set_processing_time(1_000_000 + b * 1_000)
        if b == 1 and prof is not None:
            prof.enable()
        start = time.process_time()
        tester.run(table)
        seconds.append(time.process_time() - start)
    if prof is not None:
        prof.disable()
    tester.close()
    return seconds


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", default="120000", help="events per run; a list runs each")
    ap.add_argument("--keys", type=int, default=5_000)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--workloads", default="counter,lists")
    ap.add_argument("--apis", default="rows,pandas")
    ap.add_argument("--profile", action="store_true", help="no Spark: profile the task loop")
    args = ap.parse_args(argv)
    classes = processors()
    if args.profile:
        profile(args, classes)
        return ""

    from spark_integration.conf.local_spark import local_spark

    spark = local_spark("sessionstore-bench", partitions=PARTITIONS, spark__driver__memory="4g")
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    with scratch_dir("bench-processors-") as tmp:
        rows = Runs(spark, tmp, args, classes).all()
    spark.stop()
    return print_table(
        f"StatefulProcessor, {args.keys:,} keys, {args.batches} batches ({machine()})",
        [
            "events",
            "workload",
            "API",
            "Spark s",
            "sessionstore s",
            "floor s",
            "speed-up",
            "ours vs floor",
            "events/s (ours)",
        ],  # fmt: skip
        rows,
    )


class Runs:
    """The timed queries: Spark's operator, ours and the floor, interleaved."""

    def __init__(self, spark, tmp: str, args, classes) -> None:
        self.spark, self.tmp, self.args, self.classes = spark, tmp, args, classes
        self.counter = 0
        self.source = ""

    def run(self, make, endless=False) -> float:
        """Seconds until the query has processed every file. Spark's
        ProcessingTime mode always runs another batch (processAllAvailable never
        returns): then the time until the progress shows the last file done."""
        self.counter += 1
        df = (
            self.spark.readStream.schema("user string, item string")
            .option("maxFilesPerTrigger", 1)
            .parquet(self.source)
        )
        t0 = time.perf_counter()
        query = (
            make(df).writeStream.format("noop").outputMode("update")
            .option("checkpointLocation", os.path.join(self.tmp, f"ck-{self.counter}"))
            .start()
        )  # fmt: skip
        if endless:
            while True:
                progress = query.lastProgress
                end = progress and progress["sources"][0]["endOffset"]
                end = json.loads(end) if isinstance(end, str) else end
                if end and end.get("logOffset", -1) >= self.args.batches - 1:
                    break
                if query.exception() is not None:
                    raise query.exception()
                time.sleep(0.02)
        else:
            query.processAllAvailable()
        elapsed = time.perf_counter() - t0
        query.stop()
        return elapsed

    @staticmethod
    def floor(df):
        # Spark's shuffle into the same partitions and the Arrow hand-off, no state
        return df.repartition(PARTITIONS, "user").mapInArrow(count_rows, "n long")

    def sparks(self, df, cls, api, mode):
        g = df.groupBy("user")
        method = g.transformWithStateInPandas if api == "pandas" else g.transformWithState
        return method(
            statefulProcessor=cls(), outputStructType=OUT, outputMode="Update", timeMode=mode,
        )  # fmt: skip

    def ours(self, df, cls, api, mode):
        from spark_integration import (
            StateBackend,
            transform_with_state,
            transform_with_state_in_pandas,
        )

        tmp, n = self.tmp, self.counter
        backend = StateBackend(f"file://{tmp}/state-{n}", local_dir=os.path.join(tmp, f"l-{n}"))
        fn = transform_with_state_in_pandas if api == "pandas" else transform_with_state
        return fn(df, "user", cls(), OUT, time_mode=mode, backend=backend,
                  num_partitions=PARTITIONS)  # fmt: skip

    def all(self) -> list[list[str]]:
        args, rows, first = self.args, [], True
        for workload, api, events in (
            (w, a, int(e))
            for e in args.events.split(",")
            for w in args.workloads.split(",")
            for a in args.apis.split(",")
        ):
            self.source = os.path.join(self.tmp, f"in-{events}")
            if not os.path.exists(self.source):
                write_input(self.source, events, args.keys, args.batches)
            cls, mode = self.classes[(workload, api)], time_mode(workload)
            theirs = functools.partial(self.sparks, cls=cls, api=api, mode=mode)
            ours = functools.partial(self.ours, cls=cls, api=api, mode=mode)
            if first:  # untimed: the JVM's first queries, the state servers' start
                self.run(self.floor)
                self.run(ours)
                first = False
            best_spark = best_ours = best_floor = float("inf")
            for _ in range(args.rounds):  # interleaved
                best_spark = min(best_spark, self.run(theirs, endless=mode == "ProcessingTime"))
                best_ours = min(best_ours, self.run(ours))
                best_floor = min(best_floor, self.run(self.floor))
            rows.append([
                f"{events:,}", workload, api, f"{best_spark:.1f}", f"{best_ours:.1f}",
                f"{best_floor:.1f}", f"{best_spark / best_ours:.1f}x",
                f"{best_ours / best_floor:.2f}x", f"{events / best_ours:,.0f}",
            ])  # fmt: skip
        return rows


if __name__ == "__main__":
    main()
