"""Session-window aggregation: record-by-record process() vs the batch path.

Workload: Zipf-distributed keys (s=1.1), event times advancing ~10 ms per event
with 5% of events up to 30 s late, gap 60 s, grace 60 s, count + sum, RocksDB
session store, micro-batches of 100k events. The record path runs on the first
--record-events events (it is the slow reference); the batch path on all of them.
Store operations are StateDB-level calls (gets, scans, written entries) counted
in a separate, untimed run.

Run: ``.venv/bin/python bench/operators.py [--events N] [--keys K]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import Trace, machine, print_table, scratch_dir, zipf_users  # noqa: E402
from sessionstore import StateDB  # noqa: E402
from sessionstore.operators import SessionWindowAggregator, SessionWindows  # noqa: E402

GAP = 60_000
AGGS = {"n": "count", "spent": ("sum", None)}


def workload(events: int, keys: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    names = zipf_users(rng, events, keys)
    ts = np.cumsum(rng.integers(0, 20, size=events)) + 1_700_000_000_000
    late = rng.random(events) < 0.05
    ts[late] -= rng.integers(0, 30_000, size=int(late.sum()))
    values = rng.integers(1, 100, size=events)
    return names.tolist(), ts.tolist(), values.tolist()


def aggregator(db, emit="update"):
    store = db.session_store("sessions", 3_600_000)
    return SessionWindowAggregator(store, SessionWindows(GAP, GAP), aggregations=AGGS, emit=emit)


def run_records(path, keys, ts, values, n):
    with StateDB.open(path) as db:
        agg = aggregator(db)
        t0 = time.perf_counter()
        for i in range(n):
            agg.process(keys[i], values[i], ts[i])
        return n / (time.perf_counter() - t0)


def run_batches(path, keys, ts, values, batch, trace=False, emit="update"):
    with StateDB.open(path) as db:
        agg = aggregator(db, emit)
        tracer = Trace(db) if trace else None
        emitted = 0
        t0 = time.perf_counter()
        for i in range(0, len(keys), batch):
            emitted += len(
                agg.process_rows(keys[i : i + batch], ts[i : i + batch], values[i : i + batch])
            )
        rate = len(keys) / (time.perf_counter() - t0)
        return rate, emitted, (tracer.counts() if tracer else None)


def arrow_tables(keys, ts, values, batch):
    """The events as Arrow tables of ``batch`` rows (columns key, ts, v), built before
    timing: Spark hands the operator Arrow batches, so building them is not the
    operator's cost (process_rows gets ready Python lists, which is in its favour)."""
    import pyarrow as pa

    return [
        pa.table({"key": keys[i : i + batch], "ts": ts[i : i + batch], "v": values[i : i + batch]})
        for i in range(0, len(keys), batch)
    ]


def run_tables(path, keys, ts, values, batch):
    """The columnar path (process_table) of emit-on-close sessions."""
    tables = arrow_tables(keys, ts, values, batch)
    with StateDB.open(path) as db:
        agg = aggregator(db, "final")
        emitted = 0
        t0 = time.perf_counter()
        for table in tables:
            out = agg.process_table(table, "key", "ts", "v")
            assert out is not None, "the workload qualifies for the columnar path"
            emitted += out.num_rows
        return len(keys) / (time.perf_counter() - t0), emitted


def run_windows(path, keys, ts, values, batch):
    """One-minute tumbling windows (grace 60 s, count + sum, emit on close):
    process() per record, process_rows() and process_table() per ``batch``, each on
    a fresh store. Returns ``(events/s, windows emitted)`` per path."""
    from sessionstore.operators import TimeWindows, WindowAggregator

    tables = arrow_tables(keys, ts, values, batch)

    rates = []
    for mode in ("record", "rows", "table"):
        with StateDB.open(f"{path}-{mode}") as db:
            agg = WindowAggregator(
                db.window_store("w", 3_600_000, 60_000),
                TimeWindows(60_000, None, GAP),
                aggregations=AGGS,
                emit="final",
            )
            emitted = 0
            t0 = time.perf_counter()
            if mode == "record":
                for k, t, v in zip(keys, ts, values, strict=True):
                    emitted += len(agg.process(k, v, t))
            elif mode == "rows":
                for i in range(0, len(keys), batch):
                    emitted += len(
                        agg.process_rows(
                            keys[i : i + batch], ts[i : i + batch], values[i : i + batch]
                        )
                    )
            else:
                for table in tables:
                    emitted += agg.process_table(table, "key", "ts", "v").num_rows
            rates.append((len(keys) / (time.perf_counter() - t0), emitted))
    return rates


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--record-events", type=int, default=100_000)
    args = ap.parse_args(argv)
    keys, ts, values = workload(args.events, args.keys)
    n_rec = min(args.record_events, args.events)
    rows = []
    with scratch_dir("bench-operators-") as tmp:
        rec_rate = run_records(f"{tmp}/rec", keys, ts, values, n_rec)
        with StateDB.open(f"{tmp}/rec-count") as db:
            agg = aggregator(db)
            tracer = Trace(db)
            for i in range(n_rec):
                agg.process(keys[i], values[i], ts[i])
            rec_ops = tracer.counts()
        batch_rate, emitted, _ = run_batches(f"{tmp}/bat", keys, ts, values, args.batch)
        final_rate, final_emitted, _ = run_batches(
            f"{tmp}/fin", keys, ts, values, args.batch, emit="final"
        )
        table_rate, table_emitted = run_tables(f"{tmp}/tab", keys, ts, values, args.batch)
        (win_rec, win_rec_n), (win_bat, win_bat_n), (win_tab, win_tab_n) = run_windows(
            f"{tmp}/win", keys[: args.record_events * 2], ts[: args.record_events * 2],
            values[: args.record_events * 2], args.batch,
        )  # fmt: skip
        if not win_rec_n == win_bat_n == win_tab_n:
            raise AssertionError(
                f"window paths emitted {win_rec_n}, {win_bat_n} and {win_tab_n} windows"
            )
        # counted on the same events as the record path, in batches of a tenth
        _, _, bat_ops = run_batches(
            f"{tmp}/bat-count",
            keys[:n_rec],
            ts[:n_rec],
            values[:n_rec],
            max(1, n_rec // 10),
            trace=True,
        )

    def per_event(ops):
        return f"{ops['get'] / n_rec:.2f} / {ops['scan'] / n_rec:.2f} / {ops['write'] / n_rec:.2f}"

    rows.append(
        ["process() per record", f"{n_rec:,}", f"{rec_rate:,.0f}", per_event(rec_ops), "1.0x"]
    )
    rows.append(
        [
            f"process_rows() per {args.batch:,}",
            f"{args.events:,}",
            f"{batch_rate:,.0f}",
            per_event(bat_ops),
            f"{batch_rate / rec_rate:.1f}x",
        ]
    )
    rows.append(
        [
            f"process_rows() per {args.batch:,}, emit=final",
            f"{args.events:,}",
            f"{final_rate:,.0f}",
            "",
            f"{final_rate / rec_rate:.1f}x",
        ]
    )
    rows.append(
        [
            f"process_table() per {args.batch:,}, emit=final (columnar)",
            f"{args.events:,}",
            f"{table_rate:,.0f}",
            "",
            f"{table_rate / rec_rate:.1f}x",
        ]
    )
    title = (
        f"Session aggregation, {args.keys:,} Zipf keys, gap 60 s "
        f"({emitted:,} updates in update mode, {final_emitted:,} sessions closed in final mode; "
        f"{machine()})"
    )
    text = print_table(
        title,
        ["path", "events", "events/s", "store gets / scans / writes per event", "speed-up"],
        rows,
    )
    n_win = min(len(keys), args.record_events * 2)
    text += print_table(
        f"Tumbling 1-minute windows, emit on close, grace 60 s ({win_bat_n:,} windows closed)",
        ["path", "events", "events/s", "speed-up"],
        [
            ["process() per record", f"{n_win:,}", f"{win_rec:,.0f}", "1.0x"],
            [f"process_rows() per {args.batch:,}", f"{n_win:,}", f"{win_bat:,.0f}",
             f"{win_bat / win_rec:.1f}x"],
            [f"process_table() per {args.batch:,} (columnar)", f"{n_win:,}", f"{win_tab:,.0f}",
             f"{win_tab / win_rec:.1f}x"],
        ],
    )  # fmt: skip
    return text


if __name__ == "__main__":
    main()
