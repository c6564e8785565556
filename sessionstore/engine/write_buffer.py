"""Uncommitted writes of one unit of work, readable before they are committed.

rocksdict has no ``WriteBatchWithIndex``, so this is its Python counterpart: puts,
deletes and column-family drops of a batch are held here, reads consult it first,
and :class:`~sessionstore.engine.db.Database` turns it into one atomic ``WriteBatch`` at
commit. Holding the last write per key also means a key written many times in a
micro-batch costs RocksDB one operation, and the buffer *is* the batch's changelog.

A sorted index of a family's keys is built only when a range read meets pending
writes in that family, so the usual batch shape (read everything, then write)
never pays for sorting.
"""

from __future__ import annotations

from bisect import bisect_left, insort

__all__ = ["WriteBuffer", "MISSING"]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


#: Returned by :meth:`WriteBuffer.get` when the buffer says nothing about a key.
MISSING = _Missing()


class WriteBuffer:
    """Pending puts (value bytes) and deletes (``None``) per column family."""

    __slots__ = ("families", "dropped", "created", "_sorted")

    def __init__(self) -> None:
        self.families: dict[str, dict[bytes, bytes | None]] = {}
        self.dropped: list[str] = []
        #: Families created during the batch (RocksDB creates them at once; the
        #: changelog needs them to rebuild the database elsewhere).
        self.created: list[str] = []
        self._sorted: dict[str, list[bytes]] = {}

    def __bool__(self) -> bool:
        return bool(self.families) or bool(self.dropped) or bool(self.created)

    def put(self, cf: str, key: bytes, value: bytes | None) -> None:
        """Record a put (``value`` bytes) or a delete (``value`` None)."""
        entries = self.families.get(cf)
        if entries is None:
            entries = self.families[cf] = {}
        elif cf in self._sorted and key not in entries:
            insort(self._sorted[cf], key)
        entries[key] = value

    def family_for_bulk_write(self, cf: str) -> dict[bytes, bytes | None]:
        """The pending-write dict of ``cf``, for callers that write many keys at once.

        Its sorted index is dropped (rebuilt on the next range read), so callers may
        assign ``entries[key] = value`` directly.
        """
        self._sorted.pop(cf, None)
        entries = self.families.get(cf)
        if entries is None:
            entries = self.families[cf] = {}
        return entries

    def get(self, cf: str, key: bytes) -> bytes | None | _Missing:
        """The pending value, ``None`` for a pending delete, or ``MISSING``."""
        entries = self.families.get(cf)
        if entries is None:
            return MISSING
        return entries.get(key, MISSING)

    def has_family(self, cf: str) -> bool:
        return cf in self.families

    def range(
        self, cf: str, lo: bytes | None, hi: bytes | None
    ) -> list[tuple[bytes, bytes | None]]:
        """Pending entries with ``lo <= key < hi`` in key order (None bounds are open)."""
        entries = self.families.get(cf)
        if not entries:
            return []
        index = self._sorted.get(cf)
        if index is None:
            index = self._sorted[cf] = sorted(entries)
        i = 0 if lo is None else bisect_left(index, lo)
        j = len(index) if hi is None else bisect_left(index, hi)
        return [(k, entries[k]) for k in index[i:j]]

    def drop_family(self, cf: str) -> None:
        """Forget pending writes to ``cf`` and drop the family at commit."""
        self.families.pop(cf, None)
        self._sorted.pop(cf, None)
        self.dropped.append(cf)
