"""A query started again on a deleted checkpoint, in the same SparkSession: its
state servers keep their providers of the old checkpoint warm, and none of that
state reaches the new one (DESIGN.md invariant 9)."""

from __future__ import annotations

import shutil

import pytest

from sessionstore.tools.reader import CheckpointSource, store_rows
from spark_integration import StateBackend
from tests.spark.test_sessionize import generated, run_query

pytestmark = pytest.mark.slow


def state_rows(uri, name):
    source = CheckpointSource(uri, {})
    (store,) = source.store_records(name)
    return sorted(map(repr, store_rows(source, name, store)))


def test_a_query_started_again_on_a_deleted_checkpoint_equals_a_fresh_run(spark, tmp_path):
    """sessionize runs 2 micro-batches and stops; its checkpoint (Spark's and the
    state's) is deleted, and a query over other input starts at the same place:
    its output equals the same query's on a new checkpoint, and so does the state
    it leaves, as a reader restores it."""
    old, new = generated(seed=5)[:2], generated(seed=6)[:2]
    uri = f"file://{tmp_path}/state"
    backend = StateBackend(uri, local_dir=str(tmp_path / "local"))
    run_query(spark, tmp_path / "in-old", tmp_path, "reset", backend, old, emit="update")
    shutil.rmtree(tmp_path / "state")
    shutil.rmtree(tmp_path / "spark-ckpt-reset")
    again = run_query(spark, tmp_path / "in-new", tmp_path, "reset", backend, new, emit="update")
    fresh_uri = f"file://{tmp_path}/fresh/state"
    fresh_backend = StateBackend(fresh_uri, local_dir=str(tmp_path / "fresh" / "local"))
    (tmp_path / "fresh").mkdir(exist_ok=True)
    fresh = run_query(
        spark, tmp_path / "in-fresh", tmp_path / "fresh", "reset", fresh_backend, new,
        emit="update",
    )  # fmt: skip
    assert [sorted(map(repr, rows)) for rows in again] == [
        sorted(map(repr, rows)) for rows in fresh
    ]
    assert any(again)
    want = state_rows(fresh_uri, "reset")
    assert want and state_rows(uri, "reset") == want
