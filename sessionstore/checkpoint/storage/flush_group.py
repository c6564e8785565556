"""When a local write reaches the disk: at once, or together with the others of a
flush group.

A local write (:meth:`~sessionstore.checkpoint.storage.filesystem.Storage.write_atomic`,
``write_exclusive``) is on disk once it returns: its file and the directories whose
entries changed are ``fsync``ed. Each ``fsync`` waits for a journal commit of its
own (about 1-4 ms on this project's machines, more under load), so a Spark task
that commits 100 partitions to a local checkpoint spent most of its time waiting
for 200 of them (BENCHMARKS.md, "Partitions per task").

Inside :func:`flush_group`, local writes of the calling thread are published as
usual (a reader sees the whole file or none; ``link`` still refuses a taken
name) but not flushed one by one: the block's end flushes them all at once, by one
``syncfs`` per filesystem on Linux (one journal commit for every file; the flush
also writes what other programs left dirty on that filesystem), elsewhere by
``fsync``s of every file and directory run side by side. A group of a few paths
is flushed path by path, as outside a group.

What a group changes: a file written in it is visible before it is durable
against a power loss (a process crash loses nothing: the kernel holds it). The
caller ends the group before anything depends on the files' durability: a Spark
task before its output goes to Spark, whose commit of the micro-batch is what
makes any of its versions count (docs/durability.md, "Commit and load"). The
block's end flushes also when the block raised: what it published stays visible,
so it must be durable too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import Any

__all__ = [
    "flush_group",
    "flush_file",
    "flush_paths",
    "after_flush",
    "after_flush_together",
    "PATH_BY_PATH",
]

log = logging.getLogger(__name__)

#: A group with at most this many paths to flush flushes them one by one: a
#: ``syncfs`` also writes whatever else is dirty on the filesystem, which two
#: ``fsync``s of a lone commit need not wait for.
PATH_BY_PATH = 4


class _Group:
    """What the current flush group does at its end: the paths it flushes, then
    the calls that wait for them (:func:`after_flush`)."""

    __slots__ = ("paths", "then", "together", "open")

    def __init__(self) -> None:
        self.paths: dict[str, None] = {}
        self.then: list[Callable[[], object]] = []
        #: the items of :func:`after_flush_together`, by key
        self.together: dict[Hashable, list[Any]] = {}
        #: False once ended: a generator that holds a group across its yields and
        #: is closed from another thread (a garbage collection) cannot reset the
        #: context of the thread that ran it, which then still names this group
        self.open = True


#: The current flush group (None, or one ended already: no group; see :func:`_current`).
_pending: ContextVar[_Group | None] = ContextVar("sessionstore_flush_group", default=None)


def _current() -> _Group | None:
    """The flush group this thread is in, if any (one ended elsewhere is none)."""
    group = _pending.get()
    return group if group is not None and group.open else None


@contextmanager
def flush_group() -> Iterator[None]:
    """Local writes of this thread in the block are flushed together at its end
    (see the module doc); a block inside another group is part of the outer one.
    The end raises ``OSError`` if the flush fails (after the block's own error,
    if it raised one, which then stays the one raised)."""
    if _current() is not None:
        yield
        return
    group = _Group()
    token = _pending.set(group)
    try:
        yield
    except BaseException:
        _end(token, group)
        try:
            _finish(group)
        except Exception:  # the block's own error is the one raised
            log.warning("sessionstore: ending a failed task's flush group failed", exc_info=True)
        raise
    _end(token, group)
    _finish(group)


def _finish(group: _Group) -> None:
    """Flush what ``group`` wrote, then run what waited for it (not if it fails)."""
    _flush(list(group.paths))
    _run(group.then)


def after_flush(call: Callable[[], object]) -> None:
    """Run ``call`` once what this thread wrote so far is durable: now outside a
    flush group, else right after the group's flush (not at all if it fails).
    For what must never be said before the writes it speaks of are durable (a
    Spark task's report of its committed event time to the driver)."""
    group = _current()
    if group is None:
        call()
    else:
        group.then.append(call)


def after_flush_together(key: Hashable, item: Any, call: Callable[[list[Any]], object]) -> None:
    """:func:`after_flush` of ``call([item])``, except that in a flush group the
    items given with one ``key`` go to a single ``call`` at the group's end, in the
    order given (the first ``call`` given for the key is the one made). A Spark
    task committing many partitions tells the driver about all of them in one
    request instead of one per partition."""
    group = _current()
    if group is None:
        call([item])
        return
    items = group.together.get(key)
    if items is None:
        items = group.together[key] = []
        group.then.append(lambda: call(items))
    items.append(item)


def _run(calls: list[Callable[[], object]]) -> None:
    """Run every one of ``calls`` (each partition's snapshot and report), then
    raise the first error, if one raised: one partition's failure drops no other's."""
    first: Exception | None = None
    for call in calls:
        try:
            call()
        except Exception as error:
            first = first or error
    if first is not None:
        raise first


def flush_file(out: object, path: str) -> None:
    """Flush the open local file ``out`` (written at ``path``) to the disk now, or
    at the end of the current flush group."""
    out.flush()  # type: ignore[attr-defined]
    group = _current()
    if group is None:
        os.fsync(out.fileno())  # type: ignore[attr-defined]
    else:
        group.paths[path] = None


def flush_paths(paths: list[str]) -> None:
    """Flush the files and directories ``paths``, now or at the end of the current
    flush group: directories a name was linked, renamed or created in, or a file
    another writer published (which its own flush group may not have flushed
    yet) before anything depends on it."""
    group = _current()
    for path in paths:
        if group is None:
            _fsync_path(path)
        else:
            group.paths[path] = None


def _end(token: object, group: _Group) -> None:
    group.open = False  # also for the context that ran it, if another closes it
    try:
        _pending.reset(token)  # type: ignore[arg-type]
    except ValueError:
        # a generator closed from another thread's context: that context's own
        # group (if any) is not this one and stays as it is
        pass


def _fsync_path(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) * os.path.isdir(path))
    except FileNotFoundError:  # removed since (see _flush): nothing left to flush
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flush(paths: list[str]) -> None:
    """Make every file and directory of ``paths`` durable."""
    if len(paths) <= PATH_BY_PATH:
        for path in paths:
            _fsync_path(path)
        return
    syncfs = _syncfs()
    if syncfs is None:
        with ThreadPoolExecutor(min(16, len(paths)), thread_name_prefix="sessionstore-flush") as pool:
            list(pool.map(_fsync_path, paths))
        return
    devices: dict[int, str] = {}
    for path in paths:
        # a path removed before the group's end (an adopted file whose lineage was
        # abandoned, a reset checkpoint) has nothing left to make durable
        with suppress(FileNotFoundError):
            devices.setdefault(os.stat(path).st_dev, path)
    for path in devices.values():
        fd = os.open(path, os.O_RDONLY)
        try:
            if syncfs(fd) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"syncfs failed: {os.strerror(error)}", path)
        finally:
            os.close(fd)


@functools.cache
def _syncfs() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """libc's ``syncfs`` (Linux), or None where there is none (looked up once)."""
    if not os.uname().sysname == "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.syncfs
    except (OSError, AttributeError):
        return None
