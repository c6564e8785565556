"""Durability: changelogs and snapshots in object storage, versioned per micro-batch."""

from sessionstore.checkpoint.partition.provider import (
    CheckpointMismatchError,
    StateStoreProvider,
    StoreHandle,
    VersionNotFoundError,
)
from sessionstore.checkpoint.records.changelog import CorruptChangelogError
from sessionstore.checkpoint.records.snapshot import CorruptSnapshotError
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
