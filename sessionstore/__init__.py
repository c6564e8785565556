"""sessionstore: RocksDB-backed session, versioned and window state for stream processing.

The core is engine-agnostic and never imports pyspark; Spark glue lives in
``spark_integration``.
"""

from sessionstore.checkpoint import (
    CheckpointMismatchError,
    CorruptChangelogError,
    CorruptSnapshotError,
    StateStoreProvider,
    StoreHandle,
    StoreSpec,
    VersionNotFoundError,
)
from sessionstore.db import StateDB
from sessionstore.errors import SessionStoreError, StateDBLockedError, StoreSpecMismatchError
from sessionstore.keys import decode_key, encode_key
from sessionstore.memory_session_store import InMemorySessionStore
from sessionstore.records import PUT_REJECTED, VALID_TO_UNDEFINED, SessionWindow, VersionedRecord
from sessionstore.serde import BytesSerde, KeyCodecSerde, MsgpackSerde, Serde, StringSerde
from sessionstore.session_store import SessionStore
from sessionstore.versioned_store import VersionedStore

__all__ = [
    "StateDB",
    "StateStoreProvider",
    "StoreHandle",
    "StoreSpec",
    "CorruptChangelogError",
    "CorruptSnapshotError",
    "CheckpointMismatchError",
    "VersionNotFoundError",
    "SessionStore",
    "InMemorySessionStore",
    "VersionedStore",
    "SessionWindow",
    "VersionedRecord",
    "VALID_TO_UNDEFINED",
    "PUT_REJECTED",
    "Serde",
    "MsgpackSerde",
    "BytesSerde",
    "StringSerde",
    "KeyCodecSerde",
    "encode_key",
    "decode_key",
    "SessionStoreError",
    "StateDBLockedError",
    "StoreSpecMismatchError",
]
__version__ = "0.1.0"
