"""Loading a partition's state at a version: the local copy, caught up or restored.

Version 0 is the empty state, unless an offline bootstrap gave it a snapshot
(offline/bootstrap.py). Loading version N: if the local database is at N it is used as is; if it is
behind and the changelogs up to N exist, they are replayed; otherwise (a new
executor, a replayed batch whose local state is ahead, a gap in the changelogs)
the newest snapshot at or below N is downloaded into a fresh directory, the
changelogs after it are replayed, and the directory replaces the local copy only
when complete: a store is never returned partly restored. An unusable snapshot is
gone around (an older one, or version 0, plus the retained changelogs): a repair,
logged and counted in the next commit's metrics.

A changelog is applied only onto the commit it continues (lineage.py), and a
local database is used only by a provider of the checkpoint that owns it
(identity.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from typing import Any

from sessionstore.checkpoint.partition.identity import CheckpointPartition
from sessionstore.checkpoint.partition.leftovers import (
    restore_scratch,
    sweep_restores,
    sweep_staging,
)
from sessionstore.checkpoint.partition.lineage import (
    COMMIT_FIELD,
    LineageError,
    check_continues,
    stored_commit,
)
from sessionstore.checkpoint.records.changelog import Changelog, fetch_changelog
from sessionstore.checkpoint.records.layout import (
    IDENTITY_KEY,
    changelog_name,
    commit_of,
    committed_version,
    database_in,
    is_database,
    manifest_name,
    read_changelog_file,
)
from sessionstore.checkpoint.records.metrics import millis
from sessionstore.checkpoint.records.snapshot import CorruptSnapshotError, download_snapshot
from sessionstore.checkpoint.storage.private_dir import private_dir
from sessionstore.engine.write_buffer import WriteBuffer
from sessionstore.errors import SessionStoreError
from sessionstore.stores.state_db import StateDB

__all__ = ["PartitionLoader", "VersionNotFoundError", "replay_changelog"]

log = logging.getLogger(__name__)


class VersionNotFoundError(SessionStoreError, LookupError):
    """The requested version was never committed (or was pruned)."""


class _UnusableSnapshot(Exception):
    """A snapshot a restore cannot use (``cause`` says why): an older base may do."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def replay_changelog(
    db: StateDB,
    where: str,
    version: int,
    header: dict[str, Any],
    writes: WriteBuffer | Iterable[WriteBuffer],
    owner: bytes | None = None,
) -> None:
    """Apply the changelog of ``version`` (its ``header`` and ``writes``, one buffer
    or a changelog's buffers in turn, read from ``where``) onto ``db``, which must
    hold the commit it continues (else
    :class:`~sessionstore.checkpoint.partition.lineage.LineageError`, before anything is
    applied); ``SessionStoreError`` if it did not bring ``db`` to ``version``.

    One buffer is one atomic write; a changelog of several (a large one, streamed)
    is not. So when ``db`` is a database used as it is (``owner``, its
    :data:`~sessionstore.checkpoint.records.layout.IDENTITY_KEY` record, given), the record
    is removed before the first write and put back after the last: a copy left
    part way (a crash) is never used, only replaced by a restore."""
    check_continues(header, commit_of(db), where, version)
    if owner is not None:
        db.put_meta(IDENTITY_KEY, None)
    for buf in [writes] if isinstance(writes, WriteBuffer) else writes:
        db.apply(buf)
    if owner is not None:
        db.put_meta(IDENTITY_KEY, owner)
    if committed_version(db) != version:
        raise SessionStoreError(f"{where} did not bring the state to version {version}")


class PartitionLoader:
    """The local database of one partition and how it gets to a version.

    ``progress(label, done, total)`` is told the steps of a restore (the CLI's
    progress bars)."""

    def __init__(
        self,
        partition: CheckpointPartition,
        memory_max_mb: int | None,
        progress: Callable[[str, int, int], None],
    ) -> None:
        self._remote, self._files = partition.remote, partition.files
        self._local, self._identity = partition.local, partition.identity
        self._memory_max_mb = memory_max_mb
        self._progress = progress
        #: the local database, while open
        self.db: StateDB | None = None
        #: how the last load got its state (warm, handover, replay, restore), and
        #: how long it took (ms, the opening by :meth:`open_local` included)
        self.kind, self.load_ms = "restore", 0.0
        self._opened_ms: float | None = None  # open_local's time since the last load
        #: every repair made (a restore that went around an unusable snapshot), one
        #: sentence each; and how many since :meth:`take_repaired`
        self.repairs: list[str] = []
        self._repaired = 0

    def open_local(self) -> None:
        """Open the local database now if there is one (and it is not open yet);
        ``StateDBLockedError`` while another process holds it."""
        if self.db is None:
            # before anything is read from or written to it, at each open (see private_dir)
            private_dir(self._local.root, base=self._local.base)
            sweep_restores(self._local)  # a crashed process's (leftovers.py)
        if self.db is None and is_database(self._local.db):
            start = time.perf_counter()
            self.db = self._open(self._local.db)
            self._opened_ms = millis(time.perf_counter() - start)
            sweep_staging(self._local)  # no other process builds one while we hold it

    def _open(self, path: str) -> StateDB:
        return StateDB.open(path, memory_max_mb=self._memory_max_mb)

    def take_repaired(self) -> int:
        """Repairs made since the last call (a commit's metrics count them)."""
        repaired, self._repaired = self._repaired, 0
        return repaired

    def close(self) -> None:
        """Close the local database (its lock released)."""
        if self.db is not None:
            self.db.close()
            self.db = None

    def load(self, version: int) -> StateDB:
        """The local database at committed ``version``; :attr:`kind` and
        :attr:`load_ms` say how and how long."""
        start = time.perf_counter()
        db = self._load(version)
        self.load_ms = round(millis(time.perf_counter() - start) + (self._opened_ms or 0.0), 3)
        self._opened_ms = None
        return db

    def _load(self, version: int) -> StateDB:
        # Fast path: the local copy is applied only after its changelog was
        # uploaded, so a database already at ``version`` is committed state and no
        # listing of the remote directory is needed, whether it was open already or
        # was left by another worker process of this machine.
        self.open_local()
        local = None if self.db is None else self._local_version(self.db)
        if local == version:
            self.kind = "warm" if self._opened_ms is None else "handover"
            return self.db
        changelogs = self._files.changelogs()
        snapshots = self._files.snapshots()
        if version > 0 and version not in changelogs and version not in snapshots:
            latest = max(changelogs | snapshots, default=0)
            raise VersionNotFoundError(
                f"version {version} of {self._remote.uri} does not exist (latest is {latest})"
            )
        # a local copy behind the version catches up by replaying the changelog tail
        # (unless it holds another attempt's commit: then the tail does not continue
        # it, and a restore takes the committed lineage)
        if local is not None and local < version and self._catch_up(local, version, changelogs):
            self.kind = "replay"
            return self.db
        self._restore(version, snapshots, changelogs)
        self.kind = "restore"
        return self.db

    def _local_version(self, db: StateDB) -> int:
        """The committed version of a local database, or -1 if it belongs to another
        checkpoint (so that it is never used, only replaced by a restore)."""
        return committed_version(db) if self._identity.owns(db) else -1

    def _catch_up(self, local: int, version: int, changelogs: set[int]) -> bool:
        """Replay the changelogs after ``local`` up to ``version`` into the open
        database; False (nothing applied) if one is missing or the first does not
        continue the local commit."""
        tail = range(local + 1, version + 1)
        if not all(v in changelogs for v in tail):
            return False
        # a large changelog is downloaded beside the partition's folder, in a scratch
        # folder locked for its life (another process's sweep leaves it alone)
        owner = self._identity.record
        with restore_scratch(self._local) as spool:
            try:
                self.replay(self.db, local + 1, spool, owner)  # checked before applied
            except LineageError as exc:
                log.warning("sessionstore: local copy not reused: %s", exc)
                return False
            for v in tail[1:]:
                self.replay(self.db, v, spool, owner)
        self.db.reload_stores()
        return True

    def changelog(self, version: int, spool_dir: str) -> Changelog:
        """The checked changelog of ``version`` (a large one downloaded into
        ``spool_dir``; close it)."""
        where = self._remote.where(changelog_name(version))
        try:
            return read_changelog_file(
                lambda name: fetch_changelog(self._remote, name, where, version, spool_dir),
                version,
            )
        except FileNotFoundError as exc:
            raise VersionNotFoundError(
                f"changelog of version {version} is missing: {exc}"
            ) from None

    def replay(self, db: StateDB, version: int, spool_dir: str, owner: bytes | None = None) -> None:
        """Apply the remote changelog of ``version`` onto ``db`` (see
        :func:`replay_changelog`), a bounded share at a time."""
        with self.changelog(version, spool_dir) as changelog:
            replay_changelog(
                db, changelog.where, version, changelog.header, changelog.writes(), owner
            )

    def _restore(self, version: int, snapshots: set[int], changelogs: set[int]) -> None:
        """Rebuild the local copy at ``version`` from remote files, all or nothing.

        From the newest snapshot at or below ``version``; when that snapshot is
        unusable (a file missing or corrupt, or it does not hold the commit the
        next changelog continues), from an older one, or from version 0, whose
        changelogs up to ``version`` are all retained: a *repair*, logged, kept in
        :attr:`repairs` and counted in the next commit's metrics (``repaired``).
        A broken changelog is not repaired: every older base needs it too.
        """
        fresh = version == 0 and self.db is None and not self._identity.bootstrapped
        if fresh and not os.path.lexists(self._local.db):  # anything there: replaced below
            self._create_empty()
            return
        bases = [*sorted((s for s in snapshots if s <= version), reverse=True), 0]
        bases = list(dict.fromkeys(bases))
        skipped: list[str] = []
        first: BaseException | None = None
        for i, base in enumerate(bases):
            if i and not all(v in changelogs for v in range(base + 1, version + 1)):
                continue  # the changelogs after this older base are not retained
            if base == 0 and 0 not in snapshots and self._identity.bootstrapped:
                # a bootstrapped version 0 is its snapshot, never the empty state
                first = first or VersionNotFoundError(
                    f"{self._remote.uri}: version 0 was bootstrapped and its snapshot "
                    f"is gone, so version {version} cannot be rebuilt from it"
                )
                continue
            with restore_scratch(self._local) as tmp:  # removed after, also on errors
                try:
                    # a snapshot 0 is version 0 only where _metadata says it was
                    # bootstrapped (else a leftover of an earlier incarnation)
                    from_snapshot = base in snapshots and (base or self._identity.bootstrapped)
                    self._rebuild(database_in(tmp), base, version, bool(from_snapshot))
                except _UnusableSnapshot as unusable:
                    skipped.append(f"snapshot {base}: {unusable.cause}")
                    first = first or unusable.cause
                    continue
                if skipped:
                    self._record_repair(version, base, skipped)
                self._replace_local(tmp)
            return
        assert first is not None
        raise first

    def _create_empty(self) -> None:
        """Version 0 of a partition with no local copy: the empty state, created in
        place. Nothing needs downloading, so the rebuild in a scratch folder that
        :meth:`_restore` makes all or nothing would only create a database there,
        close it, move it and open it again: two creations of a RocksDB database
        (each writes and syncs its MANIFEST and OPTIONS), the larger part of a new
        partition's first task (BENCHMARKS.md, "Partitions per task").

        A crash midway leaves one of two things, and the next load handles each as
        before: a folder without ``CURRENT`` (RocksDB writes it last, once the
        database is whole: not a database, so the next load rebuilds in a scratch
        folder and replaces it), or an empty database without this checkpoint's
        identity (a foreign copy to that load, replaced by a restore)."""
        private_dir(self._local.root, base=self._local.base)  # checked right before
        db = self._open(self._local.db)
        try:
            db.put_meta(IDENTITY_KEY, self._identity.record)
        except BaseException:
            db.close()
            raise
        self.db = db
        sweep_staging(self._local)  # no other process builds one while we hold it

    def _replace_local(self, tmp: str) -> None:
        """Put the whole rebuilt database of ``tmp`` in place of the local copy and
        open it."""
        self.close()
        shutil.rmtree(self._local.db, ignore_errors=True)
        private_dir(self._local.root, base=self._local.base)  # checked again right before
        os.replace(database_in(tmp), self._local.db)
        self.db = self._open(self._local.db)
        sweep_staging(self._local)  # no other process builds one while we hold it

    def _rebuild(self, db_dir: str, base: int, version: int, snapshot: bool = True) -> None:
        """Download the snapshot of ``base`` into ``db_dir`` (none for version 0
        without a snapshot: the empty state; a bootstrapped version 0 has one) and
        replay the changelogs up to ``version``; :class:`_UnusableSnapshot` when the
        snapshot is what failed."""
        manifest: dict[str, Any] | None = None
        if snapshot:
            self._progress("download snapshot", 0, 1)
            try:
                manifest = download_snapshot(self._remote, base, db_dir)
            except (CorruptSnapshotError, FileNotFoundError) as exc:
                raise _UnusableSnapshot(exc) from None
            self._progress("download snapshot", 1, 1)
        try:
            db = self._open(db_dir)
        except Exception as exc:
            if manifest is None:
                raise
            raise _UnusableSnapshot(exc) from None
        try:
            self._check_base(db, base, manifest)
            for v in range(base + 1, version + 1):
                self._progress("replay changelogs", v - base - 1, version - base)
                try:
                    self.replay(db, v, os.path.dirname(db_dir))
                except LineageError as exc:
                    if v == base + 1 and manifest is not None:  # the snapshot's lineage
                        raise _UnusableSnapshot(exc) from None
                    raise
            self._progress("replay changelogs", version - base, version - base)
            # downloaded from this checkpoint, so it is this checkpoint's state,
            # whatever the snapshot's writer recorded
            db.put_meta(IDENTITY_KEY, self._identity.record)
        finally:
            db.close()

    def _check_base(self, db: StateDB, base: int, manifest: dict[str, Any] | None) -> None:
        """:class:`_UnusableSnapshot` unless ``db`` holds ``base`` and the commit its
        manifest names."""
        where = self._remote.where(manifest_name(base))
        if committed_version(db) != base:
            raise _UnusableSnapshot(
                SessionStoreError(f"{where} holds version {committed_version(db)}")
            )
        if manifest is not None and manifest.get(COMMIT_FIELD) not in (None, commit_of(db)):
            raise _UnusableSnapshot(
                LineageError(where, base, manifest.get(COMMIT_FIELD), commit_of(db))
            )
        bootstrapped = self._identity.bootstrap_commit
        if base == 0 and bootstrapped is not None and commit_of(db) != bootstrapped:
            raise _UnusableSnapshot(
                SessionStoreError(
                    f"{where} holds commit {commit_of(db)}, but version 0 was bootstrapped "
                    f"as commit {bootstrapped} (its _metadata): a snapshot of another "
                    "checkpoint or attempt is never loaded as this one's"
                )
            )
        # a manifest another incarnation's late upload wrote (its pre-publish check
        # passed, then its retried PUT landed after a reset) names a commit the
        # checkpoint's own changelog of ``base`` does not: one ranged read a restore
        stored = stored_commit(self._remote, base) if base else None
        if stored is not None and stored != commit_of(db):
            raise _UnusableSnapshot(LineageError(where, base, stored, commit_of(db)))

    def _record_repair(self, version: int, base: int, skipped: list[str]) -> None:
        source = f"snapshot {base}" if base else "version 0"
        message = (
            f"{self._remote.uri}: version {version} restored from {source} and the "
            f"changelogs after it, around {len(skipped)} unusable snapshot(s): "
            + "; ".join(skipped)
        )
        log.warning("sessionstore: repaired %s", message)
        self.repairs.append(message)
        self._repaired += 1
