"""The initial state of transform_with_state in the checkpoint, planning by planning
and task by task without a Spark session: which planning runs the routing job and
writes a copy, which reuses the copy batch 0 ran with, and when it is deleted."""

from __future__ import annotations

import importlib

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from sessionstore.checkpoint.records.layout import INITIAL_STATE_DIR, initial_state_complete_name
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from spark_integration import StateBackend
from spark_integration.execution.context import TaskInfo
from spark_integration.operators.transform_with_state.initial_state import PID, initial_state_token
from tests.object_stores import (
    moto_s3_server,
    new_bucket,
    reset_s3_request_counts,
    s3_request_counts,
)
from tests.spark import processors as P
from tests.spark.fakes import run_task

tws = importlib.import_module("spark_integration.operators.transform_with_state.task")

NAME = "tracker"
N = 2
#: P.OUT_SCHEMA, built without a Spark session
OUT = StructType(
    [
        StructField("id", StringType()),
        StructField("total", LongType()),
        StructField("distinct_items", LongType()),
        StructField("recent", StringType()),
    ]
)
#: The initial state as the routing job returns it: ``a`` in partition 0, ``e``
#: and ``z`` in partition 1 (RowTracker seeds a key's count with ``start``).
ROUTED = pa.table(
    {
        "id": ["a", "e", "z"],
        "start": [100, 7, 1],
        PID: pa.array([0, 1, 1], pa.int32()),
    }
)


class Planner:
    """The planning of a query with the initial state :data:`ROUTED`, counting the
    routing jobs it runs."""

    def __init__(self, backend: StateBackend) -> None:
        self.operator = open_filesystem(backend.checkpoint_uri, backend.storage_options).child(NAME)
        self.jobs = 0

    def _route(self) -> pa.Table:
        self.jobs += 1
        return ROUTED

    def plan(self) -> str | None:
        return initial_state_token(self.operator, N, self._route)

    def objects(self) -> list[str]:
        return self.operator.list_files(INITIAL_STATE_DIR)


def _task(backend: StateBackend, token: str | None) -> tws.ProcessorTask:
    return tws.ProcessorTask(
        backend=backend, name=NAME, num_partitions=N, keys=["id"],
        input_columns=["id", "item"], processor=P.RowTracker(), api="rows",
        time_mode="None", delay_ms=None, out_schema_json=OUT.json(), initial=token,
        key_types=["string"],
    )  # fmt: skip


def _run(monkeypatch, task, info: TaskInfo, rows: list[tuple[str, str]]) -> list[tuple]:
    """One task of ``info``'s batch and partition over ``(id, item)`` rows."""
    return run_task(
        monkeypatch, tws, task, info,
        {"id": [r[0] for r in rows], "item": [r[1] for r in rows]},
        pa.schema([("id", pa.string()), ("item", pa.string())]),
    )  # fmt: skip


@pytest.fixture(scope="module")
def s3():
    with moto_s3_server(record=True) as options:
        yield options


@pytest.fixture
def backend(tmp_path, s3):
    return StateBackend(
        f"s3://{new_bucket(s3)}/ck", local_dir=str(tmp_path / "local"), storage_options=s3,
        snapshot_interval=100,
    )  # fmt: skip


def test_a_restart_in_batch_0_runs_no_job_writes_nothing_and_a_partition_gets_its_rows(
    backend, s3, tmp_path, monkeypatch
):
    planner = Planner(backend)
    token = planner.plan()
    assert planner.jobs == 1
    assert planner.objects() == [f"{token}/0", f"{token}/1", f"{token}/complete"]
    # batch 0 commits in partition 0, then the query stops
    a = _run(monkeypatch, _task(backend, token), TaskInfo(0, 0, 0, "run-1"), [("a", "x")])
    assert a == [("a", 101, 1, "x")]  # the initial state seeded a's count

    reset_s3_request_counts(s3)
    assert planner.plan() == token  # the restart's planning: the copy batch 0 ran with
    assert planner.jobs == 1
    # no write: _metadata's look-up, two listings per partition, the copy's listing
    assert s3_request_counts(s3) == {"HEAD": 1, "GET": 5}
    assert planner.objects() == [f"{token}/0", f"{token}/1", f"{token}/complete"]

    # partition 1 runs batch 0 in the restarted query (another machine): its rows
    fresh = StateBackend(
        backend.checkpoint_uri, local_dir=str(tmp_path / "fresh"),
        storage_options=backend.storage_options, snapshot_interval=100,
    )  # fmt: skip
    e = _run(monkeypatch, _task(fresh, token), TaskInfo(1, 0, 0, "run-2"), [("e", "q")])
    assert e == [("e", 8, 1, "q")]


def test_the_copy_stays_while_batch_0_may_be_replayed_and_goes_after_batch_1(
    backend, s3, tmp_path, monkeypatch
):
    planner = Planner(backend)
    token = planner.plan()
    task = _task(backend, token)
    first = _run(monkeypatch, task, TaskInfo(0, 0, 0, "run-1"), [("a", "x")])
    assert _run(monkeypatch, task, TaskInfo(1, 0, 0, "run-1"), [("b", "y")]) == [("b", 1, 1, "y")]
    # every partition committed batch 0, but Spark's commit log may lack it (the
    # sink failed): a restarted query replays batch 0 from version 0, initial state
    # included, so the copy stays
    assert planner.plan() == token and planner.jobs == 1
    replay = _task(backend, token)
    assert _run(monkeypatch, replay, TaskInfo(0, 0, 0, "run-2"), [("a", "x")]) == first
    assert planner.objects() == [f"{token}/0", f"{token}/1", f"{token}/complete"]
    # partition 0 commits batch 1: Spark had recorded batch 0, it never runs again
    assert _run(monkeypatch, replay, TaskInfo(0, 1, 0, "run-2"), [("a", "y")]) == [
        ("a", 102, 2, "x,y")
    ]
    assert planner.plan() is None  # the next planning deletes the copy, runs no job
    assert planner.jobs == 1
    assert planner.objects() == []
    # and a later one only looks: _metadata, partition 0's two listings, the copy's
    reset_s3_request_counts(s3)
    assert planner.plan() is None and planner.jobs == 1
    assert s3_request_counts(s3) == {"HEAD": 1, "GET": 3}
    # the tasks of the restarted query carry no token and run as before
    later = _task(backend, None)
    assert _run(monkeypatch, later, TaskInfo(0, 2, 0, "run-3"), [("a", "z")]) == [
        ("a", 103, 3, "x,y,z")
    ]


def test_without_a_commit_or_a_whole_copy_a_planning_writes_a_new_copy(backend, monkeypatch):
    planner = Planner(backend)
    old = planner.plan()
    # planned again before any commit: the initial state given now is the one the
    # first batch takes (the earlier copy goes)
    token = planner.plan()
    assert planner.jobs == 2 and token != old
    assert planner.objects() == [f"{token}/0", f"{token}/1", f"{token}/complete"]
    _run(monkeypatch, _task(backend, token), TaskInfo(0, 0, 0, "run-1"), [("a", "x")])
    # a copy without its complete object (an earlier release's, or one whose
    # writing stopped): the planning writes a whole one
    planner.operator.delete(initial_state_complete_name(token))
    new = planner.plan()
    assert planner.jobs == 3 and new != token
    assert planner.objects() == [f"{new}/0", f"{new}/1", f"{new}/complete"]
