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

from sessionstore.checkpoint.identity import CheckpointPartition
from sessionstore.checkpoint.layout import (
    CHANGELOG_GROUP,
    FILES_DIR,
    changelog_group,
    changelog_name,
    content_name,
    manifest_name,
)
from sessionstore.checkpoint.lineage import COMMIT_FIELD, read_snapshot_record
from sessionstore.checkpoint.orphans import OrphanSweep
from sessionstore.checkpoint.snapshot import (
    CorruptSnapshotError,
    read_manifest,
    referenced,
    upload_snapshot,
)

__all__ = ["Maintenance"]

log = logging.getLogger(__name__)


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
        self._sweep = OrphanSweep(orphan_grace_s)
        #: manifests read, by version, with the listing's stamp of the object read:
        #: maintenance reads each once instead of every retained one each time
        self._manifests: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._uploaded_bytes = 0  # since take_uploaded_bytes

    def take_uploaded_bytes(self) -> int:
        """Snapshot bytes uploaded since the last call (a commit's metrics count them)."""
        uploaded, self._uploaded_bytes = self._uploaded_bytes, 0
        return uploaded

    def run(self) -> dict[str, Any]:
        """Upload this checkpoint's pending snapshots, prune versions beyond
        ``retain_versions`` and delete files no retained snapshot uses (after the
        orphan grace). Returns what was done: ``snapshots`` uploaded,
        ``uploaded_bytes``, ``deleted`` names, ``foreign`` pending snapshots dropped."""
        os.makedirs(self._local.root, exist_ok=True)
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
        present = set(stored)
        for version in self._local.pending_snapshots():
            manifest = self._upload_pending(version, used, report)
            if manifest is not None:
                snapshots.add(version)
                used |= referenced(manifest)
                present |= referenced(manifest)
        latest = max(set(changelogs) | snapshots, default=0)
        base = self._prune_base(snapshots, latest - self._retain_versions + 1, present)
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

    def _prune_base(self, snapshots: set[int], oldest_kept: int, present: set[str]) -> int | None:
        """The newest snapshot at or below ``oldest_kept`` that is readable and whose
        every file is ``present``: what is older may go. Pruning only below such a
        base (the listing, no extra request) means that if the newest candidate lost
        a file, the older snapshots and changelogs stay, and a restore repairs
        around it."""
        return next(
            (
                v for v in sorted(snapshots, reverse=True)
                if v <= oldest_kept
                and "format" in self._manifests[v][1]  # readable
                and referenced(self._manifests[v][1]) <= present
            ),
            None,
        )  # fmt: skip

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
            manifest = upload_snapshot(
                self._remote, path, version, known=used, commit=record.commit
            )
            uploaded = manifest.pop("uploaded_bytes")
            # the listing of the next maintenance gives its stamp (None never matches)
            self._manifests[version] = (None, manifest)
            report["snapshots"].append(version)
            report["uploaded_bytes"] += uploaded
            self._uploaded_bytes += uploaded
        # a failed upload raised above: the snapshot stays for the next maintenance
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(record_path):
            os.unlink(record_path)
        return manifest

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
