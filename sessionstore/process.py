"""Every piece of process-wide state, on one owner: :class:`Process`.

A Spark Python worker lives for many tasks, and what it keeps between them (a
RocksDB memory budget, its warm databases, a driver's coordinator, a helper
thread) belongs to the process, not to a task or an operator. Each piece is a
named slot of the one :class:`Process` of this process (:func:`this_process`),
made on first use by the module that owns its type; :data:`SLOTS` lists them
all, so that a reader finds every process-wide object here, and a test can start
from a clean one (:func:`reset_process`).

PySpark forks its workers from a daemon, and a forked child inherits the parent's
memory but not its threads, sockets' owners or locks' holders: so the owner
records its pid, and the first use in a child (another pid) gives the child a
new owner with empty slots. Only the once-per-process marks
(:meth:`Process.first_time`: a warning given, a store reached) carry over, as plain
memory does: a warning the daemon gave is not given again by each worker it forks.

This module imports nothing of sessionstore (the engine, the lowest layer, uses it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["Process", "SLOTS", "this_process", "reset_process", "use_process"]

T = TypeVar("T")

#: Every slot of process-wide state: its name, and the module that makes and uses it.
SLOTS = {
    # one block cache and write-buffer manager for every database of the process
    "memory_budget": "sessionstore.engine.memory",
    # the databases the process holds open (weakly), whose memory that budget counts
    "open_databases": "sessionstore.engine.db",
    # the warm providers (open databases) and the handover server of the process
    "store_service": "sessionstore.checkpoint.service.store_service",
    # the driver's coordinator (event time, commit arbiter, metrics), on the driver
    "coordinator": "spark_integration.coordinator.server",
    # the one helper thread that takes a task's state while it receives its input
    "helper_thread": "spark_integration.execution.partition_state",
    # the boto3 S3 client of each storage options (conditional creates on S3)
    "s3_clients": "sessionstore.checkpoint.storage.conditional_create",
    # the SparkContext's conf, by SparkContext (read once, through Py4J)
    "context_conf": "spark_integration.conf.spark_session",
    # a Spark Connect session's cluster core count, by session id (asked once)
    "parallelism": "spark_integration.conf.spark_session",
    # the most modules the process held at a freeze of its objects, and its freezes
    "frozen_imports": "spark_integration.execution.long_lived",
}


class Process:
    """The process-wide state of one process (see the module doc). Use
    :func:`this_process`."""

    def __init__(self, marks: Iterable[tuple[str, str]] = ()) -> None:
        self.pid = os.getpid()
        #: held while a slot is made or changed (reentrant: a maker may use another slot)
        self.lock = threading.RLock()
        self._slots: dict[str, Any] = {}
        self._marks = set(marks)

    def get(self, slot: str) -> Any | None:
        """The object in ``slot``, or None before it is made."""
        return self._slots.get(_known(slot))

    def get_or_make(self, slot: str, make: Callable[[], T]) -> T:
        """The object in ``slot``, made by ``make`` on first use (under :attr:`lock`;
        when ``make`` raises, the slot stays empty)."""
        with self.lock:
            value = self._slots.get(_known(slot))
            if value is None:
                value = self._slots[slot] = make()
            return value

    def marked(self, kind: str, key: str = "") -> bool:
        """Whether ``(kind, key)`` was marked (:meth:`mark`) in this process or the
        one it was forked from."""
        return (kind, key) in self._marks

    def mark(self, kind: str, key: str = "") -> None:
        """Remember that a once-per-process event ``kind`` (a warning, a log line, a
        store reached) happened for ``key``."""
        with self.lock:
            self._marks.add((kind, key))

    def first_time(self, kind: str, key: str = "") -> bool:
        """Mark ``(kind, key)``; True if it was not marked yet."""
        with self.lock:
            first = (kind, key) not in self._marks
            self._marks.add((kind, key))
            return first

    def forget(self, kind: str) -> None:
        """Forget every mark of ``kind``: its events happen once more (tests)."""
        with self.lock:
            self._marks = {mark for mark in self._marks if mark[0] != kind}


def _known(slot: str) -> str:
    if slot not in SLOTS:
        raise KeyError(f"no process-wide slot {slot!r} (the slots: {sorted(SLOTS)})")
    return slot


_current: Process | None = None
_guard = threading.Lock()


def _new_guard_in_child() -> None:
    """A child forked while another thread held the guard would wait on it forever."""
    global _guard
    _guard = threading.Lock()


os.register_at_fork(after_in_child=_new_guard_in_child)


def this_process() -> Process:
    """The owner of this process's state; a forked child's first call gives it its
    own, with empty slots and the parent's once-per-process marks."""
    global _current
    with _guard:
        current = _current
        if current is None or current.pid != os.getpid():
            current = _current = Process(() if current is None else current._marks)
        return current


def reset_process() -> Process:
    """Start this process over with an empty owner (tests). What the old one held is
    not closed: the caller closes what it made."""
    global _current
    with _guard:
        _current = Process()
        return _current


def use_process(owner: Process | None) -> Process | None:
    """Make ``owner`` the owner of this process's state (None: the next use makes
    a new one) and return the one it replaces (tests: a command run in the test's
    process gets an owner of its own, as its own process would, and the test's
    comes back after). The owner is the whole process's: every thread sees
    ``owner`` until the previous one is put back, so a caller must not run it
    beside threads that use process-wide state (a driver's coordinator, say)."""
    global _current
    with _guard:
        previous, _current = _current, owner
        return previous
