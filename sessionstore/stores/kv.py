"""Key-value store: one value per key in the column family ``<store>.kv``.

For operator state that is neither windowed nor versioned (count windows keep
their open window per key here). Keys use the ordered codec, values the store's
serde; writes join the StateDB's current batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sessionstore.stores.base import UntimedStore

__all__ = ["KeyValueStore"]


class KeyValueStore(UntimedStore):
    """A plain key-value store in a StateDB. Create with ``db.kv_store(name)``.

    It takes the arguments every store kind takes; it has no retention or segments,
    so ``retention_ms`` and ``segment_interval_ms`` are ignored."""

    kind = "kv"

    @classmethod
    def row_key(cls, family: str, raw: bytes) -> bytes:
        """The encoded user key of a raw row of ``<store>.kv``: the row key itself.
        What a repartition routes by."""
        return raw

    def batch(self):
        return self._db.batch()

    def get(self, key: Any) -> Any:
        """The value of ``key``, or None."""
        raw = self._db.get(self._cf, self.encode_key(key))
        return None if raw is None else self.value_serde.loads(raw)

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value``; None deletes."""
        kb = self.encode_key(key)
        self._db.put(self._cf, kb, None if value is None else self.value_serde.dumps(value))

    def delete(self, key: Any) -> None:
        self.put(key, None)

    def items(self, key_from: Any = None, key_to: Any = None) -> Iterator[tuple[Any, Any]]:
        """Every ``(key, value)`` with ``key_from <= key <= key_to`` (None is open),
        in key order, streamed."""
        loads, decode = self.value_serde.loads, self.decode_key
        for kb, raw in self._scan(key_from, key_to):
            yield decode(kb), loads(raw)

    def _row(self, raw: bytes, value: bytes) -> dict[str, Any]:
        # rows as the reader shows them: {key, value}
        return {"key": self.decode_key(raw), "value": self.value_serde.loads(value)}
