"""End-to-end throughput on Spark: built-in session_window vs sessionize vs the floor.

Workload: --events events over --keys Zipf-distributed keys (s=1.1), written as
--batches Parquet files; each query reads one file per micro-batch, with
``trigger(availableNow=True)``, on local[2] with 4 shuffle partitions, and writes
to the noop sink. Event times advance ~10 ms per event; gap 60 s.

1. Spark's built-in ``session_window`` count, with the RocksDB state store provider
   and changelog checkpointing (watermark 60 s, append mode).
2. ``sessionize`` with a count (emit on close), state checkpointed to ``file://``.
3. The floor: ``repartition(4, key)`` + ``mapInArrow`` that only counts rows, the
   cost Spark itself imposes on this architecture.

With ``--floor-parts`` it also splits the floor into its steps (the plain read to
the noop sink, the shuffle, the Python hop) and times it with larger Arrow batches,
to show what in the floor could be lowered. With ``--s3`` it also runs
``sessionize`` with its checkpoint on S3 (a moto server on 127.0.0.1, which shares
the machine's 2 cores). With ``--update`` it also runs ``sessionize(emit="update")``
in update output mode (Spark's ``session_window`` has no update mode) and prints the
rows it emits per input event (the sink's ``numOutputRows`` in the query progress).
With ``--aggregates`` the input also has an ``amount`` (double) and a ``page``
(string, 50 values) column, and both paths also run the aggregates Spark users
write, in the same run: ``{"n": "count", "avg": ("avg", "amount"), "sd":
("stddev", "amount"), "users": ("approx_count_distinct", "page")}`` against
``count("*"), avg, stddev, approx_count_distinct`` on the built-in path.

Each case runs once per round, in the listed order in even rounds and in reverse in
odd ones; the best of ``--rounds`` counts.

Run: ``.venv/bin/python bench/spark_sessionize.py [--events N] [--keys N] [--batches N]
[--rounds N] [--floor-parts] [--s3] [--update] [--aggregates]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, print_table, scratch_dir, zipf_users  # noqa: E402

PARTITIONS = 4


#: The aggregates of ``--aggregates``, as sessionize spells them.
AGGREGATES = {
    "n": "count",
    "avg": ("avg", "amount"),
    "sd": ("stddev", "amount"),
    "users": ("approx_count_distinct", "page"),
}


def write_input(folder, events, keys, batches, values=False):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(5)
    names = zipf_users(rng, events, keys)
    ts = 1_700_000_000_000 + np.cumsum(rng.integers(0, 20, size=events))
    if values:
        amounts = np.round(rng.gamma(2.0, 20.0, size=events), 2)
        pages = rng.integers(0, 50, size=events)
    os.makedirs(folder, exist_ok=True)
    per = events // batches
    for b in range(batches):
        sl = slice(b * per, (b + 1) * per)
        table = pa.table(
            {
                "user": pa.array(names[sl].tolist()),
                "ts": pa.array(ts[sl] * 1000, pa.timestamp("us")),
            }
        )
        if values:
            table = table.append_column("amount", pa.array(amounts[sl], pa.float64()))
            table = table.append_column(
                "page", pa.array([f"/p{p}" for p in pages[sl].tolist()], pa.string())
            )
        path = os.path.join(folder, f"part-{b:04d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))


def count_rows(batches):
    import pyarrow as pa

    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})


def timed(query_factory):
    """Seconds until the query ends, and the rows its sink received."""
    t0 = time.perf_counter()
    query = query_factory()
    query.awaitTermination()
    elapsed = time.perf_counter() - t0
    return elapsed, sum(max(p["sink"].get("numOutputRows", 0), 0) for p in query.recentProgress)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--floor-parts", action="store_true", help="also split the floor's cost")
    ap.add_argument("--s3", action="store_true", help="also checkpoint sessionize to S3 (moto)")
    ap.add_argument("--update", action="store_true", help="also run both in update mode")
    ap.add_argument(
        "--aggregates", action="store_true", help="also avg, stddev, approx_count_distinct"
    )
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best counts")
    args = ap.parse_args(argv)
    from pyspark.sql import functions as F

    from spark_integration import StateBackend, sessionize
    from spark_integration.conf.local_spark import local_spark

    spark = local_spark("sessionstore-bench", partitions=PARTITIONS, spark__driver__memory="4g")
    rows = []
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(scratch_dir("bench-spark-"))
        if args.s3:
            from tests.object_stores import moto_s3_server, new_bucket

            s3 = stack.enter_context(moto_s3_server())
            bucket = new_bucket(s3)
        source = os.path.join(tmp, "in")
        write_input(source, args.events, args.keys, args.batches, args.aggregates)
        schema = "user string, ts timestamp"
        if args.aggregates:
            schema += ", amount double, page string"

        def stream():
            return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source)

        def noop(out, name, mode="append"):
            return (
                out.writeStream.format("noop").outputMode(mode)
                .option("checkpointLocation", os.path.join(tmp, f"ck-{name}"))
                .trigger(availableNow=True).start()
            )  # fmt: skip

        def builtin(run, aggregates=False):
            spark.conf.set(
                "spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
            )
            spark.conf.set(
                "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true"
            )
            grouped = (
                stream()
                .withWatermark("ts", "60 seconds")
                .groupBy(F.session_window("ts", "60 seconds"), "user")
            )
            if not aggregates:
                return noop(grouped.count(), f"builtin-{run}")
            out = grouped.agg(
                F.count("*").alias("n"), F.avg("amount").alias("avg"),
                F.stddev("amount").alias("sd"), F.approx_count_distinct("page").alias("users"),
            )  # fmt: skip
            return noop(out, f"builtin-aggs-{run}")

        def ours(run, on_s3=False, emit="final", aggregates=False):
            if on_s3:
                run = f"s3-{run}"
            if emit == "update":
                run = f"update-{run}"
            if aggregates:
                run = f"aggs-{run}"
            backend = StateBackend(
                f"s3://{bucket}/state-{run}" if on_s3 else f"file://{tmp}/state-{run}",
                local_dir=os.path.join(tmp, f"local-{run}"),
                storage_options=dict(s3) if on_s3 else {},
            )
            out = sessionize(
                stream(), key="user", timestamp="ts", gap="60 seconds",
                aggregations=AGGREGATES if aggregates else {"count": "count"}, emit=emit,
                backend=backend,
                num_partitions=PARTITIONS,
            )  # fmt: skip
            return noop(out, f"ours-{run}", "update" if emit == "update" else "append")

        def floor(run):
            out = stream().repartition(PARTITIONS, "user").mapInArrow(count_rows, "n long")
            return noop(out, f"floor-{run}")

        def floor_big_batches(run):
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
            try:
                return floor(f"big-{run}")
            finally:  # the conf is read when the query is planned, at start()
                spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

        cases = [("floor", floor), ("builtin", builtin), ("ours", ours)]
        if args.s3:
            cases.append(("ours_s3", lambda r: ours(r, on_s3=True)))
        if args.update:
            cases.append(("ours_update", lambda r: ours(r, emit="update")))
        if args.aggregates:
            cases.append(("builtin_aggs", lambda r: builtin(r, aggregates=True)))
            cases.append(("ours_aggs", lambda r: ours(r, aggregates=True)))
        if args.floor_parts:
            cases += [
                ("read", lambda r: noop(stream(), f"read-{r}")),
                ("shuffle", lambda r: noop(stream().repartition(PARTITIONS, "user"), f"sh-{r}")),
                ("hop", lambda r: noop(stream().mapInArrow(count_rows, "n long"), f"hop-{r}")),
                ("floor_big", floor_big_batches),
            ]
        # best of --rounds interleaved rounds, each query on a fresh checkpoint; odd
        # rounds run the cases in reverse order, so that no pipeline always follows
        # the same one (a built-in query leaves its RocksDB instances and garbage in
        # the JVM for whatever runs next)
        times: dict[str, float] = {}
        out_rows: dict[str, int] = {}
        for round_ in range(args.rounds):
            for name, fn in cases if round_ % 2 == 0 else cases[::-1]:
                elapsed, out_rows[name] = timed(lambda fn=fn, r=round_: fn(f"{r}"))
                times[name] = min(times.get(name, elapsed), elapsed)
                print(f"round {round_} {name}: {elapsed:.2f} s", file=sys.stderr)
    spark.stop()
    n = args.events
    pipelines = [
        ("Spark session_window + RocksDB provider (changelog)", "builtin"),
        ("sessionize (sessionstore, file:// checkpoint)", "ours"),
        ("floor: repartition + mapInArrow counting rows", "floor"),
    ]
    if args.s3:
        pipelines.insert(2, ("sessionize, s3:// checkpoint (moto on 127.0.0.1)", "ours_s3"))
    if args.update:
        pipelines.insert(-1, ('sessionize emit="update", update mode', "ours_update"))
    for label, name in pipelines:
        rows.append(
            [
                label,
                f"{times[name]:.1f} s",
                f"{n / times[name]:,.0f}",
                f"{times['builtin'] / times[name]:.2f}x",
            ]
        )
    if args.floor_parts:
        parts = [
            ["plain read to the noop sink", times["read"], None],
            ["read + repartition(4, user)", times["shuffle"], times["shuffle"] - times["read"]],
            ["read + mapInArrow count (no shuffle)", times["hop"], times["hop"] - times["read"]],
            ["floor (read + repartition + mapInArrow)", times["floor"], None],
            ["floor, maxRecordsPerBatch=100000", times["floor_big"], None],
        ]
        print_table(
            f"Where the floor's time goes, same run ({n:,} events)",
            ["pipeline", "time", "added to the plain read", "built-in / this"],
            [
                [
                    label,
                    f"{t:.2f} s",
                    "" if extra is None else f"+{extra:.2f} s",
                    f"{times['builtin'] / t:.2f}x",
                ]
                for label, t, extra in parts
            ],
        )
    if args.aggregates:
        print_table(
            f"count, avg, stddev and approx_count_distinct per session, same run ({n:,} "
            f"events, {PARTITIONS} partitions)",
            ["pipeline", "time", "events/s", "speed vs built-in"],
            [
                [label, f"{times[name]:.1f} s", f"{n / times[name]:,.0f}",
                 f"{times['builtin_aggs'] / times[name]:.2f}x"]
                for label, name in [
                    ("Spark session_window + the same aggregates (RocksDB provider)",
                     "builtin_aggs"),
                    ("sessionize with the same aggregates", "ours_aggs"),
                ]
            ],
        )  # fmt: skip
    if args.update:
        print_table(
            f"Rows emitted per input event in update mode, same run ({n:,} events)",
            ["pipeline", "rows", "rows per event"],
            [
                [label, f"{out_rows[name]:,}", f"{out_rows[name] / n:.3f}"]
                for label, name in pipelines
                if name.endswith("_update")
            ],
        )
    return print_table(
        f"Spark sessionization, {n:,} events, {args.keys:,} Zipf keys, {args.batches} micro-batches, "
        f"local[2], {PARTITIONS} partitions ({machine()})",
        ["pipeline", "time", "events/s", "speed vs built-in"],
        rows,
    )


if __name__ == "__main__":
    main()
