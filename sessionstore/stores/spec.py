"""StoreSpec: a store an operator keeps (its name, kind, retention, serdes and
layout), recorded with its checkpoints and opened from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sessionstore.encoding.serde import PickleSerde, serde_from_name
from sessionstore.errors import PickleRefusedError
from sessionstore.stores.base import DEFAULT_KEY_SERDE, DEFAULT_VALUE_SERDE, describe_store
from sessionstore.stores.registry import kinds_with, store_class

__all__ = ["LAYOUT_FIELDS", "StoreSpec", "record_of_family", "refuse_pickle"]

#: The spec fields that are layout fields of some kind (a class's ``layout``).
LAYOUT_FIELDS = ("window_size_ms",)


@dataclass(frozen=True)
class StoreSpec:
    """One store of an operator. ``kind`` is a kind of
    :mod:`sessionstore.stores.registry`; ``retention_ms`` is history retention for a
    versioned store; ``window_size_ms`` is required for (and only for) windows."""

    name: str
    kind: str
    retention_ms: int
    segment_interval_ms: int | None = None
    key_serde: Any = None
    value_serde: Any = None
    window_size_ms: int | None = None

    def __post_init__(self) -> None:
        cls = store_class(self.kind)  # ValueError naming the known kinds
        if ("window_size_ms" in cls.layout) != (self.window_size_ms is not None):
            sized = " or ".join(repr(k) for k in kinds_with("layout", "window_size_ms"))
            raise ValueError(
                f"store {self.name!r}: window_size_ms is required for kind {sized} only"
            )

    def open(self, db: Any) -> Any:
        """Open (or create) this store in a :class:`~sessionstore.stores.state_db.StateDB`.

        The layout fields are those set: :meth:`__post_init__` checked that they are
        exactly the kind's, so the database's opener is the one place that asks the
        registry for the class."""
        layout = {f: getattr(self, f) for f in LAYOUT_FIELDS if getattr(self, f) is not None}
        return db.open_store(
            self.kind,
            self.name,
            self.retention_ms,
            self.segment_interval_ms,
            self.key_serde,
            self.value_serde,
            **layout,
        )

    def describe(self) -> dict[str, Any]:
        """The JSON/msgpack-able record of this spec (serdes by name): the store's
        own record (:func:`~sessionstore.stores.base.describe_store`) with its name
        first and ``window_size_ms`` last, as checkpoints have always recorded it."""
        record = describe_store(
            self.kind,
            self.retention_ms,
            self.segment_interval_ms,
            self.key_serde,
            self.value_serde,
        )
        return {"name": self.name, **record, "window_size_ms": self.window_size_ms}

    @classmethod
    def from_record(
        cls, record: dict[str, Any], allow_pickle: bool = False, where: str = "a checkpoint"
    ) -> StoreSpec:
        """Rebuild a spec recorded with built-in serdes (the CLI reads stores this way).

        A recorded ``pickle`` serde is refused (:class:`~sessionstore.errors.PickleRefusedError`
        naming the store and ``where``) unless ``allow_pickle``: whoever can write
        the checkpoint chose it, and unpickling runs their code."""
        refuse_pickle([record], where, allow_pickle)
        fields = dict(record)
        defaults = (None, DEFAULT_KEY_SERDE, DEFAULT_VALUE_SERDE)
        for side in ("key_serde", "value_serde"):
            name = fields.get(side)
            fields[side] = None if name in defaults else serde_from_name(name)
        return cls(**fields)


def refuse_pickle(
    records: list[dict[str, Any]], where: str, allow_pickle: bool = False,
    option: str = "--allow-pickle",
) -> None:  # fmt: skip
    """Raise :class:`~sessionstore.errors.PickleRefusedError` for the first store
    record of ``where`` with a ``pickle`` key or value serde, unless ``allow_pickle``
    (``option`` is how the user opts in)."""
    if allow_pickle:
        return
    for record in records:
        if PickleSerde.name in (record.get("key_serde"), record.get("value_serde")):
            raise PickleRefusedError(str(record.get("name")), where, option)


def record_of_family(
    family: str, records: dict[str, dict[str, Any]], where: str, error: type[Exception]
) -> dict[str, Any]:
    """The recorded store (``records`` by name, as ``_metadata`` lists them) that
    the column family ``family`` (``<store>`` or ``<store>.<suffix>``) belongs to;
    ``error`` naming ``where`` and the operator's stores when it belongs to none."""
    record = records.get(family.partition(".")[0])
    if record is None:
        raise error(
            f"{where}: column family {family!r} belongs to no store of the operator "
            f"(stores: {', '.join(sorted(records))})"
        )
    return record
