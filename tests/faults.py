"""Fault injection, plugged into production code only through its commit observer
(``StateStoreProvider(commit_observer=...)``, ``StateBackend(commit_observer=...)``),
the way Spark's tests plug a failure-injecting checkpoint file manager in.

Both observers are picklable frozen dataclasses with a value ``repr``: they reach
a subprocess by construction there and Spark's Python workers pickled with the
backend, and equal observers keep a worker's provider warm between tasks.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from sessionstore.checkpoint.provider import CommitStep

__all__ = ["KILL_STEPS", "KillAt", "FailOnceAfterCommit", "InjectedFailure"]

#: Where :class:`KillAt` can kill a committing writer, in commit order.
KILL_STEPS = ("before_upload", "mid_upload", "after_upload", "after_apply")


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_on_rename(*_: object) -> None:
    _kill()


@dataclass(frozen=True)
class KillAt:
    """SIGKILL this process at ``step`` (one of :data:`KILL_STEPS`) of the commit of
    ``version``.

    ``mid_upload`` lets the changelog's upload write its temporary file and dies
    before the rename that would make it visible: what a writer killed mid-upload
    leaves on a local filesystem (an object store shows nothing of an unfinished
    PUT). The process is about to die, so ``os.replace`` is not put back.
    """

    step: str
    version: int

    def __post_init__(self) -> None:
        if self.step not in KILL_STEPS:
            raise ValueError(f"step must be one of {KILL_STEPS}, got {self.step!r}")

    def __call__(self, event: CommitStep) -> None:
        if event.version != self.version:
            return
        if event.step == "prepared" and self.step == "before_upload":
            _kill()
        elif event.step == "prepared" and self.step == "mid_upload":
            os.replace = _kill_on_rename  # the upload's rename is the next one
        elif (event.step, self.step) in (("uploaded", "after_upload"), ("applied", "after_apply")):
            _kill()


class InjectedFailure(RuntimeError):
    """The failure :class:`FailOnceAfterCommit` raises."""


@dataclass(frozen=True)
class FailOnceAfterCommit:
    """Fail a task right after it committed its state, before its output reaches
    Spark (the worst moment for exactly-once): when the file
    ``<marker_dir>/fail-<batch>-<partition>`` exists, the commit of version
    ``batch + 1`` of that partition deletes it and raises, so the retried task
    finds no marker and succeeds."""

    marker_dir: str

    def __call__(self, event: CommitStep) -> None:
        if event.step != "applied":
            return
        batch = event.version - 1
        marker = os.path.join(self.marker_dir, f"fail-{batch}-{event.partition_id}")
        try:
            os.remove(marker)
        except FileNotFoundError:
            return
        raise InjectedFailure(
            f"injected failure after commit: batch {batch}, partition {event.partition_id}"
        )
