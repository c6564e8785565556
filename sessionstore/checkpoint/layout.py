"""The remote files of one operator partition, read-only: versions and sizes."""

from __future__ import annotations

from sessionstore.checkpoint.filesystem import Storage

__all__ = ["PartitionFiles"]


class PartitionFiles:
    """``changelog/<N>.changelog`` and ``snapshot/<N>.manifest`` under a partition."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def changelogs(self) -> set[int]:
        names = self.storage.list("changelog")
        return {int(n.split(".")[0]) for n in names if n.endswith(".changelog")}

    def snapshots(self) -> set[int]:
        names = self.storage.list("snapshot")
        return {int(n.split(".")[0]) for n in names if n.endswith(".manifest")}

    def latest(self) -> int:
        """The newest committed version (0 when nothing was committed)."""
        return max(self.changelogs() | self.snapshots(), default=0)

    def loadable(self) -> list[int]:
        """Versions that can be loaded: those with a snapshot, or a changelog that
        follows a loadable version (0, the empty state, always is)."""
        changelogs, snapshots = self.changelogs(), self.snapshots()
        ok = {0}
        for v in range(1, max(changelogs | snapshots, default=0) + 1):
            if v in snapshots or (v in changelogs and v - 1 in ok):
                ok.add(v)
        return sorted(ok - {0})

    def bytes_used(self) -> int:
        total = 0
        for folder in ("changelog", "snapshot", "files"):
            total += sum(self.storage.size(f"{folder}/{n}") for n in self.storage.list(folder))
        return total
