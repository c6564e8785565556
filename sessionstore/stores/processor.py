"""Processor store: the state variables, timers and TTL index of a StatefulProcessor.

Three column families, every row routable by its grouping key (the rescale tool
asks :meth:`ProcessorStore.grouping_key_of`)::

    <store>.kv      enc(grouping key) ‖ enc(variable)  ->  the variable's payload
                    enc(grouping key) ‖ enc(0)         ->  the key's timers (sorted list)
    <store>.timers  time ‖ enc(grouping key)           ->  b""   (timer index)
    <store>.ttl     time ‖ enc(grouping key) ‖ enc(variable) -> b""  (TTL index)

``time`` is 8 bytes big-endian with the sign bit flipped (as in
:mod:`sessionstore.encoding.session_key`), so an index is read in time order and
"every timer due before T" is one range read. A variable name is a str, so its
encoding (tag 02) never collides with the timers' ``enc(0)`` (tag 14). A variable's
payload is the whole variable of one key (a value, a list or a map), so loading
a key's state is one multi-get, whatever the number of its variables.

Worked example, key ``"u1"``, variable ``"count"``::

    .kv row    02 75 31 00 01 | 02 63 6F 75 6E 74 00 01
    .timers    80 00 00 00 00 00 03 E8 | 02 75 31 00 01      (timer at 1000)

Payloads are data: msgpack shaped by the schema the processor declared for the
variable (:mod:`sessionstore.encoding.state_values` gives the format). Each
variable's declaration is recorded in the ``meta`` family, in the same batch as
the state it describes, under ``aux:<store>:state:<variable>``: msgpack
``{"format": 1, "kind": "value"|"list"|"map", "value_schema": <Spark JSON struct
or nil>, "key_schema": <same, map state only>, "history": [<earlier value schemas,
version 0 first>] (only after a change)}``, so a reader (or a later schema change)
decodes the rows without the processor, whichever version wrote them (schema
evolution: docs/internals.md). No release writes pickled payloads: a store is
opened with the ``pickle`` value serde only where a caller names it, and a job
or a reader adopts a ``pickle`` recorded in a checkpoint only when its user
opted in (``allow_pickle``); without that the checkpoint is refused before a
payload is read (docs/security.md).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgpack

from sessionstore.encoding.keys import decode_key, encode_key, encoded_length
from sessionstore.encoding.serde import MsgpackSerde, PickleSerde
from sessionstore.encoding.state_values import (
    MAX_SCHEMA_VERSIONS,
    check_evolution,
    evolver,
    payload_codec,
    value_codec,
)
from sessionstore.engine.db import META_CF
from sessionstore.errors import SessionStoreError, StatefulProcessorError
from sessionstore.stores.base import UntimedStore, aux_key

__all__ = [
    "ProcessorStore", "TIMERS_VAR", "STATE_FORMAT", "encode_time", "decode_time", "readable",
]  # fmt: skip

_TIME = struct.Struct(">Q")
_SIGN = 2**63
#: The encoded variable tag of a key's timer list (an int: no str name can equal it).
TIMERS_VAR = encode_key(0)
#: The format of the payloads and of the recorded declarations (see the module doc).
STATE_FORMAT = 1
_DECLARED = "state:"  # aux name prefix of a variable's recorded declaration


def encode_time(ts: int) -> bytes:
    """8 bytes that sort like the signed time ``ts``."""
    return _TIME.pack(ts + _SIGN)


def decode_time(raw: bytes) -> int:
    """Inverse of :func:`encode_time` for the first 8 bytes of ``raw``."""
    return _TIME.unpack_from(raw)[0] - _SIGN


def _payloads(
    record: dict[str, Any],
    make_struct: Callable[[list[str]], Callable[[tuple], Any]] | None,
    plain: bool = False,
) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """``(dumps, loads)`` of a variable's payloads from its recorded declaration,
    rows of earlier value schemas (``history``) converted to the current one;
    ``plain``: a list held as bare values (no TTL)."""
    schema = record.get("value_schema")
    history = [
        (value_codec(old, make_struct), evolver(old, schema, make_struct))
        for old in record.get("history", ())
    ]
    kind = record.get("kind", "value")
    return payload_codec(
        "plain_list" if plain and kind == "list" else kind,
        value_codec(schema, make_struct),
        value_codec(record.get("key_schema"), make_struct),
        history,
    )


def recorded_declaration(store: str, variable: str, raw: bytes) -> dict[str, Any]:
    """The recorded declaration of ``variable`` (see the module doc); a
    :class:`~sessionstore.errors.SessionStoreError` naming the store, the variable
    and the format when it is not of :data:`STATE_FORMAT`: its payloads could not
    be read as this release reads them."""
    record = msgpack.unpackb(raw)
    recorded = record.get("format") if isinstance(record, dict) else None
    if recorded != STATE_FORMAT:
        raise SessionStoreError(
            f"processor store {store!r}: state variable {variable!r} is recorded in "
            f"format {recorded!r}; this sessionstore reads format {STATE_FORMAT} only"
        )
    return record


def readable(payload: Any) -> Any:
    """A stored variable for readers, without tuples as map keys: a value state as
    ``{"value": [...], "expires_ms": t}``, a list as a list of those, a map as a list
    of ``{"key": [...], "value": [...], "expires_ms": t}`` (``expires_ms`` None
    without a TTL), a key's timers as their list of times."""
    if isinstance(payload, tuple):  # a value state: (value, expiry)
        return {"value": list(payload[0]), "expires_ms": payload[1]}
    if isinstance(payload, dict):  # a map state: user key -> (value, expiry)
        return [
            {"key": list(k), "value": list(v), "expires_ms": e} for k, (v, e) in payload.items()
        ]
    if isinstance(payload, list) and payload and isinstance(payload[0], tuple):
        return [{"value": list(v), "expires_ms": e} for v, e in payload]
    return payload  # timers: a list of ints


class ProcessorStore(UntimedStore):
    """State of a StatefulProcessor in a StateDB: ``db.open_store("processor", name)``.

    The store moves bytes; :mod:`sessionstore.operators.processors` gives them
    meaning. It has no retention or segments (TTL is per variable, cleaned through
    the TTL index), so ``retention_ms`` and ``segment_interval_ms`` are ignored.
    """

    kind = "processor"
    families = ("kv", "timers", "ttl")
    # payloads are msgpack; their shape comes from each variable's declaration
    default_value_serde = MsgpackSerde
    # grouping keys always use the ordered codec
    codec_keys_only = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: opened with the pickle serde (named by the caller: see the module doc)
        self.pickled = isinstance(self.value_serde, PickleSerde)
        timers = payload_codec("timers", None)
        #: encoded variable -> (dumps, loads) of its payloads
        self._codecs: dict[bytes, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
            TIMERS_VAR: timers
        }
        #: encoded list variables declared without a TTL: held as bare values
        self._plain: set[bytes] = set()
        #: variable name -> its recorded declaration (see the module doc)
        self.declarations: dict[str, dict[str, Any]] = {}
        prefix = aux_key(self.name, _DECLARED)
        for key, raw in self._db.scan_list(META_CF, prefix, prefix[:-1] + b";"):
            variable = key[len(prefix) :].decode()
            self.declarations[variable] = recorded_declaration(self.name, variable, raw)

    def declare(
        self,
        variable: str,
        kind: str,
        value_schema: dict[str, Any] | None,
        key_schema: dict[str, Any] | None = None,
        make_struct: Callable[[list[str]], Callable[[tuple], Any]] | None = None,
        ttl: bool = True,
    ) -> None:
        """Declare a state variable of kind ``value``, ``list`` or ``map`` with its
        schemas in Spark's JSON form (None: the generic form): its payloads are
        encoded from them, and the declaration is recorded in the current batch if
        it is new or changed. ``make_struct(names)`` builds nested structs on reading.
        A list without a ``ttl`` is held and stored as its bare values (see
        :mod:`sessionstore.encoding.state_values`); the recorded declaration is the
        same either way (rows say their form).

        A value schema other than the recorded one evolves the variable (one
        comparison per declaration, so per variable and batch): what Spark's Avro
        state encoding refuses raises :class:`StatefulProcessorError` with Spark's
        condition, naming the variable and field; else the old schema joins the
        record's ``history`` and the old rows are read through it (the module doc)."""
        old = self.declarations.get(variable)
        history = list(old.get("history", ())) if old else []
        if old is not None:
            self._check_change(variable, old, kind, value_schema, key_schema)
            if old.get("value_schema") != value_schema:
                history.append(old.get("value_schema"))
        record = {
            "format": STATE_FORMAT, "kind": kind,
            "value_schema": value_schema, "key_schema": key_schema,
        }  # fmt: skip
        if history:
            record["history"] = history
        if old != record:
            self._db.put_meta(aux_key(self.name, _DECLARED + variable), msgpack.packb(record))
            self.declarations[variable] = record
        encoded = encode_key(variable)
        plain = kind == "list" and not ttl
        self._codecs[encoded] = _payloads(record, make_struct, plain)
        if plain:
            self._plain.add(encoded)
        else:
            self._plain.discard(encoded)

    @staticmethod
    def _check_change(
        variable: str,
        old: dict[str, Any],
        kind: str,
        value_schema: dict[str, Any] | None,
        key_schema: dict[str, Any] | None,
    ) -> None:
        # what a restart may not change, with Spark's conditions
        if old.get("kind") != kind:
            raise StatefulProcessorError(
                "STATE_STORE_INVALID_VARIABLE_TYPE_CHANGE",
                f"Cannot change {variable} to {kind} state between query restarts. Please "
                f"set {variable} to {old.get('kind')} state, or restart with a new "
                "checkpoint directory.",
            )
        if old.get("key_schema") != key_schema:
            raise StatefulProcessorError(
                "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
                f"Provided key schema does not match existing state key schema of map state "
                f"{variable!r}. Existing key_schema={old.get('key_schema')} and new "
                f"key_schema={key_schema} (stored user keys are not converted).",
            )
        if old.get("value_schema") == value_schema:
            return
        check_evolution(variable, old.get("value_schema"), value_schema)
        versions = len(old.get("history", ())) + 2
        if versions > MAX_SCHEMA_VERSIONS:
            raise StatefulProcessorError(
                "STATE_STORE_VALUE_SCHEMA_EVOLUTION_THRESHOLD_EXCEEDED",
                f"The number of state schema evolutions {versions - 1} exceeds the maximum "
                f"number of state schema evolutions, {MAX_SCHEMA_VERSIONS - 1}, allowed for "
                f"this column family. Offending column family: {variable}",
            )

    def _codec(self, variable: bytes) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
        """The codec of an encoded variable: declared in this process, else as
        recorded (a reader), else the generic form."""
        codec = self._codecs.get(variable)
        if codec is None:
            record = self.declarations.get(decode_key(variable)) or {}
            codec = self._codecs[variable] = _payloads(record, None)
        return codec

    @property
    def kv_cf(self) -> str:
        """The variables' family, ``<store>.kv``."""
        return self._families[0]

    @property
    def timers_cf(self) -> str:
        """The timer index, ``<store>.timers``."""
        return self._families[1]

    @property
    def ttl_cf(self) -> str:
        """The TTL index, ``<store>.ttl``."""
        return self._families[2]

    # ------------------------------------------------------------------ variables
    def load(self, key_bytes: bytes, variables: list[bytes]) -> list[Any]:
        """The payloads of ``variables`` (encoded names) of one key: one multi-get."""
        if len(variables) == 1:  # most processors have one variable: a plain get is cheaper
            raws = [self._db.get(self._cf, key_bytes + variables[0])]
        else:
            raws = self._db.get_many(self._cf, [key_bytes + v for v in variables])
        if self.pickled:
            loads = self.value_serde.loads
            payloads = [None if raw is None else loads(raw) for raw in raws]
            if self._plain:  # pickled lists are pairs
                payloads = [
                    [item for item, _ in p] if p is not None and var in self._plain else p
                    for var, p in zip(variables, payloads, strict=True)
                ]  # fmt: skip
            return payloads
        codecs = self._codecs
        return [
            None if raw is None else (codecs.get(v) or self._codec(v))[1](raw)
            for v, raw in zip(variables, raws, strict=True)
        ]

    def write(self, key_bytes: bytes, variable: bytes, payload: Any) -> None:
        """Set (None deletes) one variable of one key, in the current batch."""
        if payload is None:
            raw = None
        elif self.pickled:
            if variable in self._plain:  # pickled lists are pairs
                payload = [(item, None) for item in payload]
            raw = self.value_serde.dumps(payload)
        else:
            raw = (self._codecs.get(variable) or self._codec(variable))[0](payload)
        self._db.put(self._cf, key_bytes + variable, raw)

    def delete_variable(self, variable: bytes) -> int:
        """Delete ``variable`` of every key (``deleteIfExists``); returns rows removed.

        A full scan, but only when the processor asks for it (once, in ``init``).
        Its recorded declaration goes too: a later declaration of the name starts
        afresh, of any kind and schema."""
        name = decode_key(variable)
        if self.declarations.pop(name, None) is not None:
            self._db.put_meta(aux_key(self.name, _DECLARED + name), None)
            self._codecs.pop(variable, None)
            self._plain.discard(variable)
        removed = 0
        for raw, _ in self._db.scan_list(self._cf):
            if raw.endswith(variable) and encoded_length(raw) == len(raw) - len(variable):
                self._db.put(self._cf, raw, None)
                removed += 1
        return removed

    # ------------------------------------------------------------------ indexes
    def index_put(self, family: str, ts: int, suffix: bytes) -> None:
        """Add ``time ‖ suffix`` to an index family (``timers_cf`` or ``ttl_cf``)."""
        self._db.put(family, encode_time(ts) + suffix, b"")

    def index_delete(self, family: str, ts: int, suffix: bytes) -> None:
        self._db.put(family, encode_time(ts) + suffix, None)

    def index_before(
        self, family: str, ts: int, limit: int | None = None
    ) -> list[tuple[int, bytes]]:
        """``(time, suffix)`` of index rows with ``time < ts``, in (time, suffix)
        order, at most ``limit`` of them: one range read."""
        rows = []
        for raw, _ in self._db.scan(family, None, encode_time(ts)):
            rows.append((decode_time(raw), raw[8:]))
            if limit is not None and len(rows) >= limit:
                break
        return rows

    def index_first(self, family: str) -> int | None:
        """The earliest time in an index family (None when it is empty): one seek."""
        for raw, _ in self._db.scan(family):
            return decode_time(raw)
        return None

    # ------------------------------------------------------------------ routing
    def grouping_key_of(self, family: str, raw: bytes) -> bytes:
        """The encoded grouping key a row of ``family`` belongs to (for routing
        rows to partitions): the prefix of ``.kv`` rows, after the time in indexes."""
        store, _, suffix = family.partition(".")
        if store != self.name:
            raise ValueError(f"{family!r} is not a family of processor store {self.name!r}")
        return self.row_key(suffix, raw)

    @classmethod
    def row_key(cls, family: str, raw: bytes) -> bytes:
        """The encoded grouping key of a raw row of this kind's family ``family``
        (``kv``, ``timers`` or ``ttl``): what a repartition routes by."""
        if family == "kv":
            return raw[: encoded_length(raw)]
        if family in ("timers", "ttl"):
            return raw[8 : 8 + encoded_length(raw[8:])]
        raise ValueError(f"{family!r} is not a family of a processor store")

    # ------------------------------------------------------------------ reading
    def _row(self, raw: bytes, value: bytes) -> dict[str, Any]:
        # rows as the reader shows them, {key, state, value}: one per variable of
        # each key (state None for the key's timer list), values in shapes JSON and
        # Parquet take (see readable)
        n = encoded_length(raw)
        variable = decode_key(raw[n:])
        loads = self.value_serde.loads if self.pickled else self._codec(raw[n:])[1]
        payload = loads(value)
        if raw[n:] in self._plain and not self.pickled:  # bare values: as pairs for readers
            payload = [(item, None) for item in payload]
        return {
            "key": decode_key(raw[:n]),
            "state": None if variable == 0 else variable,
            "value": readable(payload),
        }
