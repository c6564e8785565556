"""``make demo``: a PySpark streaming sessionization on sessionstore, then its state.

It writes a Zipf click stream (some clicks late and out of order) as JSON files,
one per micro-batch, runs ``sessionize`` over them as a Structured Streaming query
(local[2], RocksDB on local disk, changelogs and snapshots in a local folder that
stands in for object storage), prints the sessions the query emitted, and then
reads the operator's state back from the checkpoint, as a new executor would.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass

from sessionstore.checkpoint import StateStoreProvider
from sessionstore.checkpoint.partition.provider import recorded_partitions
from sessionstore.stores.spec import StoreSpec
from sessionstore.tools.cli import main as cli_main
from sessionstore.tools.demo import click_stream

GAP = "30 minutes"
GAP_MS = 30 * 60_000


def plan_changes(clicks, users, seed=7):
    """Plan changes per micro-batch: everyone starts free, some upgrade to pro."""
    rng = random.Random(seed)
    t0, t1 = min(c[1] for c in clicks), max(c[1] for c in clicks)
    changes = [(f"user-{i:04d}", t0 - 1, "free") for i in range(users)]
    changes += [
        (f"user-{i:04d}", t0 + rng.randrange(t1 - t0), "pro")
        for i in range(users)
        if rng.random() < 0.3
    ]
    return sorted(changes, key=lambda c: c[1])


def write_batches(clicks, folder, per_batch):
    os.makedirs(folder, exist_ok=True)
    paths = []
    for n, i in enumerate(range(0, len(clicks), per_batch)):
        path = os.path.join(folder, f"clicks-{n:04d}.json")
        with open(path, "w") as f:
            for user, ts, page in clicks[i : i + per_batch]:
                f.write(json.dumps({"user": user, "ts": ts, "page": page}) + "\n")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clicks", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--dir", default="demo-state")
    parser.add_argument(
        "--master", default=None,
        help="Spark master (default: spark-submit's --master, else local[2])",
    )  # fmt: skip
    parser.add_argument(
        "--interval", type=float, default=0.0, metavar="SECONDS",
        help="pause between micro-batches, as a stream whose files arrive over time",
    )  # fmt: skip
    parser.add_argument(
        "--output", default=None, metavar="FILE",
        help="also write the emitted sessions, the sessions left in state and the joined "
        "clicks (sorted) and the run's duration as JSON",
    )  # fmt: skip
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark conf, e.g. spark.sessionstore.checkpointUri=s3://bucket/demo",
    )
    args = parser.parse_args(argv)

    from spark_integration.conf.local_spark import local_spark

    conf = dict(item.split("=", 1) for item in args.conf)
    spark = local_spark(
        "sessionstore-demo",
        master=args.master,
        **{k.replace(".", "__"): v for k, v in conf.items()},
    )
    master = spark.sparkContext.master
    try:
        emitted, in_state, enriched, elapsed = run(
            spark, args.clicks, args.users, args.batches, args.dir, args.interval
        )
    finally:
        spark.stop()
    if args.output:

        def rows(items) -> list[str]:  # each as JSON text, sorted: comparable runs
            return sorted(json.dumps(item, sort_keys=True, default=str) for item in items)

        result = {
            "master": master,
            "clicks": args.clicks,
            "seconds": elapsed,
            "emitted": rows(emitted),
            "in_state": rows([w.key, w.start, w.end, acc] for part in in_state for w, acc in part),
            "enriched": rows(enriched),
        }
        with open(args.output, "w") as f:
            json.dump(result, f)


def run(spark, n_clicks: int, users: int, batches: int, out_dir: str, interval: float = 0.0):
    """Run the demo queries on ``spark`` (``interval`` seconds between micro-batches);
    print and return ``(emitted sessions, sessions in state per partition, clicks
    joined with their plan, seconds the micro-batches took)``."""
    from spark_integration.coordinator.metrics_listener import log_state_metrics

    shutil.rmtree(out_dir, ignore_errors=True)
    staging, source = os.path.join(out_dir, "staging"), os.path.join(out_dir, "clicks")
    plans_source = os.path.join(out_dir, "plans")
    clicks = click_stream(n_clicks, users)
    # sessions still open when the stream pauses stay in state (shown at the end)
    per_batch = -(-len(clicks) // batches)
    files = write_batches(clicks, staging, per_batch)
    backend = _backend(spark, out_dir)
    # one line per operator and micro-batch, from the tasks' observed state metrics
    # (before the operators are built: it turns their metrics on)
    listener = log_state_metrics(spark, print)
    emitted: list[dict] = []
    enriched: list[dict] = []
    queries = _start_queries(spark, backend, out_dir, source, plans_source, emitted, enriched)
    feed = _Feed(
        clicks, per_batch, plan_changes(clicks, users), files, staging, source, plans_source
    )
    elapsed = feed.run(queries, interval)
    for query in queries:
        query.stop()
    spark.streams.removeListener(listener)

    _print_results(clicks, users, len(files), emitted, enriched, elapsed)
    in_state = _print_state(backend, out_dir)
    _print_cli(backend)
    return emitted, in_state, enriched, elapsed


def _backend(spark, out_dir: str):
    """The conf's backend (e.g. S3 in docker/compose.yaml), else local folders."""
    from spark_integration import StateBackend
    from spark_integration.conf.backend import CONF_PREFIX

    if spark.conf.get(CONF_PREFIX + "checkpointUri", None):
        return StateBackend.from_conf(spark)
    return StateBackend(
        checkpoint_uri="file://" + os.path.abspath(os.path.join(out_dir, "object-store")),
        local_dir=os.path.abspath(os.path.join(out_dir, "local-rocksdb")),
        snapshot_interval=3,
    )


def _start_queries(spark, backend, out_dir, source, plans_source, emitted, enriched):
    """Start the two demo queries over the JSON files arriving in ``source`` and
    ``plans_source``: the sessions (collected into ``emitted``) and the clicks
    joined with the plan valid at each (into ``enriched``)."""
    from spark_integration import sessionize, temporal_join

    os.makedirs(source, exist_ok=True)
    os.makedirs(plans_source, exist_ok=True)
    stream = (
        spark.readStream.schema("user string, ts long, page string")
        .option("maxFilesPerTrigger", 1)
        .json(source)
    )
    sessions = sessionize(
        stream,
        key="user",
        timestamp="ts",
        gap=GAP,
        grace="1 hour",
        aggregations={"clicks": "count", "entry": ("first", "page"), "exit": ("last", "page")},
        emit="final",
        backend=backend,
        name="click_sessions",
    )
    plans = (
        spark.readStream.schema("user string, plan_ts long, plan string")
        .option("maxFilesPerTrigger", 1)
        .json(plans_source)
    )
    enriched_stream = temporal_join(
        stream.select("user", "ts", "page"), plans, key="user", stream_timestamp="ts",
        table_timestamp="plan_ts", history_retention="1 day", how="left",
        backend=backend, name="clicks_with_plan",
    )  # fmt: skip
    return [
        sessions.writeStream.outputMode("append")
        .option("checkpointLocation", os.path.join(out_dir, "spark-checkpoint", "sessions"))
        .foreachBatch(lambda batch, _: emitted.extend(r.asDict() for r in batch.collect()))
        .start(),
        enriched_stream.writeStream.outputMode("append")
        .option("checkpointLocation", os.path.join(out_dir, "spark-checkpoint", "enriched"))
        .foreachBatch(lambda batch, _: enriched.extend(r.asDict() for r in batch.collect()))
        .start(),
    ]


@dataclass
class _Feed:
    """The demo's input, one clicks file and one plans file per micro-batch, moved
    into the folders the queries read."""

    clicks: list
    per_batch: int
    changes: list
    files: list[str]
    staging: str
    source: str
    plans_source: str

    def run(self, queries: list, interval: float) -> float:
        """Feed every micro-batch to ``queries`` (``interval`` seconds apart) and
        wait for each; the seconds the micro-batches took."""
        started = time.perf_counter()
        ends = self._batch_ends()
        for n, path in enumerate(self.files):
            if n and interval:
                time.sleep(interval)
            self._write_plans(n, ends[n - 1] if n else None, ends[n])
            # the join takes the plan changes in before the clicks they precede arrive:
            # its two sources are listed independently, so otherwise a micro-batch may
            # take a clicks file before the plans file written just ahead of it
            queries[1].processAllAvailable()
            os.replace(path, os.path.join(self.source, os.path.basename(path)))
            for query in queries:
                query.processAllAvailable()
        return time.perf_counter() - started - interval * (len(self.files) - 1)

    def _batch_ends(self) -> list[int]:
        """The last click time of each micro-batch: a plan change travels in the
        micro-batch whose clicks cover its time (the last takes the rest)."""
        n_clicks = len(self.clicks)
        ends = [
            self.clicks[min(n_clicks, (n + 1) * self.per_batch) - 1][1]
            for n in range(len(self.files))
        ]
        ends[-1] = max(ends[-1], self.changes[-1][1])
        return ends

    def _write_plans(self, n: int, lower: int | None, upper: int) -> None:
        """The plans file of micro-batch ``n``: the changes in ``(lower, upper]``."""
        batch_changes = [
            c for c in self.changes if (lower is None or c[1] > lower) and c[1] <= upper
        ]
        # written aside, then moved in: the running query must never list a file
        # still being written (it would read it empty and never again)
        staged = os.path.join(self.staging, f"plans-{n:04d}.json")
        with open(staged, "w") as f:
            for user, plan_ts, plan in batch_changes:
                f.write(json.dumps({"user": user, "plan_ts": plan_ts, "plan": plan}) + "\n")
        os.replace(staged, os.path.join(self.plans_source, os.path.basename(staged)))


def _print_results(clicks, users, n_files, emitted, enriched, elapsed) -> None:
    """The run's summary, the sessions of the user with the most, and the clicks of
    one user around their upgrade with the plan valid at each."""
    print(
        f"\nsummary: {len(clicks):,} events, {len(emitted):,} sessions closed, "
        f"{len(enriched):,} clicks joined with their plan, {n_files} micro-batches, "
        f"{elapsed:.1f} s"
    )
    print(f"\n{len(clicks):,} clicks from {users} users in {n_files} micro-batches")
    print(f"{len(emitted):,} sessions emitted (gap {GAP}, emit on close)\n")
    user, count = Counter(r["user"] for r in emitted).most_common(1)[0]
    print(f"{user}, the user with the most sessions ({count}), first five:")
    mine = sorted((r for r in emitted if r["user"] == user), key=lambda r: r["session_start"])
    for r in mine[:5]:
        minutes = (r["session_end"] - r["session_start"]) / 60_000
        print(
            f"  start={r['session_start']}  end={r['session_end']}  ({minutes:5.1f} min)  "
            f"clicks={r['clicks']:3d}  entry={r['entry']:9s} exit={r['exit']}"
        )
    upgraded = sorted({r["user"] for r in enriched if r["plan"] == "pro"})
    if upgraded:
        who = upgraded[0]
        print(f"\nclicks of {who} with the plan valid at each click (temporal join):")
        theirs = sorted((r["ts"], r["plan"]) for r in enriched if r["user"] == who)
        switch = next(i for i, (_, plan) in enumerate(theirs) if plan == "pro")
        for ts, plan in theirs[max(0, switch - 2) : switch + 2]:
            print(f"  {ts}  plan={plan}")


def _print_state(backend, out_dir: str) -> list:
    """Print and return the sessions in state of each database (a slab of the
    operator's partitions: docs/configuration.md), read back from the checkpoint
    as a new executor would."""
    print("\nState, read back from the checkpoint as a new executor would:")
    spec = StoreSpec("sessions", "session", GAP_MS + 3_600_000 + 1)
    in_state = []
    partitions = recorded_partitions(
        backend.checkpoint_uri, "click_sessions", backend.storage_options
    )
    for partition in range(partitions or 0):
        provider = StateStoreProvider(
            backend.checkpoint_uri, "click_sessions", partition, [spec],
            os.path.join(out_dir, "inspect"), storage_options=backend.storage_options,
        )  # fmt: skip
        version = provider.latest_version()
        handle = provider.get_store(version)
        store = handle["sessions"]
        stored = list(store.fetch_range(None, None))
        in_state.append(stored)
        print(
            f"  database {partition}: version {version} (versions {provider.list_versions()}), "
            f"{len(stored):,} sessions in state (open, or closed and still retained), "
            f"segments {store.segment_ids()}, stream time {store.observed_stream_time}"
        )
        for window, acc in sorted(stored, key=lambda s: -s[1][0])[:2]:
            print(f"    {window.key}  [{window.start}, {window.end}]  clicks={acc[0]}")
        handle.abort()
        provider.close()
    return in_state


def _print_cli(backend) -> None:
    """The checkpoint and the live databases as the ``sessionstore`` CLI shows them."""
    print(f"\n$ sessionstore ls {backend.checkpoint_uri}")
    ls_args = ["ls", backend.checkpoint_uri]
    ls_args += [f"--storage-option={k}={v}" for k, v in backend.storage_options.items()]
    cli_main(ls_args)
    # the executors' live databases, read without stopping or locking them (where
    # they are on this machine: on a cluster each executor keeps its own)
    if backend.local_dir and os.path.isdir(backend.local_dir):
        print(f"\n$ sessionstore dump {backend.local_dir} --operator click_sessions "
              "--store sessions --format table --limit 5")  # fmt: skip
        cli_main(["dump", backend.local_dir, "--operator", "click_sessions", "--store",
                  "sessions", "--format", "table", "--limit", "5"])  # fmt: skip
    # per micro-batch and operator, from the changelog headers the tasks wrote
    print(f"\n$ sessionstore stats {backend.checkpoint_uri}")
    stats_args = ["stats", backend.checkpoint_uri]
    stats_args += [f"--storage-option={k}={v}" for k, v in backend.storage_options.items()]
    cli_main(stats_args)


if __name__ == "__main__":
    main()
