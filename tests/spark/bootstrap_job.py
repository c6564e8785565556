"""Bootstrap ``sessionize`` from the history of tests/spark/test_bootstrap.py and
die by SIGKILL at a step of the driver's part.

Usage: python bootstrap_job.py CHECKPOINT_URI LOCAL_DIR STEP AT: the ``AT``-th call
of ``STEP`` kills the process (``commit_change`` of the bootstrap module: every
partition staged, nothing committed; ``_apply_partition`` of change.py: committed,
not applied).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import sessionstore.checkpoint.offline.bootstrap as bootstrap  # noqa: E402
import sessionstore.checkpoint.offline.change as change  # noqa: E402
from spark_integration import StateBackend, bootstrap_sessionize  # noqa: E402
from spark_integration.conf.local_spark import local_spark  # noqa: E402
from tests.spark.test_bootstrap import SESSIONS, _history  # noqa: E402
from tests.spark.test_repartition import _batches  # noqa: E402


def main() -> None:
    uri, local_dir, step, at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    module = bootstrap if hasattr(bootstrap, step) else change
    original, calls = getattr(module, step), []

    def dying(*args, **kw):
        calls.append(1)
        if len(calls) == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kw)

    setattr(module, step, dying)
    spark = local_spark("bootstrap-killed", cores=1, spark__ui__enabled="false")
    backend = StateBackend(uri, local_dir=local_dir)
    bootstrap_sessionize(
        _history(spark, _batches()), **SESSIONS, backend=backend, name="sessions",
        num_partitions=2,
    )  # fmt: skip


if __name__ == "__main__":
    main()
