"""Run sessionize queries side by side on one local-cluster[2,1,1024] application
and kill an executor between batches.

Usage: python executor_loss_job.py WORKDIR OUT_JSON RUNS_JSON, where RUNS_JSON is
``{run: {"uri": CHECKPOINT_URI, "options": STORAGE_OPTIONS, "partitions": N or
null}}``. Every run's query gets the same batches, one file each, in lockstep
(``tests.spark.suite_a_streams.Streams``), and the executor dies under all of them
at once: one application (a driver and its executors, each a JVM) serves every
case. Prints nothing useful; writes every run's emitted rows with the driver's
event-time coordinator's counters for its operator, the killed pid and the
application's work directory to OUT_JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spark_integration import StateBackend, sessionize  # noqa: E402
from spark_integration.conf.local_spark import local_spark  # noqa: E402
from tests.spark.streams import json_source, write_json  # noqa: E402
from tests.spark.suite_a_streams import Streams  # noqa: E402
from tests.spark.test_sessionize import GAP_MS, SCHEMA, generated, rows_of  # noqa: E402
from tests.standalone.cluster import EXECUTOR_CLASS, MARKER, processes_of  # noqa: E402

KILL_AFTER = 1  # files: a data file before the kill, one and the closing ones after


def loss_batches() -> list[list[tuple]]:
    """Every run's input: the 200 events of ``generated(seed=21)``'s 5 default
    batches (the same draws) in 2 data files, then the two closing files: the
    sessions open after the first file (one per user) close after the kill, some
    with rows of both files. The application's CPU goes by micro-batches (each
    file's, and a due-only batch after it), under every run's query, not by rows."""
    return generated(seed=21, batches=2, per_batch=100)


def executors() -> list[int]:
    """The executors of this job: those carrying its tag when it has one (other
    Spark applications may run on the machine), else every executor."""
    tag = os.environ.get(MARKER)
    if tag:
        return sorted(p.pid for p in processes_of(tag) if EXECUTOR_CLASS in p.cmdline)
    out = subprocess.run(
        ["pgrep", "-f", "CoarseGrainedExecutorBackend"], capture_output=True, text=True
    )
    return [int(pid) for pid in out.stdout.split()]


def local_dir(run: str) -> str:
    """A run's local directory, relative: each executor resolves it in its own work
    directory, so a partition that moves to the other executor has no local copy
    and restores from the store. One per run: the runs' queries share executors."""
    return f"sessionstore-local-{run}"


def main() -> None:
    workdir, out_path, runs = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    spark = local_spark(
        "executor-loss", master="local-cluster[2,1,1024]", spark__sessionstore__partitions="2"
    )
    batches = loss_batches()
    killed: list[int] = []
    with Streams() as streams:
        steps = {}
        for run, spec in runs.items():
            backend = StateBackend(
                spec["uri"], local_dir=local_dir(run), storage_options=spec["options"]
            )
            source = workdir / run / "in"
            out = sessionize(
                json_source(spark, source, SCHEMA), key="user", timestamp="ts",
                gap=f"{GAP_MS} ms", aggregations={"n": "count", "spent": ("sum", "amount")},
                backend=backend, name="loss", num_partitions=spec["partitions"],
            )  # fmt: skip
            streams.start(run, out, workdir / run / "spark-ckpt")
            steps[run] = [
                lambda source=source, i=i, rows=rows: write_json(source, i, rows_of(rows))
                for i, rows in enumerate(batches)
            ]
        for i in range(len(batches)):
            if i == KILL_AFTER:  # mid-stream, under every run's query
                victims = executors()
                os.kill(victims[0], signal.SIGKILL)
                killed.append(victims[0])
            streams.step({run: each[i] for run, each in steps.items()})
        rows = {run: streams.rows(run) for run in runs}
    import pyspark

    # local-cluster workers keep executor work dirs under <SPARK_HOME>/work/<app id>
    spark_home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    app_dir = os.path.join(spark_home, "work", spark.sparkContext.applicationId)
    from sessionstore.checkpoint.partition.identity import recorded_partitions
    from spark_integration.coordinator.server import driver_coordinator

    coordinator = driver_coordinator()
    stats = {  # the operator as the coordinator knows it: by its databases
        run: coordinator.operator(
            coordinator.register(
                spec["uri"], "loss", recorded_partitions(spec["uri"], "loss", spec["options"]),
                spec["options"],
            )
        ).stats
        for run, spec in runs.items()
    }
    spark.stop()
    result = {
        "runs": {run: {"rows": rows[run], "coordinator": stats[run]} for run in runs},
        "killed": killed,
        "app_dir": app_dir,
    }
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
