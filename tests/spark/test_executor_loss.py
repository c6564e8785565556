"""Executor loss on local-cluster: state comes back from object storage.

Both cases run in one job (a ``local-cluster`` application in a process of its
own, ``executor_loss_job.py``): their queries side by side, one executor killed
under both, so the application's JVMs start once. The job is a background job
(``tests.background``), started when the suite's collection selects a case, so it
runs beside the tests before it; each case checks what its query wrote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import background
from tests.models import offline_sessions
from tests.object_stores import moto_s3_server, new_bucket
from tests.spark.executor_loss_job import loss_batches
from tests.spark.test_sessionize import GAP_MS
from tests.standalone.cluster import MARKER

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("executor_loss_job.py")
#: Each case: where its checkpoint is, and its partition count (None: the default)
CASES = [("file", None), ("s3", 32)]


def run_job(runs: dict, tmp_path: Path, tag: str | None = None) -> dict:
    out = tmp_path / "out.json"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        **({MARKER: tag} if tag else {}),
    }
    proc = subprocess.run(
        [sys.executable, str(JOB), str(tmp_path), str(out), json.dumps(runs)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def loss_job(tag: str) -> dict:
    """Every case's query in one job: on a local folder, and on a moto S3 server;
    the job's processes tagged ``tag``. Returns what the job wrote, with each
    case's local databases (``"homes"``: partition -> the executors' work
    directories that held one), read before the application's work directory is
    removed."""
    workdir = Path(tempfile.mkdtemp(prefix="sessionstore-loss-"))
    try:
        with moto_s3_server() as options:
            where = {
                "file": (f"file://{workdir}/state", {}),
                "s3": (f"s3://{new_bucket(options)}/checkpoints", dict(options)),
            }
            runs = {
                name: {"uri": where[name][0], "options": where[name][1], "partitions": partitions}
                for name, partitions in CASES
            }
            result = run_job(runs, workdir, tag)
        app_dir = Path(result["app_dir"])
        try:
            for name in runs:
                homes: dict[str, list[str]] = {}
                for db in app_dir.glob(f"*/sessionstore-local-{name}/loss/*/db"):
                    homes.setdefault(db.parent.name, []).append(db.parents[3].name)
                result["runs"][name]["homes"] = homes
        finally:
            shutil.rmtree(app_dir, ignore_errors=True)
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def background_jobs(item: pytest.Item) -> dict:
    """The cases' one job, started at collection (``tests.background``)."""
    return {"executor-loss": loss_job}


@pytest.mark.parametrize(("where", "partitions"), CASES)
def test_killing_an_executor_mid_stream_loses_nothing(where, partitions):
    """On a local folder at the default partition count, and on S3 at 32 partitions,
    where most partitions get no data, so their sessions close only through the
    event time the driver's coordinator shares (issue #16)."""
    result = background.result("executor-loss", loss_job)
    assert len(result["killed"]) == 1  # an executor really died mid-stream
    run = result["runs"][where]
    batches = loss_batches()
    events = [(u, None, ts) for rows in batches for u, ts, _ in rows if u != "zz-close"]
    got = sorted(
        (r["user"], r["session_start"], r["session_end"], r["n"])
        for r in run["rows"]
        if r["user"] != "zz-close"
    )
    assert got == offline_sessions(events, GAP_MS)
    # the tasks of both executors reached the driver's coordinator
    assert run["coordinator"]["answered_from_reports"] > 0, run["coordinator"]
    # a partition ran on more than one executor, each with its own local directory:
    # the later one had no local copy and restored the state from object storage
    homes = run["homes"]
    assert homes and any(len(set(executors)) > 1 for executors in homes.values()), homes
