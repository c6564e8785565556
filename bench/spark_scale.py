"""Spark at scale: sessionize vs the built-in path vs the floor at many partitions.

The 1M-event stream of ``bench/spark_sessionize.py`` (same generator: --events
events over --keys Zipf keys in --batches Parquet files, one per micro-batch,
``trigger(availableNow=True)``, local[2], noop sink), at each partition count of
--partitions, compared in the same run, after an untimed warm-up query, in
interleaved rounds (best of --rounds):

1. the floor: ``repartition(P, key)`` + a ``mapInArrow`` that only counts rows;
2. Spark's built-in ``session_window`` count with the RocksDB state store provider
   and changelog checkpointing (``spark.sql.shuffle.partitions=P``);
3. ``sessionize`` with a count, ``num_partitions=P``, its checkpoint on each store
   of --stores: ``file`` (a local folder) and ``s3`` (a moto S3 server on 127.0.0.1,
   which shares the machine's cores), with the defaults: state servers, and the
   partitions beyond 2 per core kept in fewer databases (slabs: the
   ``databases`` column) run by fewer Spark tasks;
4. with --compare, on the first store: ``tasks``, one Spark task and one database
   per partition (state servers on), and ``workers``, that with the state in the
   Python workers (``spark.sessionstore.stateServers=off``: how it ran before
   both).

The warm-up runs the floor and one ``sessionize`` untimed (the JVM's first query,
and the state servers' start, once per executor).

For each ``sessionize`` run it also reports (from the best round):

* object-store requests per partition (per task before fewer tasks than
  partitions): the requests the S3 server received from the query's start to its
  end, over partitions x micro-batches (needs
  ``tests.object_stores.moto_s3_server(record=True)``; "n/a" without it, and on a
  local folder);
* how tasks got their partition's database, per micro-batch after the first (from
  the changelog headers' ``load_kind``, as ``sessionstore stats`` shows them):
  ``warm`` (open in its process already) and ``reopened`` (the ``handover`` kind:
  reopened from the local disk, after another worker held it or after this one
  parked it);
* worker peak RSS: the largest peak resident set (``VmHWM``) of Spark's Python
  worker processes during the run (reset at its start through
  ``/proc/<pid>/clear_refs``, sampled every 0.2 s), and how many worker processes
  ran.

Run: ``.venv/bin/python bench/spark_scale.py [--partitions 4,50,200] [--stores
file,s3] [--compare tasks,workers] [--rounds N] [--events N] [--keys N] [--batches N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, print_table, scratch_dir  # noqa: E402
from bench.spark_sessionize import count_rows, timed, write_input  # noqa: E402

BUILTIN_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


# ------------------------------------------------------------ Python workers
def _children() -> dict[int, list[int]]:
    """Every process's children, by parent pid (from /proc)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


#: Command lines of the Python processes measured: PySpark's daemon and workers,
#: and sessionstore's state servers (started by workers).
WORKER_COMMANDS = (b"pyspark.daemon", b"pyspark.worker", b"spark_integration.execution.state_server")


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def python_workers() -> list[int]:
    """Pids of this driver's PySpark daemon and worker processes (the JVM's Python
    children and theirs), and of the state servers that watch that daemon (a server
    outlives the worker that started it, so it may no longer be in the tree)."""
    children, found, todo = _children(), [], [os.getpid()]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            todo.append(child)
            if any(name in _cmdline(child) for name in WORKER_COMMANDS):
                found.append(child)
    watched = {str(pid).encode() for pid in found}
    for pids in children.values():
        for pid in pids:
            argv = _cmdline(pid).rstrip(b"\0").split(b"\0")
            if WORKER_COMMANDS[-1] in _cmdline(pid) and argv[-1] in watched and pid not in found:
                found.append(pid)
    return found


def _peak_rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextlib.contextmanager
def worker_peaks() -> Iterator[dict[int, int]]:
    """Peak RSS per Python worker pid during the block: peaks are reset at its start
    (``clear_refs``) and sampled every 0.2 s, so workers that exit are counted too."""
    for pid in python_workers():
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
    peaks: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        while True:
            for pid in python_workers():
                rss = _peak_rss(pid)
                if rss is not None:
                    peaks[pid] = max(peaks.get(pid, 0), rss)
            if done.wait(0.2):
                return

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        done.set()
        thread.join()
        sample()  # the final peaks


# --------------------------------------------------------------- S3 requests
def s3_endpoint(stack: contextlib.ExitStack) -> tuple[dict[str, Any], bool]:
    """A moto S3 server's options, and whether it counts requests (the recording
    server of tests/object_stores.py, when that has one)."""
    from tests import object_stores

    try:
        return stack.enter_context(object_stores.moto_s3_server(record=True)), True
    except TypeError:  # moto_s3_server() without record=
        return stack.enter_context(object_stores.moto_s3_server()), False


def request_count(options: dict[str, Any] | None) -> int | None:
    if options is None:
        return None
    from tests.object_stores import s3_request_counts

    return sum(s3_request_counts(options).values())


def reset_requests(options: dict[str, Any] | None) -> None:
    if options is not None:
        from tests.object_stores import reset_s3_request_counts

        reset_s3_request_counts(options)


# ----------------------------------------------------------------------- run
def loads_per_batch(uri: str, options: dict[str, Any], name: str) -> dict[str, float]:
    """Mean tasks per micro-batch by how they got their state, batches after the
    first (which restores every partition's empty state)."""
    from sessionstore.tools.reader import CheckpointSource

    rows = CheckpointSource(uri, options).batch_metrics(name)[1:]
    kinds: dict[str, float] = {}
    for row in rows:
        for kind, n in row["loads"].items():
            kinds[kind] = kinds.get(kind, 0) + n / len(rows)
    return kinds


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", default="4,50,200", help="comma-separated counts")
    ap.add_argument("--stores", default="file,s3", help="sessionize checkpoints: file, s3")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best counts")
    ap.add_argument(
        "--compare", default="tasks,workers",
        help="sessionize variants to add on the first store: 'tasks' (one Spark task per "
        "partition) and 'workers' (that, and state in the Python workers: no state servers)",
    )  # fmt: skip
    ap.add_argument(
        "--baselines-at", default=None,
        help="comma-separated partition counts at which the floor and the built-in path "
        "run (default: every count; they take minutes at 1,000 partitions)",
    )  # fmt: skip
    ap.add_argument(
        "--due-batches", choices=["on", "off"], default="off",
        help="the operators' due source (spark.sessionstore.dueBatches.enabled: on by "
        "default in the product; off here, as BENCHMARKS.md's tables but one ran)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    compare = [c for c in args.compare.split(",") if c]
    if not set(compare) <= {"tasks", "workers"}:
        ap.error(f"--compare must name tasks and/or workers, got {args.compare!r}")
    counts = [int(p) for p in args.partitions.split(",")]
    stores = args.stores.split(",")
    if not counts or min(counts) < 1:
        ap.error(f"--partitions must be positive ints, got {args.partitions!r}")
    if not set(stores) <= {"file", "s3"}:
        ap.error(f"--stores must name file and/or s3, got {args.stores!r}")
    baselines_at = (
        set(counts) if args.baselines_at is None
        else {int(p) for p in args.baselines_at.split(",") if p}
    )  # fmt: skip

    from pyspark.sql import functions as F

    from spark_integration import StateBackend, sessionize
    from spark_integration.conf.local_spark import local_spark
    from spark_integration.execution.state_server import SERVERS_CONF
    from spark_integration.planning.due_batches import DUE_BATCHES_CONF
    from spark_integration.planning.placement import TASKS_CONF

    spark = local_spark(
        "sessionstore-bench-scale", partitions=4, spark__driver__memory="4g",
        spark__ui__showConsoleProgress="false",
    )  # fmt: skip
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", BUILTIN_PROVIDER)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    spark.conf.set(DUE_BATCHES_CONF, "true" if args.due_batches == "on" else "false")
    best: dict[tuple[str, int], dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(scratch_dir("bench-scale-"))
        s3, counted, bucket = None, False, None
        if "s3" in stores:
            s3, counted = s3_endpoint(stack)
            from tests.object_stores import new_bucket

            bucket = new_bucket(s3)
        source = os.path.join(tmp, "in")
        write_input(source, args.events, args.keys, args.batches)

        def stream() -> Any:
            return (
                spark.readStream.schema("user string, ts timestamp")
                .option("maxFilesPerTrigger", 1)
                .parquet(source)
            )

        def noop(out: Any, run: str) -> Any:
            return (
                out.writeStream.format("noop").outputMode("append")
                .option("checkpointLocation", os.path.join(tmp, f"ck-{run}"))
                .trigger(availableNow=True).start()
            )  # fmt: skip

        def floor(p: int, run: str) -> Any:
            return noop(stream().repartition(p, "user").mapInArrow(count_rows, "n long"), run)

        def builtin(p: int, run: str) -> Any:
            # read when the query starts; its state keeps it for the checkpoint's life
            spark.conf.set("spark.sql.shuffle.partitions", str(p))
            out = (
                stream()
                .withWatermark("ts", "60 seconds")
                .groupBy(F.session_window("ts", "60 seconds"), "user")
                .count()
            )
            return noop(out, run)

        started: dict[str, tuple[str, dict[str, Any]]] = {}  # sessionize runs' checkpoints

        def ours(store: str, variant: str, p: int, run: str) -> Any:
            # read when the operator is built
            spark.conf.set(SERVERS_CONF, "off" if variant == "workers" else "auto")
            spark.conf.set(TASKS_CONF, "auto" if variant == "default" else str(p))
            options = dict(s3) if store == "s3" else {}
            uri = f"s3://{bucket}/{run}" if store == "s3" else f"file://{tmp}/state-{run}"
            backend = StateBackend(
                uri, local_dir=os.path.join(tmp, f"local-{run}"), storage_options=options
            )
            out = sessionize(
                stream(), key="user", timestamp="ts", gap="60 seconds",
                aggregations={"count": "count"}, backend=backend, num_partitions=p,
                name="scale",
            )  # fmt: skip
            started[run] = (uri, options)
            return noop(out, run)

        cases: list[tuple[str, Any]] = [("floor", floor), ("builtin", builtin)]
        cases += [(f"sessionize {s}", functools.partial(ours, s, "default")) for s in stores]
        labels = {"tasks": "1 task/partition", "workers": "1 task/partition, in workers"}
        cases += [
            (f"sessionize {stores[0]}, {labels[v]}", functools.partial(ours, stores[0], v))
            for v in compare
        ]
        timed(lambda: floor(counts[0], "warm-up"))  # the JVM's first query, untimed
        # and the executor's state servers' start (once per executor, about 0.5 s)
        timed(lambda: ours(stores[0], "default", counts[0], "warm-up-ours"))
        for round_ in range(args.rounds):
            for p in counts:
                for label, case in cases:
                    if label in ("floor", "builtin") and p not in baselines_at:
                        continue
                    run = (
                        "-".join(label.replace(",", "").replace("/", "-").split())
                        + f"-{p}-{round_}"
                    )
                    counting = s3 if counted and label == "sessionize s3" else None
                    reset_requests(counting)
                    with worker_peaks() as peaks:
                        elapsed, _ = timed(lambda c=case, p=p, r=run: c(p, r))
                    result = {
                        "time": elapsed,
                        "rss": max(peaks.values(), default=0),
                        "workers": len(peaks),
                        "requests": request_count(counting),
                    }
                    if run in started:
                        result["loads"] = loads_per_batch(*started[run], "scale")
                    print(f"round {round_}, {p} partitions, {label}: {elapsed:.1f} s", flush=True)
                    if (label, p) not in best or elapsed < best[(label, p)]["time"]:
                        best[(label, p)] = result
        from spark_integration.planning.placement import task_count
        from spark_integration.planning.resolve import slab_count

        spark.conf.set(TASKS_CONF, "auto")
        slabs_of = {p: slab_count(spark, p) for p in counts}  # a new checkpoint's
        tasks_of = {p: task_count(spark, slabs_of[p]) for p in counts}
        spark.stop()

    rows = []
    smallest = {label: best.get((label, counts[0])) for label, _ in cases}
    for p in counts:
        base = best.get(("builtin", p), {}).get("time")
        floor_time = best.get(("floor", p), {}).get("time")
        tasks = tasks_of[p]
        for label, _ in cases:
            r = best.get((label, p))
            if r is None:
                continue
            loads = r.get("loads")
            first = smallest.get(label)
            requests = r["requests"]
            databases = p if "1 task/partition" in label else slabs_of[p]
            rows.append([
                str(p), str(databases) if label.startswith("sessionize") else "", label,
                f"{r['time']:.1f} s",
                "" if base is None else f"{base / r['time']:.2f}x",
                "" if floor_time is None else f"{r['time'] / floor_time:.2f}x",
                "" if first is None or not label.startswith("sessionize")
                else f"{r['time'] / first['time']:.2f}x",
                "" if not label.startswith("sessionize") else
                "n/a" if requests is None else f"{requests / (p * args.batches):.2f}",
                "" if not label.startswith("sessionize") else
                "n/a" if requests is None else f"{requests / (tasks * args.batches):.1f}"
                if "1 task/partition" not in label else "",
                "" if loads is None else f"{loads.get('warm', 0):.1f}",
                "" if loads is None else f"{loads.get('handover', 0):.1f}",
                f"{r['rss'] / 2**20:.0f} MB ({r['workers']})",
            ])  # fmt: skip
    return print_table(
        f"Spark at scale, {args.events:,} events, {args.keys:,} Zipf keys, {args.batches} "
        f"micro-batches, local[2], best of {args.rounds} ({machine()})",
        [
            "partitions", "databases", "pipeline", "time", "vs built-in", "vs floor",
            f"vs {counts[0]} partitions", "requests/partition", "requests/task",
            "warm/batch", "reopened/batch", "worker peak RSS (workers)",
        ],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
