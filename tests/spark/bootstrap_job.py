"""The commit of a bootstrap of tests/spark/test_bootstrap.py, as its driver runs
it after the Spark job, dying by SIGKILL at a step.

Usage: python bootstrap_job.py HANDOFF STEP AT: ``HANDOFF`` holds the pickled
arguments the driver passed to ``commit_bootstrap`` (every partition staged by the
job); the ``AT``-th call of ``STEP`` kills the process (``commit_change`` of the
bootstrap module: every partition staged, nothing committed; ``_apply_partition``
of change.py: committed, not applied). The driver's part after the job is pure
Python, so this process imports no Spark: it is that part, without a JVM to start.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import sessionstore.checkpoint.offline.bootstrap as bootstrap  # noqa: E402
import sessionstore.checkpoint.offline.change as change  # noqa: E402


def main() -> None:
    handoff, step, at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    module = bootstrap if hasattr(bootstrap, step) else change
    original, calls = getattr(module, step), []

    def dying(*args, **kw):
        calls.append(1)
        if len(calls) == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kw)

    setattr(module, step, dying)
    bootstrap.commit_bootstrap(*pickle.loads(handoff.read_bytes()))


if __name__ == "__main__":
    main()
