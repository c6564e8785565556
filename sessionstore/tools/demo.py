"""``make demo``: a click stream through the stores, then a look at what they hold.

It generates clicks from Zipf-distributed users (some arriving late and out of
order), sessionizes them with the session-window aggregator over a RocksDB
session store, one micro-batch of 1,000 clicks at a time, records
each user's plan changes in a versioned store, joins every click with the plan
that was valid at its event time, and prints a sample with the store sizes.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
from collections import Counter

from sessionstore import StateDB
from sessionstore.operators import SessionWindowAggregator, SessionWindows

GAP_MS = 30 * 60_000  # 30 minutes of inactivity closes a session
RETENTION_MS = 24 * 3_600_000
AGGREGATIONS = {"clicks": "count", "entry": ("first", None), "exit": ("last", None)}


def click_stream(n: int, users: int, seed: int = 42) -> list[tuple[str, int, str]]:
    """``(user, event time ms, page)`` tuples; about 5% arrive up to 20 minutes late."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(users)]
    names = [f"user-{i:04d}" for i in range(users)]
    pages = ["/", "/search", "/item", "/cart", "/checkout"]
    now = 1_700_000_000_000
    clicks = []
    for _ in range(n):
        now += rng.randrange(0, 12_000)
        ts = now - (rng.randrange(0, 20 * 60_000) if rng.random() < 0.05 else 0)
        clicks.append((rng.choices(names, weights)[0], ts, rng.choice(pages)))
    return clicks


def dir_size(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clicks", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--dir", default="demo-output/state")
    args = parser.parse_args(argv)

    shutil.rmtree(args.dir, ignore_errors=True)
    clicks = click_stream(args.clicks, args.users)
    rng = random.Random(7)
    with StateDB.open(args.dir) as db:
        sessions = db.session_store("sessions", RETENTION_MS)
        plans = db.versioned_store("plans", RETENTION_MS)
        # plan changes: every user starts free at the first click, some upgrade later
        t0 = clicks[0][1]
        with db.batch():
            for i in range(args.users):
                user = f"user-{i:04d}"
                plans.put(user, "free", t0 - 1)
                if rng.random() < 0.3:
                    plans.put(user, "pro", t0 + rng.randrange(0, clicks[-1][1] - t0))
        aggregator = SessionWindowAggregator(
            sessions, SessionWindows(GAP_MS, grace_ms=RETENTION_MS), aggregations=AGGREGATIONS
        )
        for i in range(0, len(clicks), 1_000):  # one atomic batch per "micro-batch"
            chunk = clicks[i : i + 1_000]
            aggregator.process_rows(
                [c[0] for c in chunk], [c[1] for c in chunk], [c[2] for c in chunk]
            )

        print(f"{len(clicks):,} clicks from {args.users} users into {args.dir}\n")
        all_sessions = list(sessions.fetch_range(None, None))
        per_user = Counter(window.key for window, _ in all_sessions)
        user, count = per_user.most_common(1)[0]
        print(f"{user} has the most sessions ({count}, gap 30 min); the first five:")
        for window, acc in list(sessions.fetch(user))[:5]:
            minutes = (window.end - window.start) / 60_000
            result = aggregator.aggregation.finish(acc)
            print(
                f"  {window.key}  start={window.start}  end={window.end}  ({minutes:5.1f} min)  "
                f"clicks={result['clicks']:3d}  entry={result['entry']:9s} exit={result['exit']}"
            )

        upgraded = next(
            u for u in (f"user-{i:04d}" for i in range(args.users)) if plans.get(u).value == "pro"
        )
        print(f"\nPlan versions of {upgraded}:")
        for record in plans.get_versions(upgraded):
            print(f"  {record.value:5s} valid from {record.timestamp} to {record.valid_to}")

        upgrade_ts = plans.get(upgraded).timestamp
        print("\nIts clicks around the upgrade, joined with the plan valid at each event time:")
        theirs = sorted(ts for u, ts, _ in clicks if u == upgraded)
        around = [ts for ts in theirs if ts < upgrade_ts][-2:]
        around += [ts for ts in theirs if ts >= upgrade_ts][:2]
        for ts in around:
            print(f"  {ts}  plan={plans.get(upgraded, ts).value}")

        print("\nStore sizes:")
        print(f"  sessions: {len(all_sessions):,} sessions in segments {sessions.segment_ids()}")
        print(f"  plans: {args.users} keys, history segments {plans.segment_ids()}")
        print(f"  column families: {db.column_families()}")
    print(f"  on disk: {dir_size(args.dir) / 1024:,.0f} KiB")


if __name__ == "__main__":
    main()
