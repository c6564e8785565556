"""Peak memory of restoring one large partition under a small memory budget.

A session store gets --sessions sessions over --versions committed versions, a
snapshot of the last of them, then --tail more versions of the same size whose
changelogs a restore replays. A child process (so that its peak RSS is its own)
then restores the latest version into an empty local directory with
``memory_max_mb=--budget`` and reports its peak RSS (``VmHWM``), its RSS before the
provider was made, and the time the restore took. Invariant 5 (DESIGN.md section
8) bounds the peak by the budget plus a fixed overhead, whatever the size of the
snapshot files and changelogs.

Run: ``.venv/bin/python bench/restore_memory.py [--sessions 20000000] [--versions 20]
[--tail 2] [--budget 128]`` (20M sessions: about half an hour on 2 cores, most of it
writing); ``--sessions 200000`` checks that it works.
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
from sessionstore import StateStoreProvider, StoreSpec  # noqa: E402
from sessionstore.checkpoint.records.layout import changelog_name  # noqa: E402

SPECS = [StoreSpec("sessions", "session", 10**12)]

CHILD = textwrap.dedent(
    """
    import json, sys, time
    from sessionstore import StateStoreProvider, StoreSpec

    def status(field):
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields[field].split()[0]) / 1024

    uri, local, version, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    before = status("VmRSS")
    t0 = time.perf_counter()
    p = StateStoreProvider(
        uri, "op", 0, [StoreSpec("sessions", "session", 10**12)], local, memory_max_mb=budget
    )
    h = p.get_store(version)
    elapsed = time.perf_counter() - t0
    h.abort()
    p.close()
    print(json.dumps({"before": before, "peak": status("VmHWM"), "seconds": elapsed}))
    """
)


def rows_for(version: int, per_version: int) -> list[tuple]:
    base = version * per_version
    return [
        (f"user-{k:09d}", 1_700_000_000_000 + k, 1_700_000_060_000 + k, [k, "page"])
        for k in range(base, base + per_version)
    ]


def write(uri: str, local: str, versions: int, tail: int, per_version: int, budget: int) -> dict:
    """The checkpoint: a snapshot of ``versions``, then ``tail`` changelogs."""
    p = StateStoreProvider(
        uri, "op", 0, SPECS, local, snapshot_interval=versions, memory_max_mb=budget
    )
    t0 = time.perf_counter()
    for v in range(versions + tail):
        h = p.get_store(v)
        for lo in range(0, per_version, 100_000):  # rows built a share at a time
            rows = rows_for(v, per_version)[lo : lo + 100_000]
            h["sessions"].put_many(rows)
        h.commit()
        if v + 1 == versions:
            p.do_maintenance()
    p.close()
    return {"seconds": time.perf_counter() - t0}


def restore(uri: str, local: str, version: int, budget: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, uri, local, str(version), str(budget)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=20_000_000)
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--tail", type=int, default=2)
    ap.add_argument("--budget", type=int, default=128)
    args = ap.parse_args(argv)
    per_version = args.sessions // args.versions
    latest = args.versions + args.tail
    with scratch_dir("bench-restore-memory-") as tmp:
        uri = f"file://{tmp}/remote"
        wrote = write(uri, f"{tmp}/w", args.versions, args.tail, per_version, args.budget)
        part = f"{tmp}/remote/op/0"
        snapshot = tree_bytes(f"{part}/files")
        tail = [
            os.path.getsize(f"{part}/{changelog_name(v)}")
            for v in range(args.versions + 1, latest + 1)
        ]
        got = restore(uri, f"{tmp}/r", latest, args.budget)
    rows = [
        [
            f"{per_version * latest:,}",
            f"{snapshot / 2**20:,.0f} MiB",
            f"{args.tail} x {sum(tail) / max(args.tail, 1) / 2**20:,.0f} MiB",
            f"{args.budget} MiB",
            f"{got['before']:.0f} MiB",
            f"{got['peak']:.0f} MiB",
            f"{got['seconds']:.1f} s",
            f"{wrote['seconds']:.0f} s",
        ]
    ]
    return print_table(
        f"Restore memory, file store ({machine()})",
        [
            "sessions", "snapshot", "changelogs replayed", "budget", "RSS before",
            "peak RSS", "restore", "writing (not measured)",
        ],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
