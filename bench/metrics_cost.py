"""What collecting state metrics costs one task (microbenchmark of the code added).

One task of the 1M-event Spark benchmark (bench/spark_sessionize.py: 10 batches,
4 partitions) handles ~25,000 events. This times, per task, each piece the metrics
add, on a partition database holding that many sessions:

* ``StateStoreProvider._metrics`` (snapshot lag's listdir, native memory, the sums);
* the header's extra packing: ``encode_changelog`` with and without metrics;
* the ``last_commit`` record: one local meta read and write;
* the default in-job path: what the record adds to the report each task sends
  the driver's coordinator (spark_integration/coordinator/server.py);
* ``_WithMetrics``'s Arrow work (the opt-in observed path): the null metrics
  column on the output and the metrics row.

Usage: python bench/metrics_cost.py [--events 25000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import pyarrow as pa

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.partition.provider import store_stats
from sessionstore.checkpoint.records.changelog import encode_changelog
from sessionstore.checkpoint.records.layout import LAST_COMMIT_KEY
from sessionstore.engine.write_buffer import WriteBuffer


def best_ms(fn, repeat: int) -> float:
    """The median of ``repeat`` timed calls, in ms (the machine is shared)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=25_000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        specs = [StoreSpec("sessions", "session", 10**12)]
        p = StateStoreProvider(f"file://{tmp}/remote", "op", 0, specs, f"{tmp}/local")
        h = p.get_store(0)
        for i in range(args.events):
            h["sessions"].put(f"user-{i % 20_000}", i, i + 10, [1, i])
        h.commit()
        h = p.get_store(1)
        for i in range(args.events):  # the next task's writes, pending
            h["sessions"].put(f"user-{i % 20_000}", i + 20, i + 30, [2, i])
        db = h.db
        buf = db._buffer
        stats = store_stats(db, h.stores, buf)
        metrics = p.committer.metrics(h, 2, stats, db.get_meta(LAST_COMMIT_KEY))
        results = {
            "_metrics (lag, memory, sums)": best_ms(
                lambda: p.committer.metrics(h, 2, stats, db.get_meta(LAST_COMMIT_KEY)), args.repeat
            ),
            # the metrics add header packs only (the body does not change): timed on an
            # empty body, since the body's own time would drown the difference in noise
            "encode_changelog header, extra for metrics": best_ms(
                lambda: encode_changelog(WriteBuffer(), "op", 0, 2, stats, dict(metrics)),
                args.repeat,
            )
            - best_ms(lambda: encode_changelog(WriteBuffer(), "op", 0, 2, stats), args.repeat),
        }
        h.abort()  # the record is written outside the commit's batch: straight to RocksDB
        results["last_commit meta read + write"] = best_ms(
            lambda: (db.get_meta(LAST_COMMIT_KEY), db.put_meta(LAST_COMMIT_KEY, b"x" * 80)),
            args.repeat,
        )
        p.close()
    from spark_integration.execution.metrics import _FIELDS, _STRUCT

    out = pa.record_batch({"user": pa.array([f"u{i}" for i in range(5_000)])})
    schema = pa.schema([("user", pa.string()), ("__ss_metrics", _STRUCT)])
    record = {n: "warm" if kind == "string" else 1 for n, kind in _FIELDS}

    def arrow_work() -> None:
        pa.RecordBatch.from_arrays([*out.columns, pa.nulls(out.num_rows, _STRUCT)], schema=schema)
        row = pa.array([record], type=_STRUCT)
        pa.RecordBatch.from_arrays([pa.nulls(1, pa.string()), row], schema=schema)

    observed = {"Arrow: null column + metrics row (opt-in observed path)": best_ms(
        arrow_work, args.repeat
    )}  # fmt: skip

    # the default in-job path: the record rides in the report every task of an
    # event-time operator sends the driver's coordinator anyway (a round trip on
    # 127.0.0.1 here); what the metrics add is the difference
    from spark_integration.coordinator.client import report
    from spark_integration.coordinator.server import Coordinator

    coordinator = Coordinator("127.0.0.1", 0)
    try:
        address = coordinator.register(f"file://{tempfile.gettempdir()}/unused", "op", 4)
        record = {k: v for k, v in metrics.items() if k != "previous"}
        with_record = best_ms(lambda: report(address, "run", 1, 0, 5, record), args.repeat)
        bare = best_ms(lambda: report(address, "run", 1, 0, 5, None), args.repeat)
    finally:
        coordinator.stop()
    results["coordinator report: extra for the record"] = max(0.0, with_record - bare)
    for name, ms in results.items():
        print(f"{name:56s} {ms:8.3f} ms")
    print(f"{'total per task (default path)':56s} {sum(results.values()):8.3f} ms")
    print(f"{'(the report itself, sent anyway by event-time operators)':56s} {bare:8.3f} ms")
    for name, ms in observed.items():
        print(f"{name:56s} {ms:8.3f} ms")


if __name__ == "__main__":
    main()
