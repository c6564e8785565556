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
import shutil
from collections import Counter

from sessionstore.checkpoint import StateStoreProvider, StoreSpec
from sessionstore.demo import click_stream

GAP = "30 minutes"
GAP_MS = 30 * 60_000


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
    parser.add_argument("--dir", default="demo-output/spark")
    parser.add_argument("--master", default=None, help="Spark master (default local[2])")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark conf, e.g. spark.sessionstore.checkpointUri=s3://bucket/demo",
    )
    args = parser.parse_args(argv)

    from spark_integration.local import local_spark

    conf = dict(item.split("=", 1) for item in args.conf)
    spark = local_spark(
        "sessionstore-demo",
        master=args.master,
        **{k.replace(".", "__"): v for k, v in conf.items()},
    )
    try:
        run(spark, args.clicks, args.users, args.batches, args.dir)
    finally:
        spark.stop()


def run(spark, n_clicks: int, users: int, batches: int, out_dir: str):
    """Run the demo query on ``spark``; print and return ``(emitted rows, sessions in
    state per partition)``."""
    from spark_integration import StateBackend, sessionize
    from spark_integration.backend import CONF_PREFIX

    shutil.rmtree(out_dir, ignore_errors=True)
    staging, source = os.path.join(out_dir, "staging"), os.path.join(out_dir, "clicks")
    clicks = click_stream(n_clicks, users)
    # sessions still open when the stream pauses stay in state (shown at the end)
    files = write_batches(clicks, staging, -(-len(clicks) // batches))
    if spark.conf.get(CONF_PREFIX + "checkpointUri", None):
        backend = StateBackend.from_conf(spark)  # e.g. S3 in docker/compose.yaml
    else:
        backend = StateBackend(
            checkpoint_uri="file://" + os.path.abspath(os.path.join(out_dir, "object-store")),
            local_dir=os.path.abspath(os.path.join(out_dir, "local-rocksdb")),
            snapshot_interval=3,
        )
    os.makedirs(source, exist_ok=True)
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
    emitted: list[dict] = []
    query = (
        sessions.writeStream.outputMode("append")
        .option("checkpointLocation", os.path.join(out_dir, "spark-checkpoint"))
        .foreachBatch(lambda batch, _: emitted.extend(r.asDict() for r in batch.collect()))
        .start()
    )
    for path in files:  # one file per micro-batch, in order
        os.replace(path, os.path.join(source, os.path.basename(path)))
        query.processAllAvailable()
    query.stop()

    print(f"\n{len(clicks):,} clicks from {users} users in {len(files)} micro-batches")
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

    print("\nState, read back from the checkpoint as a new executor would:")
    spec = StoreSpec("sessions", "session", GAP_MS + 3_600_000 + 1)
    in_state = []
    for partition in range(2):
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
            f"  partition {partition}: version {version} (versions {provider.list_versions()}), "
            f"{len(stored):,} sessions in state (open, or closed and still retained), "
            f"segments {store.segment_ids()}, stream time {store.observed_stream_time}"
        )
        for window, acc in sorted(stored, key=lambda s: -s[1][0])[:2]:
            print(f"    {window.key}  [{window.start}, {window.end}]  clicks={acc[0]}")
        handle.abort()
        provider.close()
    return emitted, in_state


if __name__ == "__main__":
    main()
