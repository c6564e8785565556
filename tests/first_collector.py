"""pytest-xdist's workers collect one after another: the first alone, then the rest.

Every worker imports every test module to collect the tests, and what it imports
(pytest's rewritten test modules, PySpark, pandas, this project) is compiled to
bytecode the first time, then read from the cache (``__pycache__``, or the run's
``PYTHONPYCACHEPREFIX``: tests/conftest.py ``bytecode_cache``). Workers that start
together all find the cache empty and each compiles everything: three workers
collecting at once on a fresh clone took 38 CPU-s, and 12 with a warm cache. So the
first worker (``gw0``) collects alone and leaves a flag when it is done; the others
wait for the flag, then collect from what it compiled. On a fresh clone the other
core is not idle meanwhile: it builds the run's class-data archive
(tests/jvm_archive.py). A worker waits :data:`WAIT_S` at most, so a first worker
that dies while collecting holds nobody up for long.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

#: The longest a worker waits for the first one's collection.
WAIT_S = 120.0
#: The worker that collects first.
FIRST = "gw0"


def flag_path(environ: os._Environ | dict = os.environ) -> Path | None:
    """The flag the first worker leaves when it has collected: one per run (xdist's
    ``PYTEST_XDIST_TESTRUNUID``), in the workers' temporary folder; None outside a
    pytest-xdist worker."""
    run, worker = environ.get("PYTEST_XDIST_TESTRUNUID"), environ.get("PYTEST_XDIST_WORKER")
    if not run or not worker:
        return None
    return Path(tempfile.gettempdir()) / f"sessionstore-collected-{run}"


def is_first(environ: os._Environ | dict = os.environ) -> bool:
    """Whether this process is the worker that collects first."""
    return environ.get("PYTEST_XDIST_WORKER") == FIRST


def wait_for_first(flag: Path, timeout: float = WAIT_S, poll: float = 0.05) -> bool:
    """Wait until ``flag`` exists, ``timeout`` seconds at most; whether it does."""
    deadline = time.monotonic() + timeout
    while not flag.exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def mark_collected(flag: Path) -> None:
    """Leave ``flag``: the first worker's collection is done."""
    flag.touch()


def before_collection() -> None:
    """In a worker other than the first: wait for the first one's flag."""
    flag = flag_path()
    if flag is not None and not is_first():
        wait_for_first(flag)


def after_collection() -> None:
    """In the first worker: leave the flag for the others."""
    flag = flag_path()
    if flag is not None and is_first():
        mark_collected(flag)


def at_session_end() -> None:
    """In the first worker: remove the flag (the others collected long before)."""
    flag = flag_path()
    if flag is not None and is_first():
        flag.unlink(missing_ok=True)
