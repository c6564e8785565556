"""Key-value store: one value per key in the column family ``<store>.kv``.

For operator state that is neither windowed nor versioned (count windows keep
their open window per key here). Keys use the ordered codec, values the store's
serde; writes join the StateDB's current batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sessionstore.encoding.keys import key_range
from sessionstore.encoding.serde import MsgpackSerde, key_codec
from sessionstore.stores.base import describe_store

if TYPE_CHECKING:
    from sessionstore.engine.db import StateDB

__all__ = ["KeyValueStore"]


class KeyValueStore:
    """A plain key-value store in a StateDB. Create with ``db.kv_store(name)``."""

    kind = "kv"

    def __init__(
        self, db: StateDB, name: str, key_serde: Any = None, value_serde: Any = None
    ) -> None:
        self._db = db
        self.name = name
        self.key_serde = key_serde
        self.value_serde = value_serde if value_serde is not None else MsgpackSerde()
        self._encode_key, self._decode_key = key_codec(key_serde)
        self._cf = f"{name}.kv"
        with db.batch():
            db.record_store_spec(name, self.spec())
        db.create_column_family(self._cf)

    def spec(self) -> dict[str, Any]:
        return describe_store(self.kind, 0, 0, self.key_serde, self.value_serde)

    def reconfigure(self, retention_ms: int, segment_interval_ms: int | None) -> None:
        """Key-value stores have no retention or segments; nothing to change."""

    def batch(self):
        return self._db.batch()

    def get(self, key: Any) -> Any:
        """The value of ``key``, or None."""
        raw = self._db.get(self._cf, self._encode_key(key))
        return None if raw is None else self.value_serde.loads(raw)

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value``; None deletes."""
        kb = self._encode_key(key)
        self._db.put(self._cf, kb, None if value is None else self.value_serde.dumps(value))

    def delete(self, key: Any) -> None:
        self.put(key, None)

    def items(self, key_from: Any = None, key_to: Any = None) -> Iterator[tuple[Any, Any]]:
        """Every ``(key, value)`` with ``key_from <= key <= key_to`` (None is open),
        in key order, streamed."""
        bounds = key_range(self._encode_key, key_from, key_to)
        if bounds is None:
            return
        loads, decode = self.value_serde.loads, self._decode_key
        for kb, raw in self._db.scan(self._cf, *bounds):
            yield decode(kb), loads(raw)

    def read_aux(self, name: str) -> bytes | None:
        return self._db.get_meta(b"aux:" + self.name.encode() + b":" + name.encode())

    def write_aux(self, name: str, value: bytes) -> None:
        self._db.put_meta(b"aux:" + self.name.encode() + b":" + name.encode(), value)
