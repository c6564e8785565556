"""StoreSpec: the stores an operator keeps, recorded with its checkpoints."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sessionstore.encoding.serde import serde_from_name, serde_name

__all__ = ["StoreSpec", "KINDS"]

KINDS = ("session", "versioned", "window", "messages", "kv")


@dataclass(frozen=True)
class StoreSpec:
    """One store of an operator. ``retention_ms`` is history retention for a
    versioned store; ``window_size_ms`` is required for (and only for) windows."""

    name: str
    kind: str
    retention_ms: int
    segment_interval_ms: int | None = None
    key_serde: Any = None
    value_serde: Any = None
    window_size_ms: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"store kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == "window") != (self.window_size_ms is not None):
            raise ValueError(
                f"store {self.name!r}: window_size_ms is required for kind 'window' only"
            )

    def open(self, db: Any) -> Any:
        """Open (or create) this store in a StateDB."""
        kw = {"key_serde": self.key_serde, "value_serde": self.value_serde}
        if self.kind == "kv":
            return db.kv_store(self.name, **kw)
        if self.kind == "window":
            return db.window_store(
                self.name, self.retention_ms, self.window_size_ms, self.segment_interval_ms, **kw
            )
        opener = {
            "session": db.session_store,
            "versioned": db.versioned_store,
            "messages": db.message_store,
        }[self.kind]
        return opener(self.name, self.retention_ms, self.segment_interval_ms, **kw)

    def describe(self) -> dict[str, Any]:
        """The JSON/msgpack-able record of this spec (serdes by name)."""
        record = asdict(self)
        record["key_serde"] = serde_name(self.key_serde) if self.key_serde else "keycodec"
        record["value_serde"] = serde_name(self.value_serde) if self.value_serde else "msgpack"
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> StoreSpec:
        """Rebuild a spec recorded with built-in serdes (the CLI reads stores this way)."""
        fields = dict(record)
        for side in ("key_serde", "value_serde"):
            name = fields.get(side)
            fields[side] = None if name in (None, "keycodec", "msgpack") else serde_from_name(name)
        return cls(**fields)
