"""The processing time of a partition without rows (transform_with_state), task by
task without a Spark session: what it costs in object-store requests and what a
retried or replayed task sees."""

from __future__ import annotations

import importlib
import time

import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import LongType, StringType, StructField, StructType

from sessionstore.checkpoint.records.layout import partition_changelog_header
from sessionstore.checkpoint.records.processing_time import PROCESSING_TIME_FIELD
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from spark_integration import StateBackend
from spark_integration.coordinator.server import Coordinator
from spark_integration.execution.context import TaskInfo
from tests.object_stores import (
    moto_s3_server,
    new_bucket,
    reset_s3_request_counts,
    s3_request_counts,
)
from tests.spark.fakes import run_task

tws = importlib.import_module("spark_integration.operators.transform_with_state.task")

SCHEMA = StructType([StructField("id", StringType()), StructField("now", LongType())])


class ReportsTime(StatefulProcessor):
    """A timer just after the processing time of the key's rows; when it fires (the
    next batch, rows or not), the processing time that batch saw."""

    def init(self, handle):
        self.handle = handle

    def handleInputRows(self, key, rows, timerValues):
        list(rows)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield Row(id=key[0], now=timerValues.getCurrentProcessingTimeInMs())

    def close(self):
        pass


def _task(backend: StateBackend, coordinator: Coordinator | None = None) -> tws.ProcessorTask:
    """The operator's task; with ``coordinator`` (as in Spark by default) its commits
    claim their version there, else they look before they write (one HEAD)."""
    address = None
    if coordinator is not None:
        address = coordinator.register(backend.checkpoint_uri, "times", 1, backend.storage_options)
    return tws.ProcessorTask(
        backend=backend, name="times", num_partitions=1, keys=["id"],
        input_columns=["id", "item"], processor=ReportsTime(), api="rows",
        time_mode="ProcessingTime", delay_ms=None,
        out_schema_json=SCHEMA.json(), key_types=["string"], coordinator=address,
    )  # fmt: skip


def _run(monkeypatch, task, info: TaskInfo, ids: list[str], now: int = 0) -> list[tuple]:
    """One task of ``info``'s batch over rows of ``ids`` (none: an empty partition),
    their processing time ``now``."""
    return run_task(
        monkeypatch, tws, task, info,
        {"id": ids, "item": ["x"] * len(ids), tws.NOW: [now] * len(ids)},
        pa.schema([("id", pa.string()), ("item", pa.string()), (tws.NOW, pa.int64())]),
    )  # fmt: skip


@pytest.fixture(scope="module")
def s3():
    with moto_s3_server(record=True) as options:
        yield options


@pytest.fixture(scope="module")
def coordinator():
    server = Coordinator()
    yield server
    server.stop()


def test_an_empty_partition_records_its_time_in_the_commit_and_a_replay_reads_it(
    tmp_path, monkeypatch, s3, coordinator
):
    uri = f"s3://{new_bucket(s3)}/ck"
    backend = StateBackend(
        uri, local_dir=str(tmp_path / "local"), storage_options=s3, snapshot_interval=100
    )
    task = _task(backend, coordinator)
    assert _run(monkeypatch, task, TaskInfo(0, 0, 0, "run-1"), ["a", "b"], now=1_000) == []
    reset_s3_request_counts(s3)
    before = int(time.time() * 1000)
    fired = _run(monkeypatch, task, TaskInfo(0, 1, 0, "run-1"), [])
    # the first attempt of an empty partition's batch: the commit and nothing else
    assert s3_request_counts(s3) == {"PUT": 1}
    (_, now1), (_, also) = fired
    assert now1 == also >= before
    operator = open_filesystem(uri, s3).child("times")
    assert partition_changelog_header(operator, 0, 2)[PROCESSING_TIME_FIELD] == now1
    # the next empty batch of the same run: the commit alone again (no object
    # written, none deleted)
    reset_s3_request_counts(s3)
    assert _run(monkeypatch, task, TaskInfo(0, 2, 0, "run-1"), []) == []
    assert s3_request_counts(s3) == {"PUT": 1}

    time.sleep(0.01)
    # a retry of batch 1 after its commit, and a replay of it by a restarted query
    # (another run): the time of the first attempt, not the wall clock
    assert _run(monkeypatch, task, TaskInfo(0, 1, 1, "run-1"), []) == fired
    assert _run(monkeypatch, task, TaskInfo(0, 1, 0, "run-2"), []) == fired
    fresh = _task(
        StateBackend(uri, local_dir=str(tmp_path / "fresh"), storage_options=s3,
                     snapshot_interval=100)
    )  # fmt: skip
    assert _run(monkeypatch, fresh, TaskInfo(0, 1, 0, "run-3"), []) == fired


def test_a_new_run_past_the_last_commit_takes_the_wall_clock(
    tmp_path, monkeypatch, s3, coordinator
):
    """The first batch of a restarted query that is not a replay finds no commit of
    its batch: one read more than the commit, and the wall clock."""
    uri = f"s3://{new_bucket(s3)}/ck"
    backend = StateBackend(
        uri, local_dir=str(tmp_path / "local"), storage_options=s3, snapshot_interval=100
    )
    task = _task(backend, coordinator)
    _run(monkeypatch, task, TaskInfo(0, 0, 0, "run-1"), ["a"], now=1_000)
    reset_s3_request_counts(s3)
    before = int(time.time() * 1000)
    [(_, now)] = _run(monkeypatch, task, TaskInfo(0, 1, 0, "run-2"), [])
    assert now >= before
    counts = s3_request_counts(s3)
    assert counts.pop("PUT") == 1 and set(counts) <= {"GET", "HEAD"}, counts
    # the changelog's name, and an older release's; and, the first load of a new
    # run by a warm provider, the checkpoint's _metadata (HEAD and GET, invariant 9)
    assert sum(counts.values()) <= 4, counts
