"""The operators, the data source and ``log_state_metrics`` on a Spark Connect session
give what they give on a classic session, on the same input.

A real Connect server (``spark-submit --class ...SparkConnectServer``, the class
``sbin/start-connect-server.sh`` runs, from the PySpark distribution) runs as its
own process with a ``local[2]`` driver that has no Python of ours; a client process
(``tests.spark.connect_cases``) runs every case on one Connect session to it. The
classic side runs the same cases here, on the suite's ``local[2]`` session: one
Python process cannot hold both kinds of session (see ``connect_cases``). The
server and its client are a background job (``tests.background``), started when
the suite's collection selects these tests, so they run beside the tests before
them. Every process of theirs is tagged and ended by pid when the job ends,
whatever failed, and the job fails if one survives.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import background
from tests.jvm_archive import wait_for_build
from tests.packaging import checkout_pythonpath
from tests.spark.connect_cases import CASES, run_case
from tests.standalone.cluster import MARKER, end_processes, free_port, spark_home

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: The JVM class of a Spark Connect server.
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
OPERATORS = [
    "sessionize", "window_aggregate", "temporal_join", "window_join", "transform_with_state",
    "transform_with_state_in_pandas",
]  # fmt: skip


@contextmanager
def connect_server(workdir: Path, timeout: float = 180.0, tag: str | None = None) -> Iterator[str]:
    """A Spark Connect server on 127.0.0.1 (``local[2]``, the suite's settings),
    its log in ``workdir``; yields its ``sc://`` URL. Every process it started
    (the JVM, its Python workers and state servers), tagged ``tag`` (a new one by
    default), is ended when the block ends; ``RuntimeError`` if one survives."""
    tag, port = tag or uuid.uuid4().hex, free_port()
    env = {
        **os.environ, MARKER: tag, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": checkout_pythonpath(),
        "PYSPARK_PYTHON": sys.executable, "SPARK_HOME": str(spark_home()),
    }  # fmt: skip
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.shuffle.partitions": "2",
        "spark.python.unix.domain.socket.enabled": "true",
        "spark.sessionstore.partitions": "2",
    }
    args = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS]
    args += ["--master", "local[2,2]"]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    workdir.mkdir(parents=True, exist_ok=True)
    wait_for_build()  # the JVM maps the run's class-data archive (tests.jvm_archive)
    log = workdir / "connect-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            cwd=workdir, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while not _listening(port):
            if proc.poll() is not None:
                raise RuntimeError(f"the Connect server exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Connect server did not listen within {timeout:.0f} s")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        left = end_processes(tag, reap=proc.poll)
        proc.poll()
        if left:
            raise RuntimeError(f"processes survived the Connect server's stop: {left}")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def connect_side(tag: str) -> dict:
    """Every case on one Connect session: a server of its own and a client process,
    each process tagged ``tag``. ``{"returncode", "client_log"}`` (the log's last
    4,000 characters) and, when the client succeeded, ``"results"`` (its JSON: the
    cases and the lines its ``spark_integration`` loggers printed)."""
    workdir = Path(tempfile.mkdtemp(prefix="sessionstore-connect-"))
    out = workdir / "results.json"
    with connect_server(workdir, tag=tag) as url:
        with open(workdir / "client.log", "wb") as log:
            client = subprocess.Popen(
                [sys.executable, "-m", "tests.spark.connect_cases", url, str(out)],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": checkout_pythonpath(), MARKER: tag},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            returncode = client.wait(timeout=900)
        finally:
            end_processes(tag, reap=client.poll)  # the client, if it is still running
    side = {"returncode": returncode, "client_log": (workdir / "client.log").read_text()[-4000:]}
    if returncode == 0:
        side["results"] = json.loads(out.read_text())
        shutil.rmtree(workdir, ignore_errors=True)
    return side


def background_jobs(item: pytest.Item) -> dict:
    """The Connect side, started at collection (``tests.background``)."""
    return {"connect": connect_side}


@pytest.fixture(scope="module")
def results(spark):
    """Every case's result on the suite's classic session (``"classic"``) and on one
    Connect session (``"connect"``, with the lines the client's
    ``spark_integration`` loggers printed: ``"log"``). The Connect side runs in the
    background, from the suite's collection on."""
    classic = {name: run_case(spark, name) for name in CASES}
    connect = background.result("connect", connect_side)
    assert connect["returncode"] == 0, connect["client_log"]
    return {"classic": classic, **connect["results"]}


@pytest.mark.parametrize("name", OPERATORS)
def test_an_operator_gives_the_classic_output_over_connect(results, name):
    ours, theirs = results["cases"][name], results["classic"][name]
    assert theirs["error"] is None, theirs["error"]
    assert ours["error"] is None, ours["error"]
    ours, theirs = ours["result"], theirs["result"]
    if name == "sessionize":
        ours, theirs = ours["output"], theirs["output"]
    assert len(theirs["rows"]) > 0
    assert ours == theirs


def test_a_quiet_stream_closes_its_sessions_over_connect(results):
    """The due source works where the driver's Python is not ours: the first file's
    two sessions are written with no row after the one that closed them."""
    for side in ("cases", "classic"):
        case = results[side]["quiet_sessionize"]
        assert case["error"] is None, case["error"]
        assert case["result"]["rows"] == [["a", 2], ["b", 1]]


def test_an_available_now_run_ends_with_its_due_batch_over_connect(results):
    """The due source is asked before every batch of an ``availableNow`` run where
    the driver's Python is not ours: the run writes the sessions its last file
    closed, in a due-only batch after the two files' batches."""
    for side in ("cases", "classic"):
        case = results[side]["available_now_sessionize"]
        assert case["error"] is None, case["error"]
        assert case["result"] == {"rows": [["a", 2], ["b", 1]], "batches": 3}


def _sessionize(results: dict, side: str) -> dict:
    case = results["cases" if side == "connect" else "classic"]["sessionize"]
    assert case["error"] is None, case["error"]
    return case["result"]


def test_the_data_source_reads_the_classic_rows_over_connect(results):
    ours, theirs = _sessionize(results, "connect"), _sessionize(results, "classic")
    assert len(theirs["datasource"]["rows"]) > 3
    assert ours["datasource"] == theirs["datasource"]


def test_log_state_metrics_prints_the_classic_lines_over_connect(results):
    """Over Connect the listener runs in the client and reads observed metrics (no
    coordinator); the counts per batch equal the classic session's, which come from
    the driver's coordinator."""
    ours, theirs = _sessionize(results, "connect"), _sessionize(results, "classic")
    lines = theirs["metrics"]
    assert len(lines) == 5 and all(
        line.startswith("sessionstore sessionize batch") for line in lines
    )
    assert ours["metrics"] == lines


def test_without_a_coordinator_one_log_line_says_so(results):
    """The coordinator needs the driver's Python: a Connect client runs the
    operators without it, and says so once, not as an error."""
    # the rescale case logs its own lines (planning.rescale, planning.due_batches)
    lines = [line for line in results["log"] if "conf.spark_session" in line]
    assert len(lines) == 1, results["log"]
    line = lines[0]
    assert line.startswith("INFO spark_integration.conf.spark_session:")
    assert "Spark Connect session: no event-time coordinator" in line


def test_repartition_state_needs_a_classic_session(results):
    assert _sessionize(results, "classic")["repartition_state"]["rows"] > 0
    error = _sessionize(results, "connect")["repartition_state"]["error"]
    assert error.startswith("ClassicSessionRequired: repartition_state needs a classic")
    assert "run `sessionstore repartition` (the CLI)" in error


def test_rewrite_state_runs_through_the_connect_session(results):
    ours, theirs = _sessionize(results, "connect"), _sessionize(results, "classic")
    assert ours["rewrite_state"] == theirs["rewrite_state"]
    before, after = theirs["rewrite_state"]["before"], theirs["rewrite_state"]["after"]
    at = before["columns"].index("value")  # a struct of the aggregates
    doubled = [[*r[:at], {**r[at], "n": 2 * r[at]["n"]}, *r[at + 1 :]] for r in before["rows"]]
    assert after["columns"] == before["columns"] and after["rows"] == doubled
    assert all(r[at]["n"] > 0 for r in before["rows"])
    counts = theirs["rewrite_state"]["counts"]
    assert counts["rows"] == counts["changed"] == len(before["rows"]) > 0


def test_a_restart_with_another_count_rescales_over_connect(results):
    """Issue 41: the rescale on restart runs as DataFrame jobs of the Connect
    session; the output equals an uninterrupted run's (the sessionize case's query
    on the same events), as on a classic session, and the client logs one line
    saying what it did."""
    for side in ("cases", "classic"):
        case = results[side]["rescale"]
        assert case["error"] is None, case["error"]
        result = case["result"]
        full = results[side]["sessionize"]["result"]["output"]
        assert len(full["rows"]) > 3
        assert (result["rescaled"], result["generation"]) == (full, True)
    [line] = [line for line in results["log"] if "planning.rescale" in line]
    assert line.startswith("WARNING spark_integration.planning.rescale: sessionstore rescaled")
    assert "from 4 to 3 partitions at version 2" in line


def test_bootstrap_sessionize_runs_through_the_connect_session(results):
    """The bootstrap job runs as DataFrames of the Connect session; bootstrapped
    from the first batch and fed the rest, the query emits what the query run from
    the start emits, on both kinds of session."""
    for side in ("cases", "classic"):
        case = results[side]["bootstrap"]
        assert case["error"] is None, case["error"]
        done = case["result"]["done"]
        assert (done["version"], done["partitions"], done["events"]) == (0, 2, 25)
        full = results[side]["sessionize"]["result"]["output"]
        assert case["result"]["output"] == full and len(full["rows"]) > 3
