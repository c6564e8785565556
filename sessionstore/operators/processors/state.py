"""State variables of a StatefulProcessor: PySpark's ValueState, ListState and
MapState, and sessionstore's session and versioned state, for the current key.

Every variable of a grouping key is one row of the processor store (see
:mod:`sessionstore.stores.processor`): the first access to any variable of a key
loads all of them in one multi-get into the key's
:class:`~sessionstore.operators.processors.core.KeyScope`, calls work on Python
objects, and the variables that changed are written back once when the key is
done, into the batch's write buffer (the
:class:`~sessionstore.operators.processors.core.ProcessorCore` each variable is
given does both). A state call therefore costs a dict
look-up, not a RocksDB read, let alone a round trip to the JVM.

Values follow PySpark 4's conventions: a value is a tuple (or Row) with one item
per schema field; ``get`` returns a plain tuple (None when absent); numpy and
pandas scalars are stored as Python values. With a TTL each value (each list
element, each map entry) expires ``ttl`` ms after the processing time of the
batch that wrote it, and is never returned once ``batch time >= expiry``, as in
Spark.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sessionstore.encoding.keys import encode_key
from sessionstore.encoding.state_values import StructLengthMismatch
from sessionstore.errors import StatefulProcessorError
from sessionstore.operators.processors.core import ProcessorCore

__all__ = [
    "ValueState",
    "ListState",
    "MapState",
    "SessionState",
    "VersionedState",
    "normalise",
    "as_value",
]

_SCALARS = frozenset({bool, int, float, str, bytes, type(None), datetime, date, Decimal})


def normalise(v: Any) -> Any:
    """``v`` with numpy and pandas scalars as Python values, recursively (as PySpark
    normalises state values before it serialises them)."""
    t = type(v)
    if t in _SCALARS:
        return v
    if hasattr(v, "dtype") and hasattr(v, "item"):  # numpy scalar
        return v.item()
    if hasattr(v, "to_pydatetime"):  # pandas Timestamp
        return v.to_pydatetime()
    if hasattr(v, "to_pytimedelta"):
        return v.to_pytimedelta()
    if isinstance(v, tuple):
        if hasattr(v, "_fields") or hasattr(v, "__fields__"):  # namedtuple, Row
            return type(v)(*map(normalise, v))
        return tuple(map(normalise, v))
    if isinstance(v, list):
        return [normalise(x) for x in v]
    if isinstance(v, dict):
        return {normalise(k): normalise(x) for k, x in v.items()}
    return v


def _is_plain(v: Any) -> bool:
    """Whether ``v`` is already as stored: a plain tuple (not a Row) of Python
    scalars, the shape of nearly every state call. Hot paths test this before
    calling :func:`as_value`, so that a plain value costs no call."""
    if type(v) is not tuple:
        return False
    if len(v) == 1:  # the usual shape: no loop
        return type(v[0]) in _SCALARS
    for x in v:
        if type(x) not in _SCALARS:
            return False
    return True


def as_value(state: str, v: Any) -> tuple:
    """A state value as stored: a plain tuple of normalised items. None is refused
    with Spark's error (a value state is cleared with ``clear()``)."""
    if v is None:
        raise StatefulProcessorError(
            "ILLEGAL_STATE_STORE_VALUE.NULL_VALUE",
            f"Cannot write null values to State Store for StateName {state}.",
        )
    if _is_plain(v):  # already as stored, and immutable: no copy
        return v
    if not isinstance(v, (tuple, list)):
        raise StatefulProcessorError(
            "ILLEGAL_STATE_STORE_VALUE",
            f"state {state!r} takes a tuple or Row with one item per schema field, "
            f"got {type(v).__name__} {v!r}",
        )
    return tuple(map(normalise, v))


class _Variable:
    """What every state variable shares: its name, encoded name, TTL and core."""

    kind = ""
    #: ``shape(value)``: a value as PySpark's state client converts it and it reads
    #: back (nested structs given as dicts or Rows; see
    #: :func:`sessionstore.encoding.state_values.value_shaper`), None when the
    #: schema has no struct, array or map (values are stored as given)
    shape: Callable[[tuple], tuple] | None = None
    #: what a call the JVM would refuse raises (PySpark's error, in Spark)
    runtime_error: Callable[[str], Exception] = RuntimeError

    def __init__(self, core: ProcessorCore, name: str, ttl_ms: int | None) -> None:
        self._core = core
        self._name = name
        self.encoded = encode_key(name)
        self.ttl_ms = ttl_ms

    def _shaped(self, value: tuple, call: str) -> tuple:
        """``value`` through :attr:`shape`; a struct of the wrong length raises the
        runtime error PySpark raises for the JVM's refusal of the call."""
        try:
            return self.shape(value)  # type: ignore[misc]
        except StructLengthMismatch as e:
            raise self.runtime_error(f"{self.CALL_ERRORS[call]}: {e}") from None

    # A state call is a few dict look-ups, so the calls around them are most of
    # its cost: the hot methods read the current key's loaded payloads directly
    # and fall back to the core (which loads the key, or raises outside a key).
    def _payload(self) -> Any:
        scope = self._core.scope
        if scope is not None and scope.loaded:
            return scope.payloads[self.encoded]
        return self._core.payload(self.encoded)

    def _set(self, payload: Any) -> None:
        scope = self._core.scope
        if scope is not None and scope.loaded:
            scope.payloads[self.encoded] = payload
            scope.dirty.add(self.encoded)
        else:
            self._core.set_payload(self.encoded, payload)

    #: How PySpark's state client answers each call the JVM refuses (on a variable
    #: ``deleteIfExists`` removed, say): the start of its error's message, or None
    #: for an iterator, which it ends empty.
    CALL_ERRORS: dict[str, str | None] = {}

    def mark_deleted(self, error: Callable[[str], Exception]) -> None:
        """Make every call refuse as Spark's does on a variable that
        ``deleteIfExists`` removed (``error(message)`` is the exception to raise).
        The refusals are instance attributes shadowing the methods, so a live
        variable's calls cost nothing more."""
        for method, message in self.CALL_ERRORS.items():
            if message is None:
                refusal = _empty_iterator
            else:
                text = (
                    f"{message}: state variable {self._name!r} was deleted by "
                    "deleteIfExists in init"
                )
                refusal = functools.partial(_refuse, error, text)
            setattr(self, method, refusal)

    def _expiry(self) -> int | None:
        return None if self.ttl_ms is None else self._core.processing_ms + self.ttl_ms

    def _live(self, expiry: int | None) -> bool:
        return expiry is None or self._core.processing_ms < expiry

    def purge(self, payload: Any) -> Any:
        """``payload`` without expired items (None when nothing is left)."""
        return payload

    @staticmethod
    def min_expiry(payload: Any) -> int | None:
        """The earliest expiry in ``payload`` (its TTL index entry), or None."""
        return None


class ValueState(_Variable):
    """PySpark's ``ValueState``: one value (a tuple) per grouping key."""

    kind = "value"
    CALL_ERRORS = {
        "exists": "Error checking value state exists",
        "get": "Error getting value state",
        "update": "Error updating value state",
        "clear": "Error clearing value state",
    }

    def exists(self) -> bool:
        """Whether the key has a (live) value."""
        p = self._payload()
        return p is not None and self._live(p[1])

    def get(self) -> tuple | None:
        """The value, or None."""
        p = self._payload()
        return p[0] if p is not None and self._live(p[1]) else None

    def update(self, newValue: tuple) -> None:  # noqa: N803 - PySpark's name
        """Set the value (and restart its TTL)."""
        value = newValue if _is_plain(newValue) else as_value(self._name, newValue)
        if self.shape is not None:
            value = self._shaped(value, "update")
        self._set((value, self._expiry()))

    def clear(self) -> None:
        """Remove the value."""
        self._set(None)

    def purge(self, payload: Any) -> Any:
        return payload if payload is None or self._live(payload[1]) else None

    @staticmethod
    def min_expiry(payload: Any) -> int | None:
        return None if payload is None else payload[1]


class ListState(_Variable):
    """PySpark's ``ListState``: a list of tuples per grouping key; with a TTL each
    element expires on its own.

    Its payload is a list of ``(value, expiry)`` pairs with a TTL, and of the bare
    values without one (whose elements never expire): no pair per element to
    make, pack, unpack and take apart (the store stores the form it holds)."""

    kind = "list"
    CALL_ERRORS = {
        "exists": "Error checking value state exists",
        "get": None,
        "put": "Error updating value state",
        "appendValue": "Error updating value state",
        "appendList": "Error updating value state",
        "clear": "Error clearing value state",
    }

    def _live_values(self) -> list:
        """The values of the live elements (the payload itself without a TTL: not
        to be changed)."""
        p = self._payload()
        if p is None:
            return []
        if self.ttl_ms is None:
            return p
        return [item[0] for item in p if self._live(item[1])]

    def exists(self) -> bool:
        """Whether the list has a (live) element."""
        return bool(self._live_values())

    def get(self) -> Iterator[tuple]:
        """An iterator over the elements (a snapshot: later changes do not show)."""
        return iter(list(self._live_values()))

    def _values(self, state: str, values: Any, call: str) -> list:
        """The elements to store of the values ``values`` (pairs with a TTL)."""
        if values is None:
            raise StatefulProcessorError(
                "ILLEGAL_STATE_STORE_VALUE.NULL_VALUE",
                f"Cannot write null values to State Store for StateName {state}.",
            )
        if self.shape is not None:
            values = [self._shaped(as_value(state, v), call) for v in values]
        # per element: the usual one-field plain tuple is tested inline (no call)
        if self.ttl_ms is None:
            return [
                v
                if type(v) is tuple and len(v) == 1 and type(v[0]) in _SCALARS
                else (v if _is_plain(v) else as_value(state, v))
                for v in values
            ]
        expiry = self._expiry()
        return [
            (v, expiry)
            if type(v) is tuple and len(v) == 1 and type(v[0]) in _SCALARS
            else (v if _is_plain(v) else as_value(state, v), expiry)
            for v in values
        ]

    def put(self, newState: list[tuple]) -> None:  # noqa: N803 - PySpark's name
        """Replace the list (an empty list is refused, as in Spark)."""
        items = self._values(self._name, newState, "put")
        if not items:
            raise StatefulProcessorError(
                "ILLEGAL_STATE_STORE_VALUE.EMPTY_LIST_VALUE",
                f"Cannot write empty list values to State Store for StateName {self._name}.",
            )
        self._set(items)

    def appendValue(self, newState: tuple) -> None:  # noqa: N802,N803 - PySpark's names
        """Append one element."""
        # the payload is this scope's own copy (unpacked on load): append in place
        items = self._payload()
        if items is None:
            items = []
        value = newState if _is_plain(newState) else as_value(self._name, newState)
        if self.shape is not None:
            value = self._shaped(value, "appendValue")
        items.append(value if self.ttl_ms is None else (value, self._expiry()))
        self._set(items)

    def appendList(self, newState: list[tuple]) -> None:  # noqa: N802,N803 - PySpark's names
        """Append several elements (an empty list is refused, as in Spark)."""
        items = self._values(self._name, newState, "appendList")
        if not items:
            raise StatefulProcessorError(
                "ILLEGAL_STATE_STORE_VALUE.EMPTY_LIST_VALUE",
                f"Cannot write empty list values to State Store for StateName {self._name}.",
            )
        current = self._payload()  # this scope's own copy: extend in place
        if current is not None:
            current.extend(items)
            items = current
        self._set(items)

    def clear(self) -> None:
        """Remove every element."""
        self._set(None)

    def purge(self, payload: Any) -> Any:
        if payload is None or self.ttl_ms is None:
            return payload
        live = [item for item in payload if self._live(item[1])]
        return live or None

    @staticmethod
    def min_expiry(payload: Any) -> int | None:
        return None if not payload else _earliest(map(_second, payload))


class MapState(_Variable):
    """PySpark's ``MapState``: a map from user-key tuples to value tuples per
    grouping key; with a TTL each entry expires on its own."""

    kind = "map"
    CALL_ERRORS = {
        "exists": "Error checking map state exists",
        "getValue": "Error getting value",
        "containsKey": "Error checking if map state contains key",
        "updateValue": "Error updating map state value",
        "iterator": None,
        "keys": None,
        "values": None,
        "removeKey": "Error removing key from map state",
        "clear": "Error clearing map state",
    }

    def __init__(
        self,
        core: ProcessorCore,
        name: str,
        ttl_ms: int | None,
        key_fields: int | None = None,
        runtime_error: Callable[[str], Exception] = RuntimeError,
    ) -> None:
        super().__init__(core, name, ttl_ms)
        #: fields of the user-key schema, where the engine parsed it
        self.key_fields = key_fields
        #: what a call the JVM would refuse raises (PySpark's error, in Spark)
        self.runtime_error = runtime_error

    def _map(self) -> dict:
        p = self._payload()
        if p is None:
            return {}
        if self.ttl_ms is None:
            return p
        return {k: item for k, item in p.items() if self._live(item[1])}

    def _user_key(self, key: Any, call: str) -> tuple:
        if key is None:
            raise StatefulProcessorError(
                "ILLEGAL_STATE_STORE_VALUE.NULL_VALUE",
                f"Cannot write null values to State Store for StateName {self._name}.",
            )
        if type(key) is str:
            return self._bare_str_key(key, call)
        return as_value(self._name, key)

    def _bare_str_key(self, key: str, call: str) -> tuple:
        """A bare str user key, as PySpark's serializer takes it: as the sequence of
        its characters, so ``"0"`` is the key ``("0",)`` of a one-field schema and a
        longer str does not fit one (Spark's ``STRUCT_ARRAY_LENGTH_MISMATCH``)."""
        chars = tuple(key)
        if self.key_fields is not None and len(chars) != self.key_fields:
            raise self.runtime_error(
                f"{self.CALL_ERRORS[call]}: [STRUCT_ARRAY_LENGTH_MISMATCH] Input row doesn't "
                f"have expected number of values required by the schema. {self.key_fields} "
                f"fields are required while {len(chars)} values are provided (the bare str "
                f"key {key!r} is taken as its characters, as PySpark does: pass a tuple, "
                f"({key!r},))"
            )
        return chars

    def exists(self) -> bool:
        """Whether the map has a (live) entry."""
        return bool(self._map())

    def _entry(self, key: tuple, call: str = "getValue") -> tuple | None:
        """The live ``(value, expiry)`` of one user key: a dict look-up, not a
        filtered copy of the map (dedup maps ask this per event)."""
        # dedup maps ask this per event: a one-field plain key is tested here, the
        # loaded payload read directly and _live inlined (no call for any of them)
        if type(key) is not tuple or len(key) != 1 or type(key[0]) not in _SCALARS:
            key = key if _is_plain(key) else self._user_key(key, call)
        core = self._core
        scope = core.scope
        if scope is not None and scope.loaded:
            entries = scope.payloads[self.encoded]
        else:
            entries = core.payload(self.encoded)
        if entries is None:
            return None
        item = entries.get(key)
        if item is None or (item[1] is not None and core.processing_ms >= item[1]):
            return None
        return item

    def getValue(self, key: tuple) -> tuple | None:  # noqa: N802 - PySpark's name
        """The value of user key ``key``, or None."""
        item = self._entry(key)
        return None if item is None else item[0]

    def containsKey(self, key: tuple) -> bool:  # noqa: N802 - PySpark's name
        """Whether user key ``key`` has a (live) value."""
        return self._entry(key, "containsKey") is not None

    def updateValue(self, key: tuple, value: tuple) -> None:  # noqa: N802 - PySpark's name
        """Set the value of user key ``key`` (and restart its TTL)."""
        # a call per event in dedup maps: the one-field plain tuples are tested
        # inline, the loaded scope read and marked directly (no call for any)
        if type(key) is not tuple or len(key) != 1 or type(key[0]) not in _SCALARS:
            key = key if _is_plain(key) else self._user_key(key, "updateValue")
        if type(value) is not tuple or len(value) != 1 or type(value[0]) not in _SCALARS:
            value = value if _is_plain(value) else as_value(self._name, value)
        if self.shape is not None:
            value = self._shaped(value, "updateValue")
        core = self._core
        scope = core.scope
        if scope is None or not scope.loaded:
            core.payload(self.encoded)  # loads the key (Spark's error outside one)
            scope = core.scope
        encoded = self.encoded
        entries = scope.payloads[encoded]  # this scope's own copy: update in place
        if entries is None:
            entries = scope.payloads[encoded] = {}
        ttl = self.ttl_ms
        entries[key] = (value, None if ttl is None else core.processing_ms + ttl)
        scope.dirty.add(encoded)

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        """``(user key, value)`` pairs (a snapshot)."""
        return iter([(k, item[0]) for k, item in self._map().items()])

    def keys(self) -> Iterator[tuple]:
        """The user keys (a snapshot)."""
        return iter(list(self._map()))

    def values(self) -> Iterator[tuple]:
        """The values (a snapshot)."""
        return iter([item[0] for item in self._map().values()])

    def removeKey(self, key: tuple) -> None:  # noqa: N802 - PySpark's name
        """Remove user key ``key`` (no-op if absent)."""
        user_key = self._user_key(key, "removeKey")
        entries = self._payload()
        if entries is not None and user_key in entries:
            del entries[user_key]
            self._set(entries or None)

    def clear(self) -> None:
        """Remove every entry."""
        self._set(None)

    def purge(self, payload: Any) -> Any:
        if payload is None or self.ttl_ms is None:
            return payload
        live = {k: item for k, item in payload.items() if self._live(item[1])}
        return live or None

    @staticmethod
    def min_expiry(payload: Any) -> int | None:
        return None if not payload else _earliest(map(_second, payload.values()))


_second = operator.itemgetter(1)


def _earliest(expiries: Iterator[int | None]) -> int | None:
    """The least of ``expiries`` that is not None, or None. Every item of a list or
    map has an expiry, or none has (a TTL is per variable), so one ``min`` in C
    decides; items written before a TTL was set take the generic path."""
    expiries = list(expiries)
    try:
        return min(expiries)
    except TypeError:  # None among ints (or only Nones)
        live = [e for e in expiries if e is not None]
        return min(live) if live else None


def _empty_iterator() -> Iterator[Any]:
    return iter(())


def _refuse(error: Callable[[str], Exception], message: str, *args: Any) -> Any:
    raise error(message)


class SessionState:
    """sessionstore's own state: the sessions of the current grouping key in a
    session store (KIP-94 layout), for processors that merge sessions themselves.
    Sessions are ``[start, end]`` in ms with any msgpack-able value."""

    def __init__(self, core: ProcessorCore, store: Any) -> None:
        self._core = core
        self._store = store

    def fetch(self) -> list[tuple[int, int, Any]]:
        """Every visible session of the key as ``(start, end, value)``, by end."""
        return [(w.start, w.end, v) for w, v in self._store.fetch(self._store_key())]

    def find(self, earliest_end: int, latest_start: int) -> list[tuple[int, int, Any]]:
        """Sessions with ``end >= earliest_end`` and ``start <= latest_start``."""
        found = self._store.find_sessions(self._store_key(), earliest_end, latest_start)
        return [(w.start, w.end, v) for w, v in found]

    def get(self, start: int, end: int) -> Any:
        """The value of exactly the session ``[start, end]``, or None."""
        return self._store.fetch_session(self._store_key(), start, end)

    def put(self, start: int, end: int, value: Any) -> None:
        """Store the session ``[start, end]`` (moves the store's stream time to ``end``)."""
        self._store.put(self._store_key(), start, end, value)

    def remove(self, start: int, end: int) -> None:
        """Delete the session ``[start, end]``."""
        self._store.remove(self._store_key(), start, end)

    def _store_key(self) -> Any:
        return self._core.current_store_key("session state")


class VersionedState:
    """sessionstore's own state: a versioned value per grouping key (KIP-889), for
    as-of lookups (``get(as_of=t)``) inside a processor."""

    def __init__(self, core: ProcessorCore, store: Any) -> None:
        self._core = core
        self._store = store

    def _store_key(self) -> Any:
        return self._core.current_store_key("versioned state")

    def put(self, value: Any, timestamp: int) -> None:
        """Record ``value`` valid from ``timestamp`` (older than the history retention
        behind stream time is rejected, as in Kafka)."""
        self._store.put(self._store_key(), value, timestamp)

    def delete(self, timestamp: int) -> None:
        """A tombstone from ``timestamp``."""
        self._store.delete(self._store_key(), timestamp)

    def get(self, as_of: int | None = None) -> Any:
        """The record (``value``, ``timestamp``) valid at ``as_of`` (latest if None),
        or None."""
        return self._store.get(self._store_key(), as_of)

    def versions(self, from_ts: int | None = None, to_ts: int | None = None) -> list[Any]:
        """The versions valid in ``[from_ts, to_ts]``, newest first."""
        return self._store.get_versions(self._store_key(), from_ts, to_ts)
