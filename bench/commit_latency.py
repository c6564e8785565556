"""Commit latency on S3 (a moto server on 127.0.0.1) with and without a commit arbiter.

A provider commits --versions versions of --keys keys each (the rows of
``bench/restore.py``); it prints the commit p50 / p99. ``arbiter`` lets an
in-process arbiter grant every claim, as the driver's coordinator does in a Spark
query (which adds its ~0.1-0.15 ms round trip, ``bench/trust_cost.py``); ``none``
has no arbiter (Spark Connect, or a coordinator that cannot be reached), so S3's
conditional create is the fence: the same one PUT, no look before it; ``look`` is
``none`` without the ``s3`` extra (boto3's import is blocked in this process), so
each commit looks before it writes (one HEAD). The first commit also imports boto3
and builds its client (once per process): it is printed apart, and p50 / p99 are
over the other commits. Run it on a checkout before and after a change to the commit path: ``old`` runs
without arbitration (a tree that has none).

Run: ``.venv/bin/python bench/commit_latency.py arbiter|none|look|old [--versions N] [--keys N]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.restore import SPECS, rows_for  # noqa: E402
from sessionstore import StateStoreProvider  # noqa: E402
from tests.object_stores import moto_s3_server, new_bucket  # noqa: E402


def main() -> None:
    """Commit ``--versions`` versions on S3 and print the latency p50 / p99."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["arbiter", "none", "look", "old"])
    ap.add_argument("--versions", type=int, default=40)
    ap.add_argument("--keys", type=int, default=10_000)
    args = ap.parse_args()
    if args.mode == "look":
        sys.modules["boto3"] = None  # type: ignore[assignment]  # the s3 extra not installed
    with moto_s3_server() as s3, tempfile.TemporaryDirectory() as local:
        uri = f"s3://{new_bucket(s3)}/ckpt"
        provider = StateStoreProvider(
            uri, "op", 0, SPECS, local, snapshot_interval=10, storage_options=s3
        )
        latencies = []
        for version in range(args.versions):
            handle = provider.get_store(version)
            if args.mode == "arbiter":
                handle.arbitrate(lambda version, commit, parent, supersede: commit)
            handle["sessions"].put_many(rows_for(version, args.keys))
            start = time.perf_counter()
            handle.commit()
            latencies.append(time.perf_counter() - start)
        provider.close()
    # the first commit of a process also opens the store's clients (boto3's import
    # and client: once per executor process): reported apart from the steady state
    p50, p99 = np.percentile(latencies[1:], [50, 99]) * 1000
    print(
        f"{args.mode}: S3 commit p50 / p99 ({args.keys:,} keys): {p50:.1f} / {p99:.1f} ms; "
        f"first commit {latencies[0] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
