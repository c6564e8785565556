"""Maintenance of one partition's remote files: snapshot uploads, pruning, orphans.

Maintenance uploads only this checkpoint's pending snapshots (each records its
identity and commit), prunes only below a snapshot whose files are all stored,
and deletes an unreferenced content file only after two sweeps the grace apart
(orphans.py), so another executor's upload in flight never loses a file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from typing import Any

from sessionstore.checkpoint.partition.identity import CheckpointPartition
from sessionstore.checkpoint.partition.lineage import (
    COMMIT_FIELD,
    read_snapshot_record,
    stored_commit,
)
from sessionstore.checkpoint.partition.orphans import OrphanSweep
from sessionstore.checkpoint.records.layout import (
    CHANGELOG_GROUP,
    FILES_DIR,
    changelog_group,
    changelog_name,
    content_name,
    manifest_name,
)
from sessionstore.checkpoint.records.snapshot import (
    CorruptSnapshotError,
    content_sizes,
    read_manifest,
    referenced,
    upload_snapshot,
)
from sessionstore.checkpoint.storage.private_dir import private_dir

__all__ = ["Maintenance"]

log = logging.getLogger(__name__)


class _Reincarnated(Exception):
    """The checkpoint no longer holds the commit of a snapshot being uploaded (it
    was deleted and created again meanwhile): the upload is not published."""


class Maintenance:
    """Snapshot uploads, pruning beyond ``retain_versions`` and the orphan sweep
    (``orphan_grace_s`` must exceed the longest snapshot upload, see orphans.py)
    of one partition."""

    def __init__(
        self, partition: CheckpointPartition, retain_versions: int, orphan_grace_s: float
    ) -> None:
        self._remote, self._files = partition.remote, partition.files
        self._local, self._identity = partition.local, partition.identity
        self._retain_versions = retain_versions
        self._grace_s = orphan_grace_s
        self._forget()
        self._uploaded_bytes = 0  # since take_uploaded_bytes

    def _forget(self) -> None:
        """Start afresh: what the sweeps and reads learnt of the checkpoint's files
        belongs to the incarnation whose id is :attr:`_incarnation`."""
        self._incarnation = self._identity.checkpoint_id
        self._sweep = OrphanSweep(self._grace_s)
        #: manifests read, by version, with the listing's stamp of the object read:
        #: maintenance reads each once instead of every retained one each time
        self._manifests: dict[int, tuple[Any, dict[str, Any]]] = {}
        #: content files known whole, by name: the listing's stamp of the object
        #: whose hash was checked, or None for one this provider uploaded (bound
        #: to the stamp of the next listing)
        self._whole: dict[str, Any] = {}

    def take_uploaded_bytes(self) -> int:
        """Snapshot bytes uploaded since the last call (a commit's metrics count them)."""
        uploaded, self._uploaded_bytes = self._uploaded_bytes, 0
        return uploaded

    def run(self) -> dict[str, Any]:
        """Upload this checkpoint's pending snapshots, prune versions beyond
        ``retain_versions`` and delete files no retained snapshot uses (after the
        orphan grace). Returns what was done: ``snapshots`` uploaded,
        ``uploaded_bytes``, ``deleted`` names, ``foreign`` pending snapshots dropped."""
        # the same check as every other creator of the partition's folder
        private_dir(self._local.root, base=self._local.base)
        # One maintenance at a time per partition on this machine: a background
        # upload and a later task's maintenance must not race (the orphan sweep
        # could delete files of a snapshot whose manifest is not written yet).
        with open(self._local.maintenance_lock, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return self._maintain()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _maintain(self) -> dict[str, Any]:
        report: dict[str, Any] = {
            "snapshots": [], "uploaded_bytes": 0, "deleted": [], "foreign": [],
        }  # fmt: skip
        if self._identity.checkpoint_id != self._incarnation:
            self._forget()  # the checkpoint was created again (StateStoreProvider.confirm)
        # One listing of the content files serves the uploads, the check of the new
        # base and the orphan sweep. It comes before the listing of the manifests,
        # so a manifest written meanwhile is seen by the sweep.
        stored = self._remote.stamps(FILES_DIR)
        changelogs = self._files.changelog_files()
        self._read_manifests(self._files.snapshot_stamps())
        snapshots = set(self._manifests)
        # content a listed manifest uses: the only content an upload may skip (a
        # listed file nothing uses may be about to go; it is uploaded again)
        used = set().union(*(referenced(m) for _, m in self._manifests.values()))
        self._bind_uploads(stored)
        for version in self._local.pending_snapshots():
            try:
                manifest = self._upload_pending(version, used, report)
            except _Reincarnated:
                # this provider's checkpoint is gone: nothing more of it is touched
                # (a load confirms the identity and starts afresh, see provider.py)
                for pending in self._local.pending_snapshots():
                    self._drop_pending(pending)
                    report["foreign"].append(pending)
                return report
            if manifest is not None:
                snapshots.add(version)
                self._whole.update(dict.fromkeys(referenced(manifest) - used))
                used |= referenced(manifest)
        latest = max(set(changelogs) | snapshots, default=0)
        base = self._prune_base(snapshots, latest - self._retain_versions + 1, stored)
        if base is not None:
            for v in sorted(snapshots):
                if v < base:
                    self._remote.delete(manifest_name(v))
                    report["deleted"].append(manifest_name(v))
                    snapshots.discard(v)
                    del self._manifests[v]
            report["deleted"] += self._prune_changelogs(changelogs, base)
        used = set().union(*(referenced(m) for _, m in self._manifests.values()))
        for name in self._sweep.due(stored, used, time.monotonic()):
            self._remote.delete(content_name(name))
            report["deleted"].append(content_name(name))
        return report

    def _prune_base(
        self, snapshots: set[int], oldest_kept: int, stored: dict[str, Any]
    ) -> int | None:
        """The newest snapshot at or below ``oldest_kept`` that is readable and whose
        every file is whole (:meth:`_is_whole`): what is older may go. Pruning only
        below such a base means that if the newest candidate lost a file, or holds
        a truncated or altered one, the older snapshots and changelogs stay, and a
        restore repairs around it."""
        return next(
            (
                v for v in sorted(snapshots, reverse=True)
                if v <= oldest_kept
                and "format" in self._manifests[v][1]  # readable
                and all(
                    self._is_whole(name, size, stored)
                    for name, size in content_sizes(self._manifests[v][1]).items()
                )
            ),
            None,
        )  # fmt: skip

    def _is_whole(self, name: str, size: int, stored: dict[str, Any]) -> bool:
        """Whether content file ``name`` is stored whole: uploaded by this provider
        since the listing ``stored`` (``name -> (size, stamp)``), or listed with
        the manifest's ``size`` and its hash checked, once per listed stamp (a
        streamed read: a base this provider did not upload costs one read of its
        files, after a partition moved here)."""
        if name not in stored:
            return name in self._whole and self._whole[name] is None
        if stored[name][0] != size:
            log.warning(
                "sessionstore: %s holds %s bytes, its manifest says %d: never a base",
                self._remote.where(content_name(name)), stored[name][0], size,
            )  # fmt: skip
            return False
        if self._whole.get(name, False) in (None, stored[name]):
            return True
        try:
            digest = self._remote.digest(content_name(name))
        except FileNotFoundError:  # deleted since the listing
            return False
        if digest != name:
            log.warning(
                "sessionstore: %s does not match its sha256: never a base",
                self._remote.where(content_name(name)),
            )  # fmt: skip
            return False
        self._whole[name] = stored[name]
        return True

    def _bind_uploads(self, stored: dict[str, Any]) -> None:
        """Bind the files this provider uploaded to their first listed stamp (a
        later rewrite is checked again), and forget files no longer listed."""
        for name in list(self._whole):
            if name not in stored:
                del self._whole[name]
            elif self._whole[name] is None:
                self._whole[name] = stored[name]

    def _read_manifests(self, stamps: dict[int, Any]) -> None:
        """Bring the manifest cache in line with the listing ``stamps``: manifests
        gone are dropped, new ones read. A manifest is written once, by the winner
        of its version from its one local snapshot (or again with the same bytes
        by a retried upload), so a cached one stays right; a stamp that changed
        (a legitimately replaced commit) is read again all the same."""
        for v in list(self._manifests):
            if v not in stamps:
                del self._manifests[v]
        for v, stamp in stamps.items():
            if v not in self._manifests or self._manifests[v][0] != stamp:
                try:
                    self._manifests[v] = (stamp, read_manifest(self._remote, v))
                except FileNotFoundError:  # pruned by another executor since the listing
                    self._manifests.pop(v, None)
                except CorruptSnapshotError as exc:
                    # never a base; its files go unless another manifest uses them,
                    # and restores repair around it
                    log.warning("sessionstore: %s", exc)
                    self._manifests[v] = (stamp, {})

    def _upload_pending(
        self, version: int, used: set[str], report: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Upload the pending local snapshot of ``version`` if it is this
        checkpoint's and not stored yet (content in ``used`` is skipped); drop it
        either way. Its manifest, or None when nothing was uploaded."""
        path, record_path = self._local.snapshot(version), self._local.snapshot_record(version)
        record = read_snapshot_record(record_path)
        manifest = None
        if record is None or not self._identity.is_own(record.identity):
            # left by a provider of another checkpoint that shared this local_dir
            # (one deleted and created again at the same URI, say), or by a
            # release that recorded no owner: never uploaded as this one's
            report["foreign"].append(version)
        elif (self._manifests.get(version) or (None, {}))[1].get(COMMIT_FIELD) != record.commit:
            # (else a retry after an upload that finished: already there)

            def confirm() -> None:  # right before the manifest publishes the upload
                if self._committed(version) != record.commit:
                    raise _Reincarnated()

            manifest = upload_snapshot(
                self._remote, path, version, known=used, commit=record.commit,
                before_manifest=confirm,
            )  # fmt: skip
            uploaded = manifest.pop("uploaded_bytes")
            # the listing of the next maintenance gives its stamp (None never matches)
            self._manifests[version] = (None, manifest)
            report["snapshots"].append(version)
            report["uploaded_bytes"] += uploaded
            self._uploaded_bytes += uploaded
        # a failed upload raised above: the snapshot stays for the next maintenance
        self._drop_pending(version)
        return manifest

    def _committed(self, version: int) -> str | None:
        """The commit of ``version`` in the checkpoint as it is now: the header of
        its changelog (one ranged read), None if there is none or it is unreadable.

        A pending snapshot is published only if it holds that commit: so the state
        of a checkpoint deleted and created again since the snapshot was taken (the
        new one has other commits, or no such version yet) never lands in the new
        one, while a partition that believed a losing id at the checkpoint's birth
        (see identity.py) still uploads its snapshots of the one lineage."""
        return stored_commit(self._remote, version)

    def _drop_pending(self, version: int) -> None:
        """Delete the pending local snapshot of ``version`` and its record."""
        shutil.rmtree(self._local.snapshot(version), ignore_errors=True)
        record_path = self._local.snapshot_record(version)
        if os.path.exists(record_path):
            os.unlink(record_path)

    def _prune_changelogs(self, changelogs: dict[int, str], base: int) -> list[str]:
        """Delete the changelogs of versions up to ``base`` (which has a snapshot):
        a whole group folder once every version of it is at most ``base``, a
        changelog outside its group's folder one by one. Returns what went."""
        deleted = []
        groups: dict[str, list[int]] = {}
        for v, name in changelogs.items():
            if name == changelog_name(v):
                groups.setdefault(changelog_group(v), []).append(v)
            elif v <= base:
                self._remote.delete(name)
                deleted.append(name)
        for group, versions in sorted(groups.items()):
            last_of_group = (max(versions) // CHANGELOG_GROUP + 1) * CHANGELOG_GROUP - 1
            if last_of_group <= base:
                self._remote.delete_dir(group)
                deleted.append(group)
        return deleted
