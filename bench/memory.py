"""Native memory of one Python worker holding many partition databases.

A child process (so that its RSS is its own) opens --dbs session-store databases and
writes --sessions sessions into each over --batches micro-batches, the way a Spark
worker sees them: every batch writes a share of every database's sessions, then
reads a sample back (one key in 100). Measured: the child's peak RSS over its RSS
before the first open, once with the memory budget (--budget MiB, the
``spark.sessionstore.memory.maxMB`` of a worker) and once with a budget too large
to bind (100,000 MiB: every database keeps what it fills, as before the budget
existed), in the same run. The unbounded run holds at most --unbounded-dbs databases
(its memory grows with each one; the figure per database is printed too), so that it
fits the machine. The bound it is checked against is the budget plus the fixed
overhead documented in docs/internals.md ("Memory"): 1 MiB per open database and
32 MiB per process.

Run: ``.venv/bin/python bench/memory.py [--dbs 200] [--sessions 300000] [--budget 256]``
(about 60M writes at full size: several minutes); ``--dbs 4 --sessions 2000`` checks
that it works.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, print_table, scratch_dir  # noqa: E402

UNBOUNDED_MB = 100_000
OVERHEAD_PER_DATABASE_MB = 1
OVERHEAD_PER_PROCESS_MB = 32

WORKER = textwrap.dedent(
    """
    import json, os, sys
    from sessionstore import StateDB
    from sessionstore.engine.memory import memory_budget

    def rss_mb():
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    root, n_dbs, n_sessions, n_batches, budget = sys.argv[1], *map(int, sys.argv[2:])
    start, _ = rss_mb()
    dbs = [StateDB.open(os.path.join(root, str(i)), memory_max_mb=budget) for i in range(n_dbs)]
    stores = [
        db.session_store("sessions", retention_ms=10**12, segment_interval_ms=3_600_000)
        for db in dbs
    ]
    per_batch = -(-n_sessions // n_batches)
    for b in range(n_batches):
        lo, hi = b * per_batch, min((b + 1) * per_batch, n_sessions)
        for db, store in zip(dbs, stores):
            with db.batch():
                store.put_many(
                    (f"user-{k:09d}", 1_700_000_000_000 + k, 1_700_000_060_000 + k, [k, "page"])
                    for k in range(lo, hi)
                )
            for k in range(lo, hi, 100):
                next(iter(store.fetch(f"user-{k:09d}")))
    now, peak = rss_mb()
    print(json.dumps({
        "growth": peak - start, "cache": memory_budget().usage() / 2**20,
        "files": sum(len([f for f in os.listdir(db.path) if f.endswith(".sst")]) for db in dbs),
    }))
    """
)


def run(root: str, dbs: int, sessions: int, batches: int, budget: int) -> dict[str, float]:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", WORKER, root, str(dbs), str(sessions), str(batches), str(budget)],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))},
    )  # fmt: skip
    return {**json.loads(out.stdout), "seconds": time.perf_counter() - t0}


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dbs", type=int, default=200)
    ap.add_argument("--sessions", type=int, default=300_000, help="per database")
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--budget", type=int, default=256, help="MiB per worker")
    ap.add_argument("--unbounded-dbs", type=int, default=40)
    args = ap.parse_args(argv)
    print(f"# {machine()}", flush=True)
    with scratch_dir("ss-bench-memory-") as root:
        bounded = run(os.path.join(root, "b"), args.dbs, args.sessions, args.batches, args.budget)
        n_unbounded = min(args.dbs, args.unbounded_dbs)
        unbounded = run(
            os.path.join(root, "u"), n_unbounded, args.sessions, args.batches, UNBOUNDED_MB
        )
    bound = args.budget + args.dbs * OVERHEAD_PER_DATABASE_MB + OVERHEAD_PER_PROCESS_MB
    rows = [
        [
            f"{args.budget} MiB", str(args.dbs), f"{args.sessions:,}",
            f"{bounded['growth']:.0f} MiB", f"{bound} MiB",
            f"{bounded['cache']:.0f} MiB", str(bounded["files"]), f"{bounded['seconds']:.0f} s",
        ],
        [
            "none", str(n_unbounded), f"{args.sessions:,}",
            f"{unbounded['growth']:.0f} MiB ({unbounded['growth'] / n_unbounded:.1f} per db)",
            "-", f"{unbounded['cache']:.0f} MiB", str(unbounded["files"]),
            f"{unbounded['seconds']:.0f} s",
        ],
    ]  # fmt: skip
    verdict = "within" if bounded["growth"] <= bound else "OVER"
    text = print_table(
        "Worker memory, many partition databases (bench/memory.py)",
        [
            "budget",
            "databases",
            "sessions each",
            "peak RSS growth",
            "bound",
            "cache at end",
            "SST files",
            "time",
        ],  # fmt: skip
        rows,
    )
    print(f"bounded run {verdict} budget + documented overhead ({bound} MiB)")
    return text


if __name__ == "__main__":
    main()
