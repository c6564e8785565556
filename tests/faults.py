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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from sessionstore.checkpoint.partition.provider import CommitStep
from sessionstore.checkpoint.storage.filesystem import Storage

__all__ = [
    "KILL_STEPS", "KillAt", "FailOnceAfterCommit", "InjectedFailure", "pause_before_write",
    "slow_writes",
]  # fmt: skip

#: Where :class:`KillAt` can kill a committing writer, in commit order.
KILL_STEPS = ("before_upload", "mid_upload", "after_upload", "after_apply")


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_on_rename(*_: object) -> None:
    _kill()


#: The exclusive write, as :class:`KillAt` replaces it in a process about to die.
_write_exclusive = Storage.write_exclusive


def _kill_mid_put(storage: Storage, rel: str, data: bytes) -> None:
    """On an object store: start the PUT (GCS opens its resumable upload session
    here), send half the bytes and die before the upload completes (the same for a
    conditional create: a PUT that never completes). A local filesystem writes its
    temporary file and dies at the link that publishes it."""
    if isinstance(storage.fs, pafs.LocalFileSystem):
        _write_exclusive(storage, rel, data)  # os.link is _kill_on_rename by now
        return
    out = storage.fs.open_output_stream(storage.path(rel))
    out.write(data[: len(data) // 2])
    out.flush()
    _kill()


@dataclass(frozen=True)
class KillAt:
    """SIGKILL this process at ``step`` (one of :data:`KILL_STEPS`) of the commit of
    ``version``.

    ``mid_upload`` lets the changelog's upload write its temporary file and dies
    before the link (or rename) that would make it visible: what a writer killed mid-upload
    leaves on a local filesystem. On an object store (no rename there) it starts
    the PUT, sends half the changelog and dies before the upload completes, which
    must leave nothing visible. The process is about to die, so neither
    ``os.replace``, ``os.link`` nor ``Storage.write_atomic`` (``write_exclusive``) is put back.
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
            # the changelog's link (or rename) is the next one
            os.replace = os.link = _kill_on_rename
            # the next write is the changelog's (exclusive where the store has a fence)
            Storage.write_atomic = Storage.write_exclusive = _kill_mid_put
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


@contextmanager
def pause_before_write(prefix: str, during: Callable[[], None]) -> Iterator[list[str]]:
    """A storage wrapper: the first write under ``prefix`` (``"snapshot/"``: a
    manifest; ``"changelog/"``: the changelog a commit publishes, whether by an
    atomic or an exclusive write) by any :class:`Storage` of this process first
    calls ``during()``, which stands for whatever other executors do while this one
    is paused just before that write (after its listing, or its look for another
    attempt's changelog; it may raise, as a writer that dies there). Yields the
    names whose write was paused."""
    # a write names its target first, an upload (a file, or a pack streamed from
    # several) second
    writes = ("write_atomic", "write_exclusive", "upload_file", "upload_files")
    originals = {name: getattr(Storage, name) for name in writes}
    paused: list[str] = []

    def pausing(original: Callable[..., Any]) -> Callable[..., Any]:
        upload = original.__name__.startswith("upload")

        def write(storage: Storage, first: Any, second: Any) -> Any:
            rel = second if upload else first
            if rel.startswith(prefix) and not paused:
                paused.append(rel)
                during()
            return original(storage, first, second)

        return write

    for name, original in originals.items():
        setattr(Storage, name, pausing(original))
    try:
        yield paused
    finally:
        for name, original in originals.items():
            setattr(Storage, name, original)


@contextmanager
def slow_writes(prefix: str, seconds: float) -> Iterator[None]:
    """A slow store: every write under ``prefix`` by any :class:`Storage` of this
    process first waits ``seconds`` (the window between a maintenance's listing
    and its manifest write grows, so another executor's sweep falls into it)."""
    import time

    original = Storage.write_atomic

    def write_atomic(storage: Storage, rel: str, data: bytes) -> None:
        if rel.startswith(prefix):
            time.sleep(seconds)
        original(storage, rel, data)

    Storage.write_atomic = write_atomic  # type: ignore[method-assign]
    try:
        yield
    finally:
        Storage.write_atomic = original  # type: ignore[method-assign]
