"""sessionstore: RocksDB-backed session, versioned and window state for stream processing.

The core is engine-agnostic and never imports pyspark; Spark glue lives in
``spark_integration``.

Names are imported on first use (:mod:`sessionstore.lazy`).
"""

from typing import TYPE_CHECKING

from sessionstore.lazy import lazy_exports

#: the public names, and where each lives (``__all__``, in this order)
_EXPORTS = {
    "CheckpointMismatchError": "sessionstore.checkpoint",
    "CorruptChangelogError": "sessionstore.checkpoint",
    "CorruptSnapshotError": "sessionstore.checkpoint",
    "StateStoreProvider": "sessionstore.checkpoint",
    "StoreHandle": "sessionstore.checkpoint",
    "VersionNotFoundError": "sessionstore.checkpoint",
    "erase": "sessionstore.checkpoint.offline.erase",
    "decode_key": "sessionstore.encoding.keys",
    "encode_key": "sessionstore.encoding.keys",
    "BytesSerde": "sessionstore.encoding.serde",
    "KeyCodecSerde": "sessionstore.encoding.serde",
    "MsgpackSerde": "sessionstore.encoding.serde",
    "Serde": "sessionstore.encoding.serde",
    "StringSerde": "sessionstore.encoding.serde",
    "SessionStoreError": "sessionstore.errors",
    "StateDBLockedError": "sessionstore.errors",
    "StateDBPathError": "sessionstore.errors",
    "StoreSpecMismatchError": "sessionstore.errors",
    "Aggregation": "sessionstore.operators",
    "Aggregations": "sessionstore.operators",
    "ClosedSessions": "sessionstore.operators",
    "CountWindowAggregator": "sessionstore.operators",
    "CountWindowUpdate": "sessionstore.operators",
    "JoinedPair": "sessionstore.operators",
    "JoinedRecord": "sessionstore.operators",
    "SessionUpdate": "sessionstore.operators",
    "SessionWindowAggregator": "sessionstore.operators",
    "SessionWindows": "sessionstore.operators",
    "TemporalJoin": "sessionstore.operators",
    "TimeWindows": "sessionstore.operators",
    "WindowAggregator": "sessionstore.operators",
    "WindowedJoin": "sessionstore.operators",
    "WindowUpdate": "sessionstore.operators",
    "InMemorySessionStore": "sessionstore.stores.memory_session",
    "PUT_REJECTED": "sessionstore.stores.records",
    "VALID_TO_UNDEFINED": "sessionstore.stores.records",
    "SessionWindow": "sessionstore.stores.records",
    "VersionedRecord": "sessionstore.stores.records",
    "SessionStore": "sessionstore.stores.session",
    "StoreSpec": "sessionstore.stores.spec",
    "StateDB": "sessionstore.stores.state_db",
    "VersionedStore": "sessionstore.stores.versioned",
    "rewrite": "sessionstore.tools.rewrite",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from sessionstore.checkpoint import (  # noqa: F401
        CheckpointMismatchError,
        CorruptChangelogError,
        CorruptSnapshotError,
        StateStoreProvider,
        StoreHandle,
        VersionNotFoundError,
    )
    from sessionstore.checkpoint.offline.erase import erase  # noqa: F401
    from sessionstore.encoding.keys import decode_key, encode_key  # noqa: F401
    from sessionstore.encoding.serde import (  # noqa: F401
        BytesSerde,
        KeyCodecSerde,
        MsgpackSerde,
        Serde,
        StringSerde,
    )
    from sessionstore.errors import (  # noqa: F401
        SessionStoreError,
        StateDBLockedError,
        StateDBPathError,
        StoreSpecMismatchError,
    )
    from sessionstore.operators import (  # noqa: F401
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
    from sessionstore.stores.memory_session import InMemorySessionStore  # noqa: F401
    from sessionstore.stores.records import (  # noqa: F401
        PUT_REJECTED,
        VALID_TO_UNDEFINED,
        SessionWindow,
        VersionedRecord,
    )
    from sessionstore.stores.session import SessionStore  # noqa: F401
    from sessionstore.stores.spec import StoreSpec  # noqa: F401
    from sessionstore.stores.state_db import StateDB  # noqa: F401
    from sessionstore.stores.versioned import VersionedStore  # noqa: F401
    from sessionstore.tools.rewrite import rewrite  # noqa: F401

__all__ = list(_EXPORTS)
__version__ = "0.1.0"
