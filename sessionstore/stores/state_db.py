"""StateDB: the engine's database with the stores living in it.

:class:`~sessionstore.engine.db.Database` knows column families and batches;
this subclass keeps the open stores by name, opens each kind through the one
registry (:mod:`sessionstore.stores.registry`) and offers the documented openers
(``db.session_store(...)``, ``window_store``, ``kv_store``, ``message_store``,
``versioned_store``, ``processor_store``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rocksdict import Options, Rdict

from sessionstore.engine.db import Database
from sessionstore.stores.base import check_store_name, is_data_family, store_specs
from sessionstore.stores.registry import store_class

if TYPE_CHECKING:
    from sessionstore.stores.kv import KeyValueStore
    from sessionstore.stores.messages import MessageStore
    from sessionstore.stores.processor import ProcessorStore
    from sessionstore.stores.session import SessionStore
    from sessionstore.stores.versioned import VersionedStore
    from sessionstore.stores.window import WindowStore

__all__ = ["StateDB"]


class StateDB(Database):
    """One RocksDB database holding the stores of one operator partition.

    Open it with :meth:`open`; use it as a context manager or call :meth:`close`.
    """

    def __init__(self, path: str, rdict: Rdict, options: Options, read_only: bool = False) -> None:
        self._stores: dict[str, Any] = {}
        super().__init__(path, rdict, options, read_only)

    # ------------------------------------------------------------------ stores
    def open_store(
        self,
        kind: str,
        name: str,
        retention_ms: int = 0,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
        **layout: Any,
    ) -> Any:
        """The store ``name`` of ``kind`` (created on first use, restored on reopen).

        An open store of that kind and layout is returned again, with its retention
        changed to ``retention_ms``; ``layout`` gives the kind's layout fields
        (``window_size_ms`` for windows).
        """
        cls = store_class(kind)
        check_store_name(name)
        store = self._stores.get(name)
        if (
            store is not None
            and type(store) is cls
            and all(getattr(store, k) == v for k, v in layout.items())
        ):
            store.reconfigure(retention_ms, segment_interval_ms)
            return store
        store = cls(
            self,
            name,
            retention_ms,
            segment_interval_ms=segment_interval_ms,
            key_serde=key_serde,
            value_serde=value_serde,
            **layout,
        )
        self._stores[name] = store
        return store

    def session_store(
        self,
        name: str,
        retention_ms: int,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> SessionStore:
        """The RocksDB session store ``name`` (created on first use, restored on reopen)."""
        return self.open_store(
            "session", name, retention_ms, segment_interval_ms, key_serde, value_serde
        )

    def window_store(
        self,
        name: str,
        retention_ms: int,
        window_size_ms: int,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> WindowStore:
        """The window store ``name`` (fixed-size windows per key), created on first use."""
        return self.open_store(
            "window",
            name,
            retention_ms,
            segment_interval_ms,
            key_serde,
            value_serde,
            window_size_ms=window_size_ms,
        )

    def kv_store(self, name: str, key_serde: Any = None, value_serde: Any = None) -> KeyValueStore:
        """The key-value store ``name``, created on first use."""
        return self.open_store("kv", name, key_serde=key_serde, value_serde=value_serde)

    def message_store(
        self,
        name: str,
        retention_ms: int,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> MessageStore:
        """The message store ``name`` (messages by key, time and offset)."""
        return self.open_store(
            "messages", name, retention_ms, segment_interval_ms, key_serde, value_serde
        )

    def versioned_store(
        self,
        name: str,
        history_retention_ms: int,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> VersionedStore:
        """The versioned store ``name`` (KIP-889), created on first use."""
        return self.open_store(
            "versioned", name, history_retention_ms, segment_interval_ms, key_serde, value_serde
        )

    def processor_store(self, name: str) -> ProcessorStore:
        """The processor store ``name`` (a StatefulProcessor's state variables,
        timers and TTL index), created on first use."""
        return self.open_store("processor", name)

    def reload_stores(self) -> None:
        """Re-read every open store's stream time and segments (after a replay)."""
        for store in self._stores.values():
            store.reload()

    # ------------------------------------------------------------------ metadata
    def store_specs(self) -> dict[str, dict[str, Any]]:
        """The recorded spec of every store in this database, by name."""
        return store_specs(self)

    def estimated_keys(self, store: str) -> int:
        """RocksDB's estimate of the entries of ``store``: its segments and its
        latest-value or key-value family, not its indexes (memtables included, so
        overwrites may be counted)."""
        return sum(
            self.estimated_family_keys(name)
            for name in self.column_families()
            if is_data_family(store, name)
        )
