"""Run sessionize on local-cluster[2,1,1024] and kill an executor between batches.

Usage: python executor_loss_job.py CHECKPOINT_URI STORAGE_OPTIONS_JSON WORKDIR OUT_JSON
[PARTITIONS]. Prints nothing useful; writes every emitted row to OUT_JSON, with the
driver's event-time coordinator's counters.
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
from tests.spark.streams import json_source, run_stream, write_json  # noqa: E402
from tests.spark.test_sessionize import GAP_MS, SCHEMA, generated, rows_of  # noqa: E402
from tests.standalone.cluster import EXECUTOR_CLASS, MARKER, processes_of  # noqa: E402

KILL_AFTER = 2  # batches


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


def main() -> None:
    uri, options, workdir, out_path = (
        sys.argv[1],
        json.loads(sys.argv[2]),
        Path(sys.argv[3]),
        sys.argv[4],
    )
    partitions = int(sys.argv[5]) if len(sys.argv) > 5 else None
    spark = local_spark(
        "executor-loss", master="local-cluster[2,1,1024]", spark__sessionstore__partitions="2"
    )
    # relative: each executor resolves it in its own work directory, so a partition
    # that moves to the other executor has no local copy and restores from the store
    backend = StateBackend(uri, local_dir="sessionstore-local", storage_options=options)
    source = workdir / "in"
    out = sessionize(
        json_source(spark, source, SCHEMA), key="user", timestamp="ts", gap=f"{GAP_MS} ms",
        aggregations={"n": "count", "spent": ("sum", "amount")}, backend=backend, name="loss",
        num_partitions=partitions,
    )  # fmt: skip
    killed = []

    def step(i, rows):
        def run():
            if i == KILL_AFTER:
                victims = executors()
                os.kill(victims[0], signal.SIGKILL)
                killed.append(victims[0])
            write_json(source, i, rows_of(rows))

        return run

    steps = [step(i, rows) for i, rows in enumerate(generated(seed=21))]
    rows = run_stream(out, workdir / "spark-ckpt", steps)
    import pyspark

    # local-cluster workers keep executor work dirs under <SPARK_HOME>/work/<app id>
    spark_home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    app_dir = os.path.join(spark_home, "work", spark.sparkContext.applicationId)
    from spark_integration.coordinator.server import driver_coordinator

    coordinator = driver_coordinator()
    n = partitions or int(spark.conf.get("spark.sessionstore.partitions"))
    stats = coordinator.operator(coordinator.register(uri, "loss", n, options)).stats
    spark.stop()
    result = {"rows": rows, "killed": killed, "app_dir": app_dir, "coordinator": stats}
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
