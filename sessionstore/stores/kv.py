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
from sessionstore.stores.base import AuxMixin, describe_store, record_store_spec

if TYPE_CHECKING:
    from sessionstore.engine.db import Database

__all__ = ["KeyValueStore"]


class KeyValueStore(AuxMixin):
    """A plain key-value store in a StateDB. Create with ``db.kv_store(name)``.

    It takes the arguments every store kind takes; it has no retention or segments,
    so ``retention_ms`` and ``segment_interval_ms`` are ignored."""

    kind = "kv"
    #: Layout fields (fixed for the store's life) beyond the common arguments.
    layout: tuple[str, ...] = ()
    #: Time filters :meth:`read_rows` takes: none, a key has one value.
    row_filters: frozenset[str] = frozenset()

    def __init__(
        self,
        db: Database,
        name: str,
        retention_ms: int = 0,
        segment_interval_ms: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> None:
        self._db = db
        self.name = name
        self.key_serde = key_serde
        self.value_serde = value_serde if value_serde is not None else MsgpackSerde()
        self._encode_key, self._decode_key = key_codec(key_serde)
        self._cf = f"{name}.kv"
        with db.batch():
            record_store_spec(db, name, self.spec())
        db.create_column_family(self._cf)

    @classmethod
    def row_key(cls, family: str, raw: bytes) -> bytes:
        """The encoded user key of a raw row of ``<store>.kv``: the row key itself.
        What a repartition routes by."""
        return raw

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

    def read_rows(
        self,
        key: Any = None,
        key_from: Any = None,
        key_to: Any = None,
        from_ts: int | None = None,
        to_ts: int | None = None,
        as_of: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Rows as the reader shows them, ``{key, value}``, of ``key`` or of the keys
        in ``[key_from, key_to]``. The time filters do not apply to this kind."""
        if key is not None:
            value = self.get(key)
            if value is not None:
                yield {"key": key, "value": value}
            return
        for k, value in self.items(key_from, key_to):
            yield {"key": k, "value": value}

    def reload(self) -> None:
        """Nothing is cached in memory; nothing to re-read."""
