"""The README's "use it in your own PySpark job" example, run as written.

The block is taken from README.md, so the README cannot drift from the code. It
runs in a fresh Python process (its own SparkSession, with the README's settings)
in a scratch directory, since its paths are relative. Only its last line,
``query.awaitTermination()``, is replaced: the test feeds three files of clicks,
one micro-batch each, then stops the query and reads the sessions it wrote. The
process is a background job (``tests.background``), started when the suite's
collection selects the test, so it runs beside the tests before it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import background
from tests.packaging import checkout_pythonpath
from tests.standalone.cluster import MARKER

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Use it in your own PySpark job"
LAST_LINE = "query.awaitTermination()"

# Two users' clicks, then two far-future clicks: the event time shared between
# partitions lags one micro-batch, so the second one closes every earlier session.
BATCHES = [
    [
        {"user": "alice", "ts": "2023-11-15T10:00:00Z", "amount": 5},
        {"user": "bob", "ts": "2023-11-15T10:05:00Z", "amount": 2},
        {"user": "alice", "ts": "2023-11-15T10:29:00Z", "amount": 7},
        {"user": "alice", "ts": "2023-11-15T11:00:00Z", "amount": 1},
    ],
    [{"user": "zz-close", "ts": "2023-11-16T00:00:00Z", "amount": 0}],
    [{"user": "zz-close", "ts": "2023-11-16T00:00:01Z", "amount": 0}],
]

DRIVER = """
import json, os

def feed(index, rows):
    tmp = os.path.join("clicks", f".{index}.tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\\n" for r in rows)
    os.rename(tmp, os.path.join("clicks", f"{index}.json"))

for index, rows in enumerate(json.loads(os.environ["README_BATCHES"]), start=1):
    feed(index, rows)
    query.processAllAvailable()
query.stop()
out = spark.read.parquet("sessions/").selectExpr(
    "user", "cast(session_start as long) as start", "cast(session_end as long) as end",
    "clicks", "spent")
print("RESULT " + json.dumps(sorted(list(r) for r in out.collect())))
"""


def readme_job() -> str:
    """The first ``python`` block after the heading, without its last line."""
    text = (ROOT / "README.md").read_text()
    assert HEADING in text, f"README.md has no {HEADING!r} section"
    block = re.search(r"```python\n(.*?)```", text[text.index(HEADING) :], re.S)
    assert block, f"no python block under {HEADING!r}"
    lines = block.group(1).rstrip().splitlines()
    assert lines[-1] == LAST_LINE, f"the example should end with {LAST_LINE}, got {lines[-1]!r}"
    assert len(lines) <= 14, f"the example grew to {len(lines)} lines"
    return "\n".join(lines[:-1])


def run_readme_job(tag: str) -> subprocess.CompletedProcess:
    """The example, with the driver above, run in a scratch directory; its
    processes tagged ``tag``."""
    tmp_path = background.scratch("readme")
    (tmp_path / "clicks").mkdir()  # the job's input folder; files arrive while it runs
    (tmp_path / "job.py").write_text(readme_job() + "\n" + DRIVER)
    env = dict(
        os.environ,
        PYTHONPATH=checkout_pythonpath(),  # for the driver and the Python workers
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        README_BATCHES=json.dumps(BATCHES),
        **{MARKER: tag},
    )
    return subprocess.run(
        [sys.executable, "job.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def background_jobs(item: pytest.Item) -> dict:
    """The example's run, started at collection (``tests.background``)."""
    return {"readme": run_readme_job}


def test_readme_example_runs_and_writes_the_sessions():
    done = background.result("readme", run_readme_job)
    assert done.returncode == 0, done.stderr[-3000:]
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert result, done.stdout[-3000:] + done.stderr[-3000:]
    t = 1_700_042_400  # 2023-11-15T10:00:00Z in epoch seconds
    assert json.loads(result[0][len("RESULT ") :]) == [
        # 10:00 and 10:29 are 29 minutes apart: one session; 11:00 is 31 minutes later
        ["alice", t, t + 29 * 60, 2, 12],
        ["alice", t + 60 * 60, t + 60 * 60, 1, 1],
        ["bob", t + 5 * 60, t + 5 * 60, 1, 2],
    ]
