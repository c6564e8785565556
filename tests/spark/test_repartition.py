"""Rescaling on real Spark: routing against Spark's own ``repartition``, and a query
stopped at 4 partitions, repartitioned to 7 and restarted, against an uninterrupted
run; the Spark job against the CLI."""

from __future__ import annotations

import os
import random
import tempfile
from collections import Counter
from contextlib import nullcontext

import pytest

from sessionstore.checkpoint.records.snapshot import download_snapshot
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.encoding.spark_hash import partition_ids
from sessionstore.stores.state_db import StateDB
from spark_integration import (
    StateBackend,
    repartition_state,
    sessionize,
    temporal_join,
    window_aggregate,
)
from tests.spark.shared_runs import uninterrupted_batches
from tests.spark.streams import json_source, without_due_batches, write_json
from tests.spark.suite_a_streams import Streams, flat, run_together
from tests.tools.test_cli import run

pytestmark = pytest.mark.slow


def _text(rng):
    alphabet = "aZ09 -éß日本語🙂\u0000"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 9)))


def test_routing_matches_spark_repartition(spark):
    from pyspark.sql import functions as F

    rng = random.Random(7)
    rows = [
        (
            None if i % 97 == 0 else _text(rng),
            None if i % 89 == 0 else rng.choice([rng.randrange(-(2**63), 2**63), -i, i]),
            None if i % 83 == 0 else rng.randrange(-(2**31), 2**31),
            None if i % 79 == 0 else rng.random() < 0.5,
            None if i % 73 == 0 else rng.randbytes(rng.randrange(0, 9)),
        )
        for i in range(3000)
    ]
    df = spark.createDataFrame(rows, "s string, l long, i int, t boolean, b binary")
    types = {"s": "string", "l": "long", "i": "integer", "t": "boolean", "b": "binary"}
    for cols, n in [(["s"], 7), (["l"], 13), (["i"], 5), (["s", "l"], 7), (["i", "s", "l"], 11),
                    (["t"], 3), (["b"], 9), (["b", "t", "i"], 10)]:  # fmt: skip
        got = df.repartition(n, *cols).select(*cols, F.spark_partition_id().alias("p")).collect()
        columns = [[r[c] for r in got] for c in cols]
        expected = partition_ids(columns, [types[c] for c in cols], n).tolist()
        assert [r["p"] for r in got] == expected, cols


SCHEMA = "kind string, user string, uid long, ts long, amount long, plan string"


def _batches(seed=5, count=4):
    rng = random.Random(seed)
    out, t = [], 0
    for b in range(count):
        rows = []
        for _ in range(60):
            t += rng.randrange(0, 1500)
            u = rng.randrange(12)
            user, uid = f"ü{u}" if u % 3 else "", -(u * 7919) - 1
            rows.append({"kind": "e", "user": user, "uid": uid, "ts": t - rng.randrange(2000),
                         "amount": rng.randrange(9), "plan": None})  # fmt: skip
            if rng.random() < 0.2:
                rows.append({"kind": "t", "user": user, "uid": uid, "ts": t - 500, "amount": 0,
                             "plan": f"p{b}"})  # fmt: skip
        out.append(rows)
    # Emission times depend on the partition count (a partition's stream time moves
    # with the rows it gets), the sessions and windows do not: two far-future
    # events close everything everywhere (the shared event time lags one batch).
    for far in (t + 100_000, t + 100_001):
        out.append([{"kind": "e", "user": "zz", "uid": 0, "ts": far, "amount": 0, "plan": None}])
    return out


def _query(spark, folder, backend, n, operator):
    """One operator's query on the source (one query each: in a union of operators,
    Spark numbers the tasks of the second one from n, see the report)."""
    from pyspark.sql import functions as F

    src = json_source(spark, folder, SCHEMA)
    events = src.filter("kind = 'e'").select("user", "uid", "ts", "amount")
    table = src.filter("kind = 't'").select("uid", F.col("ts").alias("plan_ts"), "plan")
    common = {"backend": backend, "name": operator, "num_partitions": n}
    with without_due_batches(spark):  # versions are the files' batches
        if operator == "sessions":
            return sessionize(events, ["user", "uid"], "ts", gap=3000, **common)
        if operator == "windows":
            return window_aggregate(events, "user", "ts", size=4000, **common)
        return temporal_join(
            events, table, "uid", "ts", "plan_ts", history_retention=10**9, how="left", **common
        )


def _contents(uri, operator, version):
    """Every family's rows of every partition's snapshot ``version``."""
    storage = open_filesystem(uri).child(operator)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for p in sorted(int(d) for d in storage.list_dirs() if d.isdigit()):
            path = os.path.join(tmp, str(p))
            download_snapshot(storage.child(str(p)), version, path)
            db = StateDB.open(path)
            out[p] = {cf: list(db.scan(cf)) for cf in db.column_families()}
            db.close()
    return out


def file_steps(batches, folder, part):
    """Steps of ``run_stream``: writing the files of the batches numbered in ``part``."""
    return [
        (lambda i=i, rows=rows: write_json(folder, i, rows))
        for i, rows in enumerate(batches)
        if i in part
    ]


@pytest.mark.parametrize("operator", ["sessions", "windows", "join"])
def test_rescaled_query_continues_as_if_uninterrupted(spark, tmp_path, tmp_path_factory, operator):
    """The rescaled run (2 batches at 4, a repartition to 7, 4 batches at 7) against
    the uninterrupted run at 4, each on its own source, state and checkpoint. The
    uninterrupted run is shared with test_rescale's join, the same query on the same
    input (tests/spark/shared_runs.py)."""
    batches = _batches()
    expected = flat(uninterrupted_batches(spark, tmp_path_factory, _query, operator, batches))

    def steps(part):
        return file_steps(batches, tmp_path / "in2", part)

    first = StateBackend(f"file://{tmp_path}/four", local_dir=str(tmp_path / "l2"))
    with Streams() as streams:
        streams.start("got", _query(spark, tmp_path / "in2", first, 4, operator), tmp_path / "ck2")
        streams.drive({"got": steps(range(2))})
        streams.stop("got")
        seven = f"file://{tmp_path}/seven"
        out = run("repartition", first.checkpoint_uri, "--operator", operator,
                  "--partitions", "7", "--to", seven)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert f"repartitioned {operator} version 2 from 4 to 7 partitions" in out.stdout
        if operator == "sessions":  # the Spark job writes the same databases as the CLI
            by_spark = f"file://{tmp_path}/seven-spark"
            done = repartition_state(spark, first.checkpoint_uri, operator, 7, by_spark)
            assert (done["version"], done["partitions"]) == (2, 7)
            # meta entries included (SST files differ: see docs/rescale.md)
            assert _contents(by_spark, operator, 2) == _contents(seven, operator, 2)

        rescaled = StateBackend(seven, local_dir=str(tmp_path / "l3"))
        query = _query(spark, tmp_path / "in2", rescaled, 7, operator)
        streams.start("got", query, tmp_path / "ck2")
        streams.drive({"got": steps(range(2, 6))})
    got = streams.rows("got")
    assert len(expected) > 20
    missing = Counter(map(str, expected)) - Counter(map(str, got))
    extra = Counter(map(str, got)) - Counter(map(str, expected))
    assert (missing, extra) == (Counter(), Counter())


def _zipf_batches(seed=39, files=4, events=1000):
    """The stream of docs/rescale.md's test: ``files`` files of ``events`` events,
    users drawn from a Zipf law, timestamps rising about 25 ms an event with up to
    45 s of disorder (beyond a 30 s gap plus a 10 s grace for some: late rows).

    A file spans about 25 s, less than a session's gap: sessions and windows run
    across files, so state crosses every batch and the rescale. The late rows are
    the early rows of a file that lag the event time the files before it reached,
    so their number does not grow with ``events``
    (:func:`test_rescale_of_a_zipf_stream_is_exact` counts them)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out, t = [], 1_700_000_000_000
    for _ in range(files):
        users = np.minimum(rng.zipf(1.3, events), 5000)
        steps = rng.integers(0, 50, events)
        lag = rng.integers(0, 45_000, events) * (rng.random(events) < 0.1)
        rows = []
        for user, step, late in zip(users.tolist(), steps.tolist(), lag.tolist(), strict=True):
            t += step
            rows.append({"kind": "e", "user": f"u{user}", "uid": user, "ts": t - late,
                         "amount": step % 7, "plan": None})  # fmt: skip
            if step == 0:  # a table row now and then, for the temporal join
                rows.append({"kind": "t", "user": f"u{user}", "uid": user, "ts": t,
                             "amount": 0, "plan": f"p{t % 97}"})  # fmt: skip
        out.append(rows)
    # Two far-future events close everything (the shared event time that closes
    # lags one batch), so that the final emissions are all compared too.
    for far in (t + 10**7, t + 10**7 + 1):
        out.append([{"kind": "e", "user": "zz", "uid": 0, "ts": far, "amount": 0, "plan": None}])
    return out


def _zipf_query(spark, folder, backend, n, case, due_batches=False):
    src = json_source(spark, folder, SCHEMA)
    events = src.filter("kind = 'e'").select("user", "uid", "ts", "amount")
    common = {"backend": backend, "name": case, "num_partitions": n}
    aggs = {"events": "count", "total": ("sum", "amount")}
    # a rescale is compared batch by batch with a run at 4, one batch per file
    with nullcontext() if due_batches else without_due_batches(spark):
        if case.startswith("sessions"):
            emit = case.split("_")[1]
            return sessionize(events, "user", "ts", gap=30_000, grace=10_000, emit=emit,
                              aggregations=aggs, **common)  # fmt: skip
        if case.startswith("windows"):
            emit = case.split("_")[1]
            return window_aggregate(events, "user", "ts", size=20_000, grace=10_000,
                                    emit=emit, aggregations=aggs, **common)  # fmt: skip
        from pyspark.sql import functions as F

        table = src.filter("kind = 't'").select("uid", F.col("ts").alias("plan_ts"), "plan")
        return temporal_join(events, table, "uid", "ts", "plan_ts", history_retention=60_000,
                             how="left", **common)  # fmt: skip


@pytest.mark.parametrize(
    "case", ["sessions_final", "sessions_update", "windows_final", "windows_update", "join"]
)
def test_rescale_of_a_zipf_stream_is_exact(spark, tmp_path, case):
    """2 micro-batches at 4 partitions, a repartition to 7, 2 more at 7 (and two that
    close everything) write exactly what an uninterrupted run at 4 writes, batch by
    batch: every batch is judged by the operator's shared event time before it, never
    by a partition's own (docs/rescale.md)."""
    batches = _zipf_batches()
    mode = "update" if case.endswith("update") else "append"

    def steps(folder, part):
        return file_steps(batches, folder, part)

    whole = StateBackend(f"file://{tmp_path}/whole", local_dir=str(tmp_path / "l1"))
    first = StateBackend(f"file://{tmp_path}/four", local_dir=str(tmp_path / "l2"))
    with Streams() as streams:  # the two runs side by side (see the test above)
        query = _zipf_query(spark, tmp_path / "in1", whole, 4, case)
        streams.start("whole", query, tmp_path / "ck1", mode)
        query = _zipf_query(spark, tmp_path / "in2", first, 4, case)
        streams.start("got", query, tmp_path / "ck2", mode)
        streams.drive({"whole": steps(tmp_path / "in1", range(2)),
                       "got": steps(tmp_path / "in2", range(2))})  # fmt: skip
        streams.stop("got")
        seven = f"file://{tmp_path}/seven"
        out = run("repartition", first.checkpoint_uri, "--operator", case,
                  "--partitions", "7", "--to", seven)  # fmt: skip
        assert out.returncode == 0, out.stderr
        rescaled = StateBackend(seven, local_dir=str(tmp_path / "l3"))
        query = _zipf_query(spark, tmp_path / "in2", rescaled, 7, case)
        streams.start("got", query, tmp_path / "ck2", mode)
        streams.drive({"whole": steps(tmp_path / "in1", range(2, 6)),
                       "got": steps(tmp_path / "in2", range(2, 6))})  # fmt: skip
    expected, got = streams.batches("whole"), streams.batches("got")
    assert sum(map(len, expected)) > 100
    assert len(got) == len(expected) == 6
    _same_batches(expected, got)
    if mode == "append" and case != "join":  # the stream has late rows, dropped
        _drops_late_rows(batches, flat(expected))


def _drops_late_rows(batches, emitted):
    """Every event but the two far-future ones is counted in exactly one final
    session or window (the last batches close them all): the emitted counts fall
    short of the events by the late rows dropped, which must be some."""
    events = sum(r["kind"] == "e" and r["user"] != "zz" for rows in batches for r in rows)
    counted = sum(r["events"] for r in emitted if r["user"] != "zz")
    assert 0 < events - counted < events // 10, (events, counted)


def _same_batches(expected, got):
    for batch, (want, have) in enumerate(zip(expected, got, strict=True)):
        missing = Counter(map(str, want)) - Counter(map(str, have))
        extra = Counter(map(str, have)) - Counter(map(str, want))
        assert (batch, missing, extra) == (batch, Counter(), Counter())


@pytest.mark.parametrize(
    "case", ["sessions_final", "sessions_update", "windows_final", "windows_update"]
)
def test_partition_count_changes_no_batch(spark, tmp_path, case):
    """The Zipf stream without a rescale, at 4 and at 7 partitions: the same rows in
    every micro-batch, due batches included. Which sessions and windows a batch
    closes, and which rows are late (some are: the final modes count them), are
    judged by the shared event time, which does not depend on which keys share a
    partition."""
    batches = _zipf_batches()
    mode = "update" if case.endswith("update") else "append"
    runs = {}  # the two runs side by side, each on its own source, state and checkpoint
    for n in (4, 7):
        backend = StateBackend(f"file://{tmp_path}/at{n}", local_dir=str(tmp_path / f"l{n}"))
        folder = tmp_path / f"in{n}"
        # due batches too: they also run alike at any partition count
        query = _zipf_query(spark, folder, backend, n, case, due_batches=True)
        steps = file_steps(batches, folder, range(len(batches)))
        runs[n] = (query, tmp_path / f"ck{n}", steps)
    runs = run_together(runs, mode)
    runs = [runs[4], runs[7]]
    assert sum(map(len, runs[0][:6])) > 100
    _same_batches(runs[0], runs[1])
    if mode == "append":  # the due batches after the last file close everything too
        _drops_late_rows(batches, flat(runs[0]))
