"""Store overhead: sessionstore stores vs raw rocksdict doing the same RocksDB work.

For each case the store's RocksDB operations are first recorded (untimed): every
get, multi-get, range scan and committed write batch, with the exact bytes. The
baseline replays that trace with raw rocksdict on an identical copy of the
database. Both timed runs start from the same state, so the ratio is the cost of
everything the store adds: key and value encoding, segment routing, visibility
filtering, the write buffer and result objects.

Run: ``make bench`` or ``.venv/bin/python bench/stores.py [--keys N]``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rocksdict import Rdict, ReadOptions, WriteBatch  # noqa: E402

from bench.common import Trace, machine, print_table, raw_rdict, scratch_dir  # noqa: E402
from sessionstore import StateDB  # noqa: E402

HOUR = 3_600_000


def replay(rd: Rdict, ops: list[tuple]) -> None:
    """Perform ``ops`` with raw rocksdict (writes as one WriteBatch per commit)."""
    cfs: dict[str, Rdict] = {}
    handles: dict = {}

    def cf(name):
        c = cfs.get(name)
        if c is None:
            c = cfs[name] = rd.get_column_family(name)
        return c

    def handle(name):
        h = handles.get(name)
        if h is None:
            h = handles[name] = rd.get_column_family_handle(name)
        return h

    for op in ops:
        kind = op[0]
        if kind == "get":
            cf(op[1]).get(op[2])
        elif kind == "multi":
            cf(op[1]).get(op[2])
        elif kind == "scan":
            _, name, lo, hi, reverse = op
            ro = ReadOptions()
            if reverse:
                for k, _v in cf(name).items(backwards=True, from_key=hi, read_opt=ro):
                    if lo is not None and k < lo:
                        break
            else:
                if hi is not None:
                    ro.set_iterate_upper_bound(hi)
                for _k, _v in cf(name).items(from_key=lo, read_opt=ro):
                    pass
        else:
            # the fastest raw idiom: a C-level loop per family when it has no deletes
            wb = WriteBatch(raw_mode=True)
            for name, entries in op[1]:
                h = handle(name)
                if None in entries.values():
                    for k, v in entries.items():
                        if v is None:
                            wb.delete(k, h)
                        else:
                            wb.put(k, v, h)
                else:
                    wb.set_default_column_family(h)
                    deque(map(wb.put, entries.keys(), entries.values()), 0)
            rd.write(wb)
    cfs.clear()
    handles.clear()


def run_case(name, setup, work, repeat=5):
    """Time ``work(db) -> op count`` on our store and its trace replayed raw."""
    with scratch_dir("bench-stores-") as tmp:
        base = os.path.join(tmp, "base")
        with StateDB.open(base) as db:
            setup(db)
        # record the trace on a copy
        rec = os.path.join(tmp, "rec")
        shutil.copytree(base, rec)
        with StateDB.open(rec) as db:
            trace = Trace(db)
            n_ops = work(db)
            ops = trace.ops
        families = [f for f in Rdict.list_cf(base) if f != "default"]
        # our families may grow during work: create them up front for the raw replay
        families = sorted(set(families) | {f for f in Rdict.list_cf(rec) if f != "default"})
        ours = raw = 0.0
        for _ in range(repeat):
            a = os.path.join(tmp, "a")
            shutil.rmtree(a, ignore_errors=True)
            shutil.copytree(base, a)
            with StateDB.open(a) as db:
                t0 = time.perf_counter()
                work(db)
                ours = max(ours, n_ops / (time.perf_counter() - t0))
            b = os.path.join(tmp, "b")
            shutil.rmtree(b, ignore_errors=True)
            shutil.copytree(base, b)
            rd = raw_rdict(b, families)
            t0 = time.perf_counter()
            replay(rd, ops)
            raw = max(raw, n_ops / (time.perf_counter() - t0))
            rd.close()
    rocks_ops = sum(len(o[2]) if o[0] == "multi" else 1 for o in ops if o[0] != "write")
    rocks_ops += sum(len(e) for o in ops if o[0] == "write" for _, e in o[1])
    return [
        name,
        f"{n_ops:,}",
        f"{rocks_ops / n_ops:.2f}",
        f"{ours:,.0f}",
        f"{raw:,.0f}",
        f"{ours / raw:.0%}",
    ]


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--per-key", type=int, default=10)
    ap.add_argument("--batch", type=int, default=10_000)
    args = ap.parse_args(argv)
    rng = random.Random(7)
    keys = [f"user-{i:06d}" for i in range(args.keys)]
    # sessions: per key, per_key disjoint sessions within one 30-minute segment
    sessions = []
    for j in range(args.per_key):
        for k in keys:
            start = j * 60_000 + rng.randrange(0, 20_000)
            sessions.append((k, start, start + rng.randrange(0, 30_000), {"n": j}))
    rng.shuffle(keys)

    def session_store(db):
        return db.session_store("s", HOUR, segment_interval_ms=HOUR // 2)

    def load_sessions(db):
        store = session_store(db)
        for i in range(0, len(sessions), args.batch):
            with db.batch():
                for k, s, e, v in sessions[i : i + args.batch]:
                    store.put(k, s, e, v)
        return len(sessions)

    def load_sessions_many(db):
        store = session_store(db)
        for i in range(0, len(sessions), args.batch):
            store.put_many(sessions[i : i + args.batch])
        return len(sessions)

    def find_sessions(db):
        store = session_store(db)
        n = 0
        for k in keys:
            for j in (2, 5):
                ts = j * 60_000 + 10_000
                n += 1
                for _ in store.find_sessions(k, ts - 30_000, ts + 30_000):
                    pass
        return n

    def fetch(db):
        store = session_store(db)
        for k in keys:
            for _ in store.fetch(k):
                pass
        return len(keys)

    versions = 5
    vevents = [
        (k, {"price": j}, j * 60_000 + i) for j in range(versions) for i, k in enumerate(keys)
    ]

    def versioned(db):
        return db.versioned_store("v", HOUR, segment_interval_ms=HOUR // 4)

    def load_versions(db):
        store = versioned(db)
        for i in range(0, len(vevents), args.batch):
            with db.batch():
                for k, v, ts in vevents[i : i + args.batch]:
                    store.put(k, v, ts)
        return len(vevents)

    def get_as_of(db):
        store = versioned(db)
        for k in keys:
            store.get(k, 150_000)  # history: valid [120000+i, 180000+i)
            store.get(k, 10 * 60_000)  # the latest
        return 2 * len(keys)

    rows = [
        run_case("session put (in db.batch())", lambda db: None, load_sessions),
        run_case("session put_many", lambda db: None, load_sessions_many),
        run_case("session find_sessions", load_sessions, find_sessions),
        run_case("session fetch (10 sessions)", load_sessions, fetch),
        run_case("versioned put (in order)", lambda db: None, load_versions),
        run_case("versioned get(as_of)", load_versions, get_as_of),
    ]
    title = (
        f"Store overhead vs raw rocksdict replaying the same operations "
        f"({args.keys:,} keys, {machine()})"
    )
    return print_table(
        title,
        ["case", "ops", "RocksDB ops/op", "sessionstore ops/s", "raw rocksdict ops/s", "ratio"],
        rows,
    )


if __name__ == "__main__":
    main()
