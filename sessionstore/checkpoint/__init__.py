"""Durability: changelogs and snapshots in object storage, versioned per micro-batch."""

from sessionstore.checkpoint.changelog import CorruptChangelogError
from sessionstore.checkpoint.provider import (
    CheckpointMismatchError,
    StateStoreProvider,
    StoreHandle,
    VersionNotFoundError,
)
from sessionstore.checkpoint.snapshot import CorruptSnapshotError
from sessionstore.stores.spec import StoreSpec

__all__ = [
    "StateStoreProvider",
    "StoreHandle",
    "StoreSpec",
    "CorruptChangelogError",
    "CorruptSnapshotError",
    "CheckpointMismatchError",
    "VersionNotFoundError",
]
