"""Processor store: the state variables, timers and TTL index of a StatefulProcessor.

Three column families, every row routable by its grouping key (the rescale tool
asks :meth:`ProcessorStore.grouping_key_of`)::

    <store>.kv      enc(grouping key) ‖ enc(variable)  ->  pickled variable payload
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
"""

from __future__ import annotations

import struct
from typing import Any

from sessionstore.encoding.keys import decode_key, encode_key, encoded_length
from sessionstore.encoding.serde import PickleSerde
from sessionstore.stores.base import UntimedStore

__all__ = ["ProcessorStore", "TIMERS_VAR", "encode_time", "decode_time", "readable"]

_TIME = struct.Struct(">Q")
_SIGN = 2**63
#: The encoded variable tag of a key's timer list (an int: no str name can equal it).
TIMERS_VAR = encode_key(0)


def encode_time(ts: int) -> bytes:
    """8 bytes that sort like the signed time ``ts``."""
    return _TIME.pack(ts + _SIGN)


def decode_time(raw: bytes) -> int:
    """Inverse of :func:`encode_time` for the first 8 bytes of ``raw``."""
    return _TIME.unpack_from(raw)[0] - _SIGN


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
    default_value_serde = PickleSerde
    # grouping keys always use the ordered codec
    codec_keys_only = True

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

    def encode_key(self, key: Any) -> bytes:
        """The ordered encoding of a grouping key (the prefix of all its rows)."""
        return self._encode_key(key)

    # ------------------------------------------------------------------ variables
    def load(self, key_bytes: bytes, variables: list[bytes]) -> list[Any]:
        """The payloads of ``variables`` (encoded names) of one key: one multi-get."""
        raws = self._db.get_many(self._cf, [key_bytes + v for v in variables])
        loads = self.value_serde.loads
        return [None if raw is None else loads(raw) for raw in raws]

    def write(self, key_bytes: bytes, variable: bytes, payload: Any) -> None:
        """Set (None deletes) one variable of one key, in the current batch."""
        raw = None if payload is None else self.value_serde.dumps(payload)
        self._db.put(self._cf, key_bytes + variable, raw)

    def delete_variable(self, variable: bytes) -> int:
        """Delete ``variable`` of every key (``deleteIfExists``); returns rows removed.

        A full scan, but only when the processor asks for it (once, in ``init``)."""
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
        return {
            "key": decode_key(raw[:n]),
            "state": None if variable == 0 else variable,
            "value": readable(self.value_serde.loads(value)),
        }
