"""Erasing keys from a checkpoint: ``sessionstore erase`` of --erase keys from the
sessionize-style checkpoint of bench/repartition.py (--sessions sessions over --keys
string keys at --partitions partitions, version 1 as a snapshot).

The erase reads every partition once and writes each one's new database and
snapshot, so its time depends on the state's size, not on the number of keys; the
result is checked to hold every session but the erased keys'.

Run: ``.venv/bin/python bench/erase.py [--sessions 1000000] [--keys 200000]
[--partitions 8] [--erase 1000]`` (tiny check: ``--sessions 2000 --keys 500 --erase 10``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, print_table, scratch_dir  # noqa: E402
from bench.repartition import build  # noqa: E402
from sessionstore import erase  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--erase", type=int, default=1_000)
    args = parser.parse_args()
    with scratch_dir("bench-erase-") as tmp:
        uri = f"file://{tmp}/ckpt"
        start = time.perf_counter()
        build(uri, f"{tmp}/local", args.sessions, args.keys, args.partitions)
        built = time.perf_counter() - start
        step = max(1, args.keys // args.erase)
        keys = [f"user-{i:07d}" for i in range(0, args.keys, step)][: args.erase]
        start = time.perf_counter()
        done = erase(uri, "sessions", key=keys, quiet_s=0)
        erase_s = time.perf_counter() - start
    per_key = max(1, args.sessions // args.keys)
    assert done["rows"]["sessions"] == len(keys) * per_key, done
    print(
        f"{args.sessions:,} sessions, {args.keys:,} keys, {args.partitions} partitions "
        f"({machine()}; building the checkpoint took {built:.1f} s)"
    )
    print_table(
        "erase",
        ["keys erased", "sessions erased", "seconds", "sessions kept/s"],
        [[f"{len(keys):,}", f"{done['rows']['sessions']:,}", f"{erase_s:.1f}",
          f"{(args.sessions - done['rows']['sessions']) / erase_s:,.0f}"]],
    )  # fmt: skip


if __name__ == "__main__":
    main()
