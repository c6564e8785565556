"""The one registry of store kinds: kind name -> the store class that serves it.

A store class names its kind in its ``kind`` attribute, which is its key here. The
registry is what every kind-dependent place asks: the openers of
:class:`~sessionstore.stores.state_db.StateDB`, the checkpoint's
:class:`~sessionstore.stores.spec.StoreSpec` (valid kinds, opening a store from
its spec) and the reader (which filters a kind's rows take).

Every store class takes the same constructor arguments::

    cls(db, name, retention_ms, segment_interval_ms=None, key_serde=None,
        value_serde=None, **layout)

``layout`` holds the fields named in the class's ``layout`` attribute (a window
store's ``window_size_ms``), which fix what its bytes mean. Its ``row_filters``
name the time filters its ``read_rows`` takes (``from_ts``, ``to_ts``, ``as_of``).

Its classmethod ``row_key(family, raw) -> bytes`` says which user key a raw row of
its family ``<store>.<family>`` belongs to (the key's encoded bytes): a repartition
(:mod:`sessionstore.checkpoint.offline.repartition`) routes every row by it, so a new kind
needs only that method to be rescaled. A family whose rows may hold several keys'
data (a session store's blocks of closing sessions) has its rows first split into
rows of one key each by the function the class's optional classmethod
``row_splitter(family)`` gives for it (:func:`row_splitter_of`; None for a family
of one key per row, which is then read as it is).
"""

from __future__ import annotations

from collections.abc import Callable

from sessionstore.stores.kv import KeyValueStore
from sessionstore.stores.messages import MessageStore
from sessionstore.stores.processor import ProcessorStore
from sessionstore.stores.session import SessionStore
from sessionstore.stores.versioned import VersionedStore
from sessionstore.stores.window import WindowStore

__all__ = ["register", "store_class", "kind_names", "kinds_with", "row_key_of", "row_splitter_of"]

_KINDS: dict[str, type] = {}


def register(cls: type) -> type:
    """Make ``cls`` serve the kind named by ``cls.kind``; returns ``cls``.

    Raises ``ValueError`` if another class already serves that kind.
    """
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{cls!r} names no store kind (a non-empty str attribute 'kind')")
    known = _KINDS.get(kind)
    if known is not None and known is not cls:
        raise ValueError(f"store kind {kind!r} is already served by {known.__qualname__}")
    _KINDS[kind] = cls
    return cls


def store_class(kind: str) -> type:
    """The class that serves ``kind``; ``ValueError`` naming the known kinds if none."""
    try:
        return _KINDS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"store kind must be one of {kind_names()}, got {kind!r}") from None


def row_key_of(kind: str) -> Callable[[str, bytes], bytes]:
    """``row_key(family, raw)`` of ``kind``: the encoded user key a raw row of the
    store's family ``<store>.<family>`` belongs to. ``ValueError`` if the kind's class
    has none (its rows cannot be routed to partitions)."""
    hook = getattr(store_class(kind), "row_key", None)
    if hook is None:
        raise ValueError(
            f"store kind {kind!r} does not say which key its rows belong to (row_key), "
            "so its state cannot be repartitioned"
        )
    return hook


def row_splitter_of(kind: str, family: str) -> Callable[[bytes, bytes], list] | None:
    """``split(raw, value) -> [(raw, value), ...]`` for the raw rows of ``kind``'s
    family ``<store>.<family>``: the rows of one user key each that a raw row stands
    for; None when every row of that family holds one key's data (asked once per
    family, so a family of plain rows costs nothing per row)."""
    hook = getattr(store_class(kind), "row_splitter", None)
    return None if hook is None else hook(family)


def kind_names() -> tuple[str, ...]:
    """Every registered kind, in registration order."""
    return tuple(_KINDS)


def kinds_with(attribute: str, item: str) -> list[str]:
    """The kinds whose class lists ``item`` in its ``attribute`` (``layout`` or
    ``row_filters``), for error messages that say where an option applies."""
    return [k for k, cls in _KINDS.items() if item in getattr(cls, attribute, ())]


for _cls in (
    SessionStore,
    VersionedStore,
    WindowStore,
    MessageStore,
    KeyValueStore,
    ProcessorStore,
):
    register(_cls)
