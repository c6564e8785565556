"""Executor loss on local-cluster: state comes back from object storage.

Each case's job (a ``local-cluster`` application in a process of its own) is a
background job (``tests.background``), started when the suite's collection selects
the case, so it runs beside the tests before it; the test checks what it wrote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import background
from tests.models import offline_sessions
from tests.object_stores import moto_s3_server, new_bucket
from tests.spark.test_sessionize import GAP_MS, generated
from tests.standalone.cluster import MARKER

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("executor_loss_job.py")


def run_job(uri, options, tmp_path, partitions=None, tag=None):
    out = tmp_path / "out.json"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        **({MARKER: tag} if tag else {}),
    }
    proc = subprocess.run(
        [sys.executable, str(JOB), uri, json.dumps(options or {}), str(tmp_path), str(out)]
        + ([str(partitions)] if partitions else []),
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def loss_job(where: str, partitions: int | None) -> Callable[[str], dict]:
    """The job of one case: on a local folder, or on a moto S3 server of its own;
    its processes tagged with the job's tag. Returns what the job wrote."""

    def run(tag: str) -> dict:
        workdir = Path(tempfile.mkdtemp(prefix=f"sessionstore-loss-{where}-"))
        try:
            if where == "file":
                return run_job(f"file://{workdir}/state", None, workdir, partitions, tag)
            with moto_s3_server() as options:
                uri = f"s3://{new_bucket(options)}/checkpoints"
                return run_job(uri, dict(options), workdir, partitions, tag)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    return run


def background_jobs(item: pytest.Item) -> dict:
    """Each selected case's job, started at collection (``tests.background``)."""
    where, partitions = item.callspec.params["where"], item.callspec.params["partitions"]
    return {f"executor-loss-{where}": loss_job(where, partitions)}


@pytest.mark.parametrize(("where", "partitions"), [("file", None), ("s3", 32)])
def test_killing_an_executor_mid_stream_loses_nothing(where, partitions):
    """On a local folder at the default partition count, and on S3 at 32 partitions,
    where most partitions get no data, so their sessions close only through the
    event time the driver's coordinator shares (issue #16)."""
    result = background.result(f"executor-loss-{where}", loss_job(where, partitions))
    assert len(result["killed"]) == 1  # an executor really died mid-stream
    batches = generated(seed=21)
    events = [(u, None, ts) for rows in batches for u, ts, _ in rows if u != "zz-close"]
    got = sorted(
        (r["user"], r["session_start"], r["session_end"], r["n"])
        for r in result["rows"]
        if r["user"] != "zz-close"
    )
    assert got == offline_sessions(events, GAP_MS)
    # the tasks of both executors reached the driver's coordinator
    assert result["coordinator"]["answered_from_reports"] > 0, result["coordinator"]
    # a partition ran on more than one executor, each with its own local directory:
    # the later one had no local copy and restored the state from object storage
    app_dir = Path(result["app_dir"])
    try:
        homes: dict[str, set[str]] = {}
        for db in app_dir.glob("*/sessionstore-local/loss/*/db"):
            homes.setdefault(db.parent.name, set()).add(db.parents[3].name)
        assert homes and any(len(executors) > 1 for executors in homes.values()), homes
    finally:
        shutil.rmtree(app_dir, ignore_errors=True)
