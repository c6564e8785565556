"""Slow out-of-process jobs of the suite, started as soon as collection has chosen
the tests that need them, so they run beside the tests before those.

A job is a process tree of its own (a Spark Connect server and its client, a
``local-cluster`` application) that a test only reads the result of. Run where its
test comes, it holds the suite up for a minute; started at collection, it runs
beside the mostly single-threaded engine and checkpoint tests on the other core,
and its test finds the result waiting. The background thread, and so every process
its jobs start, runs at nice :data:`NICE`: a job takes the CPU the suite leaves
idle, and slows the tests beside it little; once a test waits for a job, the job's
thread and processes go back to nice 0 where the system allows it (root, or
``CAP_SYS_NICE``). A test module opts in with a function
``background_jobs(item)`` that returns ``{key: job}`` for one of its items (a job
takes a tag and returns its result); ``tests/conftest.py`` asks every selected
item and starts what they name, one job after another in one thread, in the
order of the tests. A test reads the result with :func:`result`, which runs the
job in place when nothing started it (a test run in some other way).

Every process a job starts carries its tag (:data:`tests.standalone.cluster.MARKER`),
so :func:`stop_all`, at the end of the session, ends whatever a job left running
(a session cut short), each by its pid, and removes the folders jobs took with
:func:`scratch`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["Job", "NICE", "start", "result", "scratch", "stop_all"]

#: The niceness of the background thread and of the processes its jobs start.
NICE = 10


class Job:
    """One job: ``run(tag)`` in the background thread, its result or error kept."""

    def __init__(self, key: str, run: Callable[[str], Any]) -> None:
        self.key, self.run, self.tag = key, run, uuid.uuid4().hex
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def execute(self) -> None:
        try:
            self.value = self.run(self.tag)
        except BaseException as exc:  # kept for the test that reads it
            self.error = exc
        finally:
            self.done.set()


_jobs: dict[str, Job] = {}
_lock = threading.Lock()
_thread: threading.Thread | None = None
_scratch: list[Path] = []


def scratch(prefix: str) -> Path:
    """A new folder for a job, removed at the end of the session."""
    path = Path(tempfile.mkdtemp(prefix=f"sessionstore-{prefix}-"))
    _scratch.append(path)
    return path


def start(jobs: Iterable[tuple[str, Callable[[str], Any]]]) -> None:
    """Start ``(key, run)`` jobs not started yet, in this order, one after another
    in one background thread."""
    global _thread
    with _lock:
        new = [Job(key, run) for key, run in jobs if key not in _jobs]
        for job in new:
            _jobs[job.key] = job
    if not new:
        return
    # PySpark's package and its sql package import each other: imported for the
    # first time by the job's thread (a Spark home's lookup) while this thread
    # builds the suite's session, one of them finds the other half-initialised
    # (ImportError: "partially initialized module 'pyspark.sql'"), as a module run
    # alone did. Imported here first, both threads find them whole.
    import pyspark.sql  # noqa: F401

    def run_all() -> None:
        # Linux: a thread's own niceness, inherited by the processes it starts
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        for job in new:
            job.execute()

    _thread = threading.Thread(target=run_all, name="sessionstore-background", daemon=True)
    _thread.start()


def result(key: str, run: Callable[[str], Any], timeout: float = 1800.0) -> Any:
    """The result of job ``key``: waited for if it was started, else run here now.
    Re-raises the job's error."""
    with _lock:
        job = _jobs.get(key)
        if job is None:
            job = _jobs[key] = Job(key, run)
            here = True
        else:
            here = False
    if here:
        job.execute()
    elif not job.done.is_set():
        _renice(job.tag, 0)
    if not job.done.wait(timeout):
        raise TimeoutError(f"background job {key} did not finish within {timeout:.0f} s")
    if job.error is not None:
        raise job.error
    return job.value


def _renice(tag: str, nice: int) -> None:
    """Every thread of the background thread's and of ``tag``'s processes to
    ``nice``, where permitted (raising a priority needs privileges)."""
    from tests.standalone.cluster import processes_of

    tids = [] if _thread is None or _thread.native_id is None else [_thread.native_id]
    for proc in processes_of(tag):
        try:
            tids += [int(tid) for tid in os.listdir(f"/proc/{proc.pid}/task")]
        except OSError:  # gone meanwhile
            pass
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:  # not permitted, or gone
            pass


def stop_all() -> list[str]:
    """End the processes of every job still running (by their tag); returns the keys
    of those jobs."""
    from tests.standalone.cluster import end_processes

    running = [job for job in _jobs.values() if not job.done.is_set()]
    for job in running:
        end_processes(job.tag)
    if _thread is not None:
        _thread.join(timeout=60)
    for path in _scratch:
        shutil.rmtree(path, ignore_errors=True)
    return [job.key for job in running]
