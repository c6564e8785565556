"""Rescaling a checkpoint: ``sessionstore repartition`` (one process) against the
Spark job (``spark_integration.repartition_state``, local[2]).

A sessionize-style checkpoint of --sessions sessions over --keys string keys, at
--from partitions (each key in the partition Spark gives it), version 1 as a
snapshot, is repartitioned to --to partitions, once by each path, into a file
store. Both results are checked to hold every session.

Run: ``.venv/bin/python bench/repartition.py [--sessions 1000000] [--keys 200000]
[--from 8] [--to 16]`` (tiny check: ``--sessions 2000 --keys 500``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, print_table, scratch_dir  # noqa: E402
from sessionstore import StateStoreProvider, StoreSpec  # noqa: E402
from sessionstore.checkpoint.offline.repartition import repartition_checkpoint  # noqa: E402
from sessionstore.encoding.spark_hash import partition_ids  # noqa: E402

SPECS = [StoreSpec("sessions", "session", 10**12, segment_interval_ms=3_600_000)]


def build(uri: str, local: str, sessions: int, keys: int, partitions: int) -> None:
    names = [f"user-{i:07d}" for i in range(keys)]
    owner = partition_ids([names], ["string"], partitions).tolist()
    per_key = max(1, sessions // keys)
    for p in range(partitions):
        provider = StateStoreProvider(
            uri, "sessions", p, SPECS, local, snapshot_interval=1, num_partitions=partitions,
            key_types=["string"],
        )  # fmt: skip
        handle = provider.get_store(0)
        store = handle["sessions"]
        rows = [
            (name, j * 100_000, j * 100_000 + 5_000, {"count": j})
            for name, o in zip(names, owner, strict=True)
            if o == p
            for j in range(per_key)
        ]
        store.put_many(rows)
        handle.commit()
        provider.do_maintenance()
        provider.close()


def built_and_copied(tmp: str, args: argparse.Namespace) -> tuple[str, float, dict, float]:
    """The source checkpoint (``args.sessions`` over ``args.keys`` at ``args.source``
    partitions) under ``tmp`` and the offline copy of it at ``args.target``: its
    URI, the build's seconds, the copy's report and seconds."""
    uri = f"file://{tmp}/src"
    start = time.perf_counter()
    build(uri, f"{tmp}/local", args.sessions, args.keys, args.source)
    built = time.perf_counter() - start
    start = time.perf_counter()
    cli = repartition_checkpoint(uri, "sessions", args.target, f"file://{tmp}/cli")
    return uri, built, cli, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--from", dest="source", type=int, default=8)
    parser.add_argument("--to", dest="target", type=int, default=16)
    args = parser.parse_args()
    with scratch_dir("bench-repartition-") as tmp:
        uri, built, cli, cli_s = built_and_copied(tmp, args)

        from spark_integration import repartition_state
        from spark_integration.conf.local_spark import local_spark

        spark = local_spark("bench-repartition", partitions=args.target)
        try:
            start = time.perf_counter()
            job = repartition_state(spark, uri, "sessions", args.target, f"file://{tmp}/spark")
            spark_s = time.perf_counter() - start
        finally:
            spark.stop()
    assert cli["rows"] == job["rows"], (cli, job)
    rows = [
        ["sessionstore repartition (CLI)", f"{cli_s:.1f}", f"{cli['rows'] / cli_s:,.0f}"],
        ["repartition_state (Spark local[2])", f"{spark_s:.1f}", f"{job['rows'] / spark_s:,.0f}"],
    ]
    print(
        f"{args.sessions:,} sessions, {args.keys:,} keys, {args.source} -> {args.target} "
        f"partitions ({machine()}; building the checkpoint took {built:.1f} s)"
    )
    print_table("repartition", ["path", "seconds", "rows/s"], rows)


if __name__ == "__main__":
    main()
