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
    VersionNotFoundError,
)
from sessionstore.checkpoint.offline.erase import erase
from sessionstore.encoding.keys import decode_key, encode_key
from sessionstore.encoding.serde import BytesSerde, KeyCodecSerde, MsgpackSerde, Serde, StringSerde
from sessionstore.errors import (
    SessionStoreError,
    StateDBLockedError,
    StateDBPathError,
    StoreSpecMismatchError,
)

# Eager: the operators add a little to the import time this package already takes
# (numpy and pyarrow dominate), too little for lazy loading to pay for itself.
from sessionstore.operators import (
    Aggregation,
    Aggregations,
    ClosedSessions,
    CountWindowAggregator,
    CountWindowUpdate,
    JoinedPair,
    JoinedRecord,
    SessionUpdate,
    SessionWindowAggregator,
    SessionWindows,
    TemporalJoin,
    TimeWindows,
    WindowAggregator,
    WindowedJoin,
    WindowUpdate,
)
from sessionstore.stores.memory_session import InMemorySessionStore
from sessionstore.stores.records import (
    PUT_REJECTED,
    VALID_TO_UNDEFINED,
    SessionWindow,
    VersionedRecord,
)
from sessionstore.stores.session import SessionStore
from sessionstore.stores.spec import StoreSpec
from sessionstore.stores.state_db import StateDB
from sessionstore.stores.versioned import VersionedStore
from sessionstore.tools.rewrite import rewrite

__all__ = [
    "StateDB",
    "StateStoreProvider",
    "StoreHandle",
    "StoreSpec",
    "CorruptChangelogError",
    "CorruptSnapshotError",
    "CheckpointMismatchError",
    "VersionNotFoundError",
    "erase",
    "rewrite",
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
    "StateDBPathError",
    "StoreSpecMismatchError",
    # operators (also in sessionstore.operators)
    "SessionWindows",
    "SessionUpdate",
    "ClosedSessions",
    "SessionWindowAggregator",
    "TimeWindows",
    "WindowAggregator",
    "WindowUpdate",
    "CountWindowAggregator",
    "CountWindowUpdate",
    "TemporalJoin",
    "JoinedRecord",
    "WindowedJoin",
    "JoinedPair",
    "Aggregation",
    "Aggregations",
]
__version__ = "0.1.0"
