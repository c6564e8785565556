"""Taking a partition's database: open costs and handovers between worker processes.

Spark runs a partition's task in whichever Python worker is free, so a task often
needs the database another worker of the executor used last. This measures what
that costs on a partition database shaped like the sessionize operator's (a
session store with its end index, 20,000 sessions committed over 10 versions):

* the baseline, raw rocksdict opening and closing the same database with its
  default options;
* ``StateDB.open`` + ``close`` (our options);
* a new provider taking a local copy at the wanted version (what a worker does
  when the partition is free: open, check the version, no checkpoint listing);
* a handover from another process that holds the database while idle, and while
  its main thread is busy (the case the store service avoids by closing its
  databases when idle once it meets another worker).

Run: ``.venv/bin/python bench/handover.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rocksdict import Options, Rdict  # noqa: E402

from bench.common import machine, print_table, scratch_dir  # noqa: E402
from sessionstore import StateDB, StateStoreProvider, StoreSpec  # noqa: E402
from sessionstore.checkpoint.service.store_service import StoreService  # noqa: E402

SPECS = [StoreSpec("sessions", "session", 120_001)]

HOLDER = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    sys.path.insert(0, sys.argv[5])
    from sessionstore import StateStoreProvider, StoreSpec
    from sessionstore.checkpoint.service.store_service import StoreService
    remote, local, baton, busy = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "busy"
    specs = [StoreSpec("sessions", "session", 120_001)]
    service = StoreService.instance()
    make = lambda: StateStoreProvider(remote, "op", 0, specs, local)
    data = np.random.default_rng(1).random(100_000).tolist()
    turn = 0
    while not os.path.exists(f"{baton}/stop"):
        if not os.path.exists(f"{baton}/hold-{turn}"):
            time.sleep(0.002)
            continue
        with service.provider("op/0", make) as provider:
            provider.get_store(provider.latest_version()).abort()
        service.contended = False  # keep holding it: the handover is what we measure
        open(f"{baton}/held-{turn}", "w").close()
        turn += 1
        if busy:  # C calls that hold the GIL for ms, as a task's sorts and encodings do
            while not os.path.exists(f"{baton}/hold-{turn}") and not os.path.exists(
                f"{baton}/stop"
            ):
                sorted(data)
    """
)


def build(remote: str, local: str) -> None:
    """A partition database with 10 committed versions of sessions and end index."""
    p = StateStoreProvider(remote, "op", 0, SPECS, local)
    for v in range(10):
        h = p.get_store(v)
        store = h["sessions"]
        index = store.end_index()
        base = v * 60_000
        for j in range(2_000):
            key = f"user-{j:06d}"
            store.put(key, base + j, base + j + 10, {"count": j})
            index.add(store.encode_key(key), base + j, base + j + 10)
        h.commit()
    p.close()


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def handovers(remote: str, local: str, baton: str, busy: bool, repeat: int) -> list[float]:
    """Time this process taking the partition from a holder process, ``repeat`` times."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, remote, local, baton, "busy" if busy else "idle", root],
        stderr=subprocess.PIPE,
        text=True,
    )
    service = StoreService()
    service.contended = False

    def make():
        return StateStoreProvider(remote, "op", 0, SPECS, local)

    times = []
    try:
        for turn in range(repeat + 1):
            open(f"{baton}/hold-{turn}", "w").close()
            while not os.path.exists(f"{baton}/held-{turn}"):
                if holder.poll() is not None:
                    raise RuntimeError(holder.communicate()[1])
                time.sleep(0.002)
            time.sleep(0.05)  # the holder is now idle, or busy
            t0 = time.perf_counter()
            with service.provider("op/0", make) as provider:
                elapsed = time.perf_counter() - t0
                provider.get_store(provider.latest_version()).abort()
            if turn:  # the first one warms up both processes
                times.append(elapsed)
    finally:
        open(f"{baton}/stop", "w").close()
        holder.wait(timeout=60)
        service.close_all()
    for name in os.listdir(baton):
        os.remove(os.path.join(baton, name))
    return times


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    with scratch_dir("bench-handover-") as tmp:
        remote, local = f"file://{tmp}/remote", os.path.join(tmp, "local")
        build(remote, local)
        db_path = os.path.join(local, "op", "0", "db")
        families = [f for f in Rdict.list_cf(db_path) if f != "default"]

        def raw_open():
            opts = Options(raw_mode=True)
            Rdict(db_path, opts, column_families={f: opts for f in families}).close()

        def ours_open():
            StateDB.open(db_path).close()

        def provider_take():
            p = StateStoreProvider(remote, "op", 0, SPECS, local)
            p.get_store(10).abort()
            p.close()

        baton = os.path.join(tmp, "baton")
        os.makedirs(baton)
        cases = [
            ("raw rocksdict open + close (default options)", timed(raw_open, args.repeat)),
            ("StateDB.open + close", timed(ours_open, args.repeat)),
            ("new provider takes a free local copy", timed(provider_take, args.repeat)),
            (
                "handover from an idle holder process",
                handovers(remote, local, baton, False, args.repeat),
            ),
            (
                "handover from a busy holder process",
                handovers(remote, local, baton, True, args.repeat),
            ),
        ]
    rows = [
        [
            name,
            f"{1e3 * statistics.median(t):.1f}",
            f"{1e3 * sorted(t)[int(0.9 * (len(t) - 1))]:.1f}",
        ]
        for name, t in cases
    ]
    title = (
        f"Taking a partition database ({len(families) + 1} column families, "
        f"{args.repeat} repeats, {machine()})"
    )
    return print_table(title, ["case", "median ms", "p90 ms"], rows)


if __name__ == "__main__":
    main()
