"""Rescale on restart (the automatic path, a Spark job of the query's session)
against the offline ``sessionstore repartition`` (one process), on one checkpoint.

The sessionize-style checkpoint of bench/repartition.py (--sessions sessions over
--keys string keys at --from partitions, version 1 as a snapshot) is rescaled to
--to partitions, once offline into another location (a database per
partition), and once as a restarted query does it (into the databases a new
checkpoint of --to partitions gets on this machine), in place (``spark_integration.planning.rescale.rescale``, the
function planning calls: the copy into a new generation, the switch, the
deletion of the old state), on ``local[2]``. The Spark session's start is not
timed. Both results are checked to hold every row.

Run: ``.venv/bin/python bench/rescale.py [--sessions 1000000] [--keys 200000]
[--from 4] [--to 7]`` (tiny check: ``--sessions 2000 --keys 500``).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, print_table, scratch_dir  # noqa: E402
from bench.repartition import built_and_copied  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--from", dest="source", type=int, default=4)
    parser.add_argument("--to", dest="target", type=int, default=7)
    args = parser.parse_args()
    with scratch_dir("bench-rescale-") as tmp:
        uri, built, cli, cli_s = built_and_copied(tmp, args)

        from spark_integration import StateBackend
        from spark_integration.conf.local_spark import local_spark
        from spark_integration.conf.spark_session import default_parallelism
        from spark_integration.planning.rescale import rescale
        from spark_integration.planning.resolve import default_slabs

        spark = local_spark("bench-rescale", partitions=args.target)
        try:
            backend = StateBackend(uri, local_dir=f"{tmp}/local2")
            # as planning rescales a query restarted at --to partitions here: into
            # the databases a new checkpoint of that count gets on this machine
            slabs = default_slabs(args.target, default_parallelism(spark))
            auto = rescale(spark, backend, "sessions", slabs, args.target)
        finally:
            spark.stop()
    assert cli["rows"] == auto["rows"], (cli, auto)
    auto_s = auto["seconds"]
    rows = [
        ["sessionstore repartition (offline, CLI)", str(args.target), f"{cli_s:.1f}",
         f"{cli['rows'] / cli_s:,.0f}"],
        ["rescale on restart (Spark local[2])", str(auto["slabs"]), f"{auto_s:.1f}",
         f"{auto['rows'] / auto_s:,.0f}"],
    ]  # fmt: skip
    print(
        f"{args.sessions:,} sessions, {args.keys:,} keys, {args.source} -> {args.target} "
        f"partitions ({machine()}; building the checkpoint took {built:.1f} s)"
    )
    print_table("rescale", ["path", "databases written", "seconds", "rows/s"], rows)


if __name__ == "__main__":
    main()
