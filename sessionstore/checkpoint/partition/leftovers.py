"""What a crash leaves in a partition's local folder, and sweeping it safely.

Two kinds of scratch hold hard links to a database's files, so while they stay
they pin disk space (layout.py names them):

* ``<partition>.restore-<token>/``: a restore in progress (load.py). Whoever makes
  one holds an exclusive lock on ``<partition>.restore-<token>.lock`` for its whole
  life: the lock file is created under a temporary name, locked, and only then
  renamed into place, and the scratch is made after it and removed before it. So a
  scratch whose lock can be taken belongs to a dead process (a lock dies with its
  process), one without a lock file to a release that took none, and one whose lock
  is held to a live process, which is left alone. No pid is trusted: pids are
  reused, and differ between the containers that may share a local folder.
* ``snapshots/.<N>.staging`` (and RocksDB's ``.<N>.staging.tmp``): a snapshot being
  built by a commit, which only the process holding the partition's database (its
  RocksDB lock) makes. The holder sweeps them when it opens the database.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sessionstore.checkpoint.records.layout import LocalPartition

__all__ = ["restore_scratch", "sweep_restores", "sweep_staging"]

_LOCK = ".lock"
_NEW = ".new"


@contextmanager
def restore_scratch(local: LocalPartition) -> Iterator[str]:
    """A new scratch folder for a restore of ``local``'s partition, locked while
    the block runs (see the module doc) and removed after it."""
    path = local.restore_dir(uuid.uuid4().hex)
    lock = path + _LOCK
    fd = os.open(lock + _NEW, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(lock + _NEW, lock)  # visible only once locked
        try:
            os.mkdir(path, 0o700)
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
            os.unlink(lock)
    finally:
        os.close(fd)


def _taken(lock: str) -> int | None:
    """A descriptor holding ``lock`` if no live process holds it (None if one
    does); FileNotFoundError if there is no such file."""
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def sweep_restores(local: LocalPartition) -> list[str]:
    """Remove the restore scratch of ``local``'s partition that no live process
    holds (see the module doc); returns the paths removed."""
    parent, prefix = os.path.split(local.root)
    prefix += ".restore-"
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        if not name.startswith(prefix) or name.endswith((_LOCK, _NEW)):
            continue
        path = os.path.join(parent, name)
        try:
            fd = _taken(path + _LOCK)
        except FileNotFoundError:
            fd = -1  # made by a release that took no lock
        if fd is None:
            continue  # a live restore
        try:
            shutil.rmtree(path, ignore_errors=True)
            if fd >= 0:
                os.unlink(path + _LOCK)
        finally:
            if fd >= 0:
                os.close(fd)
        removed.append(path)
    for name in names:  # a lock whose scratch went, its owner killed before the lock
        path = os.path.join(parent, name)
        if name.startswith(prefix) and name.endswith(_LOCK) and name[: -len(_LOCK)] not in names:
            try:
                fd = _taken(path)
            except FileNotFoundError:
                continue
            if fd is not None:
                os.unlink(path)
                os.close(fd)
                removed.append(path)
    return removed


def sweep_staging(local: LocalPartition) -> list[str]:
    """Remove the snapshots being built that a crash left in ``local``'s partition;
    the caller holds the partition's database, so none is being built now. Returns
    the paths removed."""
    try:
        names = os.listdir(local.snapshots)
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        if name.startswith(".") and ".staging" in name:
            path = os.path.join(local.snapshots, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
