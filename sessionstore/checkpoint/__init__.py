"""Durability: changelogs and snapshots in object storage, versioned per micro-batch.

Names are imported on first use (:mod:`sessionstore.lazy`).
"""

from typing import TYPE_CHECKING

from sessionstore.lazy import lazy_exports

#: the public names, and where each lives (``__all__``, in this order)
_EXPORTS = {
    "CheckpointMismatchError": "sessionstore.checkpoint.partition.provider",
    "StateStoreProvider": "sessionstore.checkpoint.partition.provider",
    "StoreHandle": "sessionstore.checkpoint.partition.provider",
    "VersionNotFoundError": "sessionstore.checkpoint.partition.provider",
    "CorruptChangelogError": "sessionstore.checkpoint.records.changelog",
    "CorruptSnapshotError": "sessionstore.checkpoint.records.snapshot",
    "StoreSpec": "sessionstore.stores.spec",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from sessionstore.checkpoint.partition.provider import (  # noqa: F401
        CheckpointMismatchError,
        StateStoreProvider,
        StoreHandle,
        VersionNotFoundError,
    )
    from sessionstore.checkpoint.records.changelog import CorruptChangelogError  # noqa: F401
    from sessionstore.checkpoint.records.snapshot import CorruptSnapshotError  # noqa: F401
    from sessionstore.stores.spec import StoreSpec  # noqa: F401

__all__ = list(_EXPORTS)
