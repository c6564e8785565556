"""What every store living in a :class:`~sessionstore.engine.db.StateDB` shares.

A store records its spec in the ``meta`` family when first opened, keeps its time
segments as column families, and persists its observed stream time in the same
write batch as the data it wrote. On rollback it reloads both from the database.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from sessionstore.encoding.keys import TS_MIN
from sessionstore.encoding.serde import serde_name
from sessionstore.stores.segments import Segments

if TYPE_CHECKING:
    from sessionstore.engine.db import StateDB

__all__ = ["DBStoreMixin", "describe_store"]

_STREAM_TIME = struct.Struct(">q")


def describe_store(
    kind: str, retention_ms: int, segment_interval_ms: int, key_serde: Any, value_serde: Any
) -> dict[str, Any]:
    """The spec a store records in the ``meta`` family (and checks on reopen)."""
    return {
        "kind": kind,
        "retention_ms": retention_ms,
        "segment_interval_ms": segment_interval_ms,
        "key_serde": serde_name(key_serde) if key_serde else "keycodec",
        "value_serde": serde_name(value_serde),
    }


class DBStoreMixin:
    """Spec, segments and persisted stream time of a store inside a StateDB."""

    name: str
    _stream_time: int | None
    _db: StateDB
    _segments: Segments

    # The store class provides spec() -> dict and _set_retention(ms); they are not
    # declared here because this mixin comes first in the method resolution order.

    def _attach(self, db: StateDB, requested_interval: int | None) -> None:
        """Record (or check) the spec, then load segments and stream time."""
        self._db = db
        self._meta_key = b"stream_time:" + self.name.encode()
        with db.batch():
            spec = db.record_store_spec(
                self.name, self.spec(), explicit_interval=requested_interval is not None
            )
        self.segment_interval_ms = spec["segment_interval_ms"]
        self._segments = Segments(db, self.name, self.segment_interval_ms)
        self._load_stream_time()

    def reconfigure(self, retention_ms: int, segment_interval_ms: int | None) -> None:
        """Change the retention (allowed) and check the segment interval (fixed)."""
        old_retention = self.spec()["retention_ms"]
        self._set_retention(retention_ms)  # validates
        spec = self.spec()
        if segment_interval_ms is not None:
            spec["segment_interval_ms"] = segment_interval_ms
        try:
            self._db.record_store_spec(
                self.name, spec, explicit_interval=segment_interval_ms is not None
            )
        except Exception:
            self._set_retention(old_retention)
            raise

    def segment_ids(self) -> list[int]:
        """Ids of the live history segments."""
        return self._segments.ids()

    def _load_stream_time(self) -> None:
        raw = self._db.get_meta(self._meta_key)
        self._stream_time = None if raw is None else _STREAM_TIME.unpack(raw)[0]

    def _stream_time_changed(self) -> None:
        self._db.enlist(self)

    # StateDB calls these around a commit or a rollback.
    def _before_commit(self) -> None:
        self._time_dirty = False
        if self._stream_time is not None:
            self._db.put_meta(self._meta_key, _STREAM_TIME.pack(self._stream_time))

    def _after_rollback(self) -> None:
        self._time_dirty = False
        self._first_live_segment = TS_MIN  # recomputed at the next advance
        self._load_stream_time()
        self._segments.reload()
