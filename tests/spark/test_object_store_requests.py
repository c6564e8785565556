"""Object-store requests per task at many partitions, counted at a real S3 endpoint."""

from __future__ import annotations

import time

import pytest

from sessionstore.checkpoint.storage.filesystem import open_filesystem
from spark_integration import StateBackend
from spark_integration.coordinator.server import driver_coordinator
from spark_integration.planning.resolve import PARTITIONS_CONF
from tests.models import offline_sessions
from tests.object_stores import (
    moto_s3_server,
    new_bucket,
    reset_s3_request_counts,
    s3_request_counts,
)
from tests.spark.streams import without_due_batches
from tests.spark.test_sessionize import GAP_MS, generated, run_query

pytestmark = pytest.mark.slow

#: Spark tasks per micro-batch of the tests' local[2] session.
TASKS = 2
#: The goal of issue #16: object-store requests per database (what a state
#: partition of its own was) and micro-batch, on average, snapshots included.
BUDGET = 4.0


def settled_counts(options, quiet_s=3.0, timeout_s=120.0):
    """The request counts once they stop changing (background snapshot uploads of the
    Python workers run after their task)."""
    deadline = time.monotonic() + timeout_s
    counts = s3_request_counts(options)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = s3_request_counts(options)
        if again == counts:
            return counts
        counts = again
    return counts


def requests_at(spark, tmp_path, options, partitions, batches):
    """Run sessionize over ``batches`` at ``partitions`` partitions on the S3
    endpoint (a snapshot of every database at version 10); ``(request counts,
    output rows, the layout recorded, the snapshots of each database)``."""
    from sessionstore.tools.reader import CheckpointSource

    name = f"many{partitions}"
    uri = f"s3://{new_bucket(options)}/ck"
    backend = StateBackend(
        uri, local_dir=str(tmp_path / name), storage_options=options, snapshot_interval=10
    )
    # sessionize's partition count (spark.sql.shuffle.partitions is not used)
    spark.conf.set(PARTITIONS_CONF, str(partitions))
    reset_s3_request_counts(options)
    try:
        # the tasks' requests per file's batch (the due source's reads on the
        # driver: docs/event-time.md, "Quiet streams")
        with without_due_batches(spark):
            rows = run_query(spark, tmp_path / f"in{partitions}", tmp_path, name, backend, batches)
    finally:
        spark.conf.set(PARTITIONS_CONF, "2")  # as the tests' session has it
    counts = settled_counts(options)
    # read after the count: the test's own requests
    layout = CheckpointSource(uri, options).layout(name)
    operator = open_filesystem(uri, options).child(name)
    snapshots = {p: operator.list(f"{p}/snapshot") for p in range(layout[0])}
    return counts, rows, layout, snapshots, uri


def test_requests_per_task_do_not_grow_with_the_partitions_a_task_runs(spark, tmp_path):
    """12 micro-batches at 8 and at 64 partitions per task (16 and 128 partitions in
    2 tasks): the same requests per task and micro-batch within one; the
    partitions are kept in the same 4 databases (2 per task), each snapshotted at
    version 10, at most 4 requests per database and micro-batch, snapshots
    included; and every session of the six users
    closes, in partitions that get no data in the last batches (only one key, in
    one partition, arrives then)."""
    batches = generated(seed=8, batches=10, per_batch=60)
    per_task, expected_rows = {}, None
    with moto_s3_server(record=True) as options:
        for partitions in (8 * TASKS, 64 * TASKS):
            counts, rows, layout, snapshots, uri = requests_at(
                spark, tmp_path, options, partitions, batches
            )
            assert layout == (4, partitions)
            per_task[partitions] = sum(counts.values()) / (TASKS * len(batches))
            print(f"{partitions} partitions: requests per task per micro-batch "
                  f"{per_task[partitions]:.2f} {counts}")  # fmt: skip
            assert sum(counts.values()) / (layout[0] * len(batches)) <= BUDGET, counts
            # one PUT per database's changelog (no multipart upload: no POST), and no
            # per-task deletes
            assert counts.get("PUT", 0) >= layout[0] * len(batches)
            assert counts.get("POST", 0) == 0 and counts.get("DELETE", 0) == 0, counts
            assert all(names == ["10.manifest"] for names in snapshots.values()), snapshots
            assert_every_session_closed(rows, batches)
            if expected_rows is None:
                expected_rows = sorted(map(sorted, (r.items() for r in rows)))
            assert sorted(map(sorted, (r.items() for r in rows))) == expected_rows
            name = f"many{partitions}"
            coordinator = driver_coordinator()
            stats = coordinator.operator(coordinator.register(uri, name, 4, options)).stats
            assert stats["durable_reads"] == 0 and stats["answered_from_reports"] > 0, stats
            # every database reports each batch, a task's on one state server in one
            # request: at most 2 tasks x 4 servers (local[2]) per batch
            assert stats["reports"] == layout[0] * len(batches), stats
            assert stats["report_requests"] <= 2 * 4 * len(batches), stats
    assert abs(per_task[8 * TASKS] - per_task[64 * TASKS]) <= 1.0, per_task


def test_without_the_coordinator_tasks_read_the_durable_records(spark, tmp_path):
    """Turned off (or out of reach, as under Spark Connect), every task reads the
    operator's event time from the changelog headers: the same sessions close."""
    from spark_integration.coordinator.server import ENABLED_CONF

    batches = generated(seed=4)
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    spark.conf.set(ENABLED_CONF, "false")
    try:
        # the tasks of the files' batches (the two closing files close every
        # session): the due source's reads are the driver's, not a task's
        with without_due_batches(spark):
            rows = run_query(spark, tmp_path / "in", tmp_path, "alone", backend, batches)
    finally:
        spark.conf.unset(ENABLED_CONF)
    assert_every_session_closed(rows, batches)


def assert_every_session_closed(rows, batches):
    """The query emitted exactly the sessions of every event but the closing one's,
    though the last batches reached one partition only."""
    events = [(u, None, ts) for rows_ in batches for u, ts, _ in rows_ if u != "zz-close"]
    got = sorted(
        (r["user"], r["session_start"], r["session_end"], r["n"])
        for r in rows
        if r["user"] != "zz-close"
    )
    assert got == offline_sessions(events, GAP_MS)
