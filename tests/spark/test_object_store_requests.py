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

PARTITIONS = 32
#: The goal of issue #16: object-store requests per task and micro-batch, on average,
#: snapshots included.
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


def test_requests_per_task_at_32_partitions_stay_within_budget(spark, tmp_path):
    """12 micro-batches at 32 partitions, a snapshot of every partition at version
    10: at most 4 requests per task per micro-batch, and every session of the six
    users closes, in partitions that get no data in the last batches (only one key,
    in one partition, arrives then)."""
    batches = generated(seed=8, batches=10, per_batch=60)
    with moto_s3_server(record=True) as options:
        uri = f"s3://{new_bucket(options)}/ck"
        backend = StateBackend(
            uri, local_dir=str(tmp_path / "local"), storage_options=options, snapshot_interval=10
        )
        # sessionize's partition count (spark.sql.shuffle.partitions is not used)
        spark.conf.set(PARTITIONS_CONF, str(PARTITIONS))
        reset_s3_request_counts(options)
        try:
            # the tasks' requests per file's batch (the due source's reads on the
            # driver: docs/event-time.md, "Quiet streams")
            with without_due_batches(spark):
                rows = run_query(spark, tmp_path / "in", tmp_path, "many", backend, batches)
        finally:
            spark.conf.set(PARTITIONS_CONF, "2")  # as the tests' session has it
        counts = settled_counts(options)
        # the snapshots were taken and uploaded (read after the count: the test's own)
        operator = open_filesystem(uri, options).child("many")
        snapshots = {p: operator.list(f"{p}/snapshot") for p in range(PARTITIONS)}
    per_task = sum(counts.values()) / (PARTITIONS * len(batches))
    print(f"requests per task per micro-batch: {per_task:.2f} {counts}")
    assert per_task <= BUDGET, counts
    # one PUT per changelog (no multipart upload: no POST), and no per-task deletes
    assert counts.get("PUT", 0) >= PARTITIONS * len(batches)
    assert counts.get("POST", 0) == 0 and counts.get("DELETE", 0) == 0, counts
    assert all(names == ["10.manifest"] for names in snapshots.values()), snapshots
    assert_every_session_closed(rows, batches)
    stats = (
        driver_coordinator()
        .operator(driver_coordinator().register(uri, "many", PARTITIONS, options))
        .stats
    )
    assert stats["durable_reads"] == 0 and stats["answered_from_reports"] > 0, stats
    # every partition reports each batch, a task's partitions on one state server
    # in one request: at most 2 tasks x 4 servers (local[2]) per batch, not 32
    assert stats["reports"] == PARTITIONS * len(batches), stats
    assert stats["report_requests"] <= 2 * 4 * len(batches), stats


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
