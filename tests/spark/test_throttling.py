"""A Spark query against an S3 endpoint that throttles: 20% of its requests are
answered ``503 SlowDown`` (tests/object_stores.py). The retry policy
(sessionstore/checkpoint/storage/retry.py) absorbs them: no task attempt fails and the
output is an unthrottled run's (the same query and settings on a file store: what a
query emits does not depend on where its state lives, and the run on S3 is the
throttled one)."""

from __future__ import annotations

import pytest

from spark_integration import StateBackend
from tests.object_stores import new_bucket, s3_request_counts
from tests.spark.test_sessionize import as_sessions, generated, run_query

pytestmark = pytest.mark.slow


def failed_task_attempts(spark, first: int = 0) -> tuple[int, int]:
    """Failed task attempts of the stages with ids from ``first`` on that Spark's
    status tracker still holds, and the id after the newest of them. The tracker
    keeps only the newest stages (``spark.ui.retainedStages``), so a long session
    has a prefix of forgotten ids: count from an id taken before the query."""
    tracker = spark.sparkContext.statusTracker()
    total, stage, seen, unknown = 0, first, False, 0
    while unknown < 200:  # 200 unknown ids after a known one: past the newest
        info = tracker.getStageInfo(stage)
        stage += 1
        if info is None:
            if seen:
                unknown += 1
            elif stage - first > 200_000:
                break
            continue
        seen, unknown = True, 0
        total += info.numFailedTasks
    return total, (stage - unknown) if seen else first


def test_sessionize_against_a_throttling_store_equals_an_unthrottled_run(
    spark, tmp_path, s3_throttling_server
):
    batches = generated(seed=11, batches=6, per_batch=50)
    plain = StateBackend(
        f"file://{tmp_path}/plain", local_dir=str(tmp_path / "l1"), snapshot_interval=3
    )
    expected = run_query(spark, tmp_path / "in1", tmp_path, "plain", plain, batches)
    assert len(expected) > 10

    options = dict(s3_throttling_server)
    for _ in range(20):  # creating the bucket is the test's, not retried by the policy
        try:
            bucket = new_bucket(options)
            break
        except OSError:
            continue
    throttled = StateBackend(
        f"s3://{bucket}/ck", local_dir=str(tmp_path / "l2"), storage_options=options,
        snapshot_interval=3, retry_max_attempts=12, retry_max_seconds=60,
    )  # fmt: skip
    _, first = failed_task_attempts(spark)
    got = run_query(spark, tmp_path / "in2", tmp_path, "throttled", throttled, batches)
    failed, after = failed_task_attempts(spark, first)
    assert after > first  # the query's stages were counted
    assert failed == 0  # every request retried within its task
    assert s3_request_counts(options)["SlowDown"] > 5
    assert as_sessions(got) == as_sessions(expected)
    assert sorted(map(str, got)) == sorted(map(str, expected))
