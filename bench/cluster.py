"""The demo's job on a Spark standalone cluster against the same job in local[2].

The same input (``--clicks`` Zipf clicks in ``--batches`` files, one per
micro-batch), the same shipped wheel (a packed virtualenv, as ``make
cluster-test`` ships it), state on a moto S3 endpoint, in one run: first
``spark-submit --master local[2]``, then ``--master spark://...`` on a master and
two workers of 1 core each (2 cores in all either way). Each run is repeated
``--rounds`` times, alternating; the figure is clicks per second of micro-batch
time (the demo's own clock, from the first micro-batch to the last; JVM and
executor start-up excluded). The outputs of each pair of runs are compared.

Run: ``make bench-cluster`` or
``.venv/bin/python bench/cluster.py --wheel dist/sessionstore-0.1.0-py3-none-any.whl``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, print_table  # noqa: E402
from tests.object_stores import moto_s3_server, new_bucket  # noqa: E402
from tests.packaging import build_dist, clean_env  # noqa: E402
from tests.standalone.check import demo_submit_args, run_demo, ship  # noqa: E402
from tests.standalone.cluster import standalone  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, default=None, help="default: build one")
    parser.add_argument("--clicks", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sessionstore-bench-cluster-") as tmp:
        workdir = Path(tmp)
        wheel = args.wheel or build_dist(workdir / "dist")[1]
        env = ship(wheel.resolve(), workdir)
        rates: dict[str, list[float]] = {"local[2]": [], "standalone, 2 workers x 1 core": []}
        with moto_s3_server() as s3, standalone(workdir / "cluster", clean_env()) as cluster:
            bucket = new_bucket(s3)
            for round_ in range(args.rounds):
                results = {}
                for label, is_cluster in zip(rates, (False, True), strict=True):
                    name = f"{'cluster' if is_cluster else 'local'}-{round_}"
                    output = workdir / f"{name}.json"
                    local_dir = "sessionstore-local" if is_cluster else str(workdir / f"{name}-db")
                    submit = demo_submit_args(
                        env, f"s3://{bucket}/{name}", s3, local_dir, workdir / f"{name}-demo",
                        output, args.clicks, args.batches, 0.0, is_cluster,
                    )  # fmt: skip
                    run = run_demo(
                        cluster, submit, workdir / f"{name}.log", output,
                        master=None if is_cluster else "local[2]", timeout=3600,
                    )  # fmt: skip
                    if run.returncode != 0 or run.result is None:
                        sys.exit(f"{label} run failed; log:\n{run.log[-3000:]}")
                    results[label] = run.result
                    rates[label].append(args.clicks / run.result["seconds"])
                    print(f"round {round_} {label}: {rates[label][-1]:,.0f} clicks/s", flush=True)
                first, second = results.values()
                for part in ("emitted", "in_state", "enriched"):
                    if first[part] != second[part]:
                        sys.exit(f"round {round_}: the runs' {part} differ")
    rows = [
        [label, f"{statistics.median(r):,.0f}", f"{min(r):,.0f}-{max(r):,.0f}"]
        for label, r in rates.items()
    ]
    local, remote = (statistics.median(r) for r in rates.values())
    print_table(
        f"demo job, {args.clicks:,} clicks in {args.batches} micro-batches, "
        f"{args.rounds} rounds ({machine()}); cluster/local = {remote / local:.2f}",
        ["master", "clicks/s (median)", "range"], rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
