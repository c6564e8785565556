"""What every store shares: its names, its recorded spec and its stream time.

This module owns the names a store leaves in a database:

* the store name itself (:func:`check_store_name`), which prefixes its column
  families ``<store>.<segment id>``, ``<store>.latest``, ``<store>.kv``,
  ``<store>.closing`` (its rows, :func:`is_data_family`) and ``<store>.open`` (the
  end index);
* its keys in the ``meta`` family: ``store:<name>`` (the spec recorded by
  :func:`record_store_spec`, msgpack), ``stream_time:<name>`` (the observed stream
  time, :data:`~sessionstore.encoding.ints.INT64`) and ``aux:<name>:<aux>``
  (operator metadata saved next to the store).

A store records its spec in the ``meta`` family when first opened, keeps its time
segments as column families, and persists its observed stream time in the same
write batch as the data it wrote. On rollback it reloads both from the database.
A store without retention (:class:`UntimedStore`) keeps only its spec and rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import msgpack

from sessionstore.encoding.ints import INT64
from sessionstore.encoding.keys import TS_MIN, check_timestamp, key_range
from sessionstore.encoding.serde import MsgpackSerde, key_codec, serde_name
from sessionstore.engine.db import META_CF
from sessionstore.errors import StoreSpecMismatchError
from sessionstore.stores.segments import Segments, default_segment_interval

if TYPE_CHECKING:
    from sessionstore.engine.db import Database

__all__ = [
    "Store",
    "DBStore",
    "SegmentedDBStore",
    "DEFAULT_KEY_SERDE",
    "DEFAULT_VALUE_SERDE",
    "TimedStore",
    "UntimedStore",
    "describe_store",
    "record_store_spec",
    "store_specs",
    "check_store_name",
    "is_data_family",
    "spec_key",
    "stream_time_key",
    "aux_key",
]

_SPEC_PREFIX = b"store:"
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,120}$")
_RESERVED = {"meta", "default"}
#: Names recorded for the default serdes (no serde given).
DEFAULT_KEY_SERDE = "keycodec"
DEFAULT_VALUE_SERDE = "msgpack"


# ----------------------------------------------------------------------- names
def check_store_name(name: Any) -> None:
    """Raise ``ValueError`` unless ``name`` can name a store (and its column families)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in _RESERVED:
        raise ValueError(
            f"invalid store name {name!r}: use 1-120 letters, digits, '_' or '-', "
            f"not {sorted(_RESERVED)}"
        )


def is_data_family(store: str, family: str) -> bool:
    """Whether ``family`` holds ``store``'s rows (a segment, ``.latest``, ``.kv`` or
    the sessions kept to close at the next advance, ``.closing``) rather than an
    index such as the end index ``.open``."""
    prefix, _, suffix = family.partition(".")
    return prefix == store and (
        suffix.lstrip("-").isdigit() or suffix in ("latest", "kv", "closing")
    )


def spec_key(store: str) -> bytes:
    """Meta key of ``store``'s recorded spec."""
    return _SPEC_PREFIX + store.encode()


def stream_time_key(store: str) -> bytes:
    """Meta key of ``store``'s observed stream time."""
    return b"stream_time:" + store.encode()


def aux_key(store: str, name: str) -> bytes:
    """Meta key of the operator metadata ``name`` kept next to ``store``."""
    return b"aux:" + store.encode() + b":" + name.encode()


# ------------------------------------------------------------------------ specs
def describe_store(
    kind: str,
    retention_ms: int | None,
    segment_interval_ms: int | None,
    key_serde: Any,
    value_serde: Any,
    window_size_ms: int | None = None,
) -> dict[str, Any]:
    """The spec a store records in the ``meta`` family (and checks on reopen); the
    checkpoint's record of a store spec adds its name. Serdes are recorded by name,
    the defaults as ``"keycodec"`` and ``"msgpack"``; ``window_size_ms`` only when set."""
    spec = {
        "kind": kind,
        "retention_ms": retention_ms,
        "segment_interval_ms": segment_interval_ms,
        "key_serde": serde_name(key_serde) if key_serde else DEFAULT_KEY_SERDE,
        "value_serde": serde_name(value_serde) if value_serde else DEFAULT_VALUE_SERDE,
    }
    if window_size_ms is not None:
        spec["window_size_ms"] = window_size_ms
    return spec


def store_specs(db: Database) -> dict[str, dict[str, Any]]:
    """The recorded spec of every store in ``db``, by name."""
    specs = {}
    for key, value in db.scan(META_CF, _SPEC_PREFIX, _SPEC_PREFIX[:-1] + b";"):
        specs[key[len(_SPEC_PREFIX) :].decode()] = msgpack.unpackb(value)
    return specs


def record_store_spec(
    db: Database, name: str, spec: dict[str, Any], explicit_interval: bool = True
) -> dict[str, Any]:
    """Check ``spec`` against the recorded one for ``name`` and record it.

    ``kind`` and ``segment_interval_ms`` are fixed for a store's life (its bytes
    depend on them). Without ``explicit_interval`` the recorded interval is
    adopted. Retention and serdes may change. Returns the effective spec.
    """
    check_store_name(name)
    key = spec_key(name)
    raw = db.get_meta(key)
    effective = dict(spec)
    if raw is not None:
        recorded = msgpack.unpackb(raw)
        for field in ("kind", "window_size_ms"):  # they decide what the bytes mean
            if spec.get(field) != recorded.get(field):
                raise StoreSpecMismatchError(name, field, recorded.get(field), spec.get(field))
        interval = recorded["segment_interval_ms"]
        if not explicit_interval:
            effective["segment_interval_ms"] = interval
        elif spec["segment_interval_ms"] != interval:
            raise StoreSpecMismatchError(
                name, "segment_interval_ms", interval, spec["segment_interval_ms"]
            )
        if effective == recorded:
            return effective
    db.put_meta(key, msgpack.packb(effective))
    return effective


# ---------------------------------------------------------------- the parts
class Store:
    """What every store kind has: a name, serdes and the key codec.

    :attr:`encode_key` and :attr:`decode_key` are the codec's own functions
    (:func:`~sessionstore.encoding.serde.key_codec`) bound as attributes, so an
    operator that caches them in a local pays no extra call per key.
    """

    name: str
    key_serde: Any
    value_serde: Any
    #: ``encode_key(key) -> bytes``: the order-preserving bytes of a user key, the
    #: prefix of every row of that key (what operators group, sort and look up by).
    encode_key: Callable[[Any], bytes]
    #: ``decode_key(raw) -> key``: the inverse of :attr:`encode_key`.
    decode_key: Callable[[bytes], Any]

    def _init_store(self, name: str, key_serde: Any, value_serde: Any) -> None:
        self.name = name
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.encode_key, self.decode_key = key_codec(key_serde)


class TimedStore(Store):
    """Observed stream time, retention and segment expiry of a store with retention
    (the session-layout stores, in RocksDB or in memory, and the versioned store).

    Subclasses give :meth:`spec`, :meth:`_set_retention`, :meth:`_live_from` (the
    oldest time still live at a stream time) and :meth:`_expire`; the RocksDB stores
    persist the time through :meth:`_stream_time_changed`.
    """

    segment_interval_ms: int

    def _init_timed(
        self,
        name: str,
        retention_ms: int,
        segment_interval_ms: int | None,
        key_serde: Any,
        value_serde: Any,
    ) -> None:
        self._set_retention(retention_ms)  # validates
        self._init_store(
            name, key_serde, value_serde if value_serde is not None else MsgpackSerde()
        )
        if segment_interval_ms is None:
            segment_interval_ms = default_segment_interval(retention_ms)
        self.segment_interval_ms = segment_interval_ms
        self._dumps = self.value_serde.dumps
        self._loads = self.value_serde.loads
        self._stream_time: int | None = None
        self._time_dirty = False  # stream time changed since the last commit
        self._first_live_segment = TS_MIN  # expiry has run up to this segment
        #: Writes dropped because they were already outside retention (grace).
        self.dropped_records = 0

    def spec(self) -> dict[str, Any]:
        """The recorded description of this store (:func:`describe_store`)."""
        raise NotImplementedError

    def _set_retention(self, retention_ms: int) -> None:
        """Check and set the retention (the kind names its field)."""
        raise NotImplementedError

    @property
    def observed_stream_time(self) -> int | None:
        """Largest time accepted so far (a session's end, a version's timestamp), or
        None before the first write."""
        return self._stream_time

    def _live_from(self, stream_time: int) -> int:
        """Oldest time still live (visible, writable) at ``stream_time``."""
        raise NotImplementedError

    def _expire(self, min_live: int) -> None:
        """Forget the segments whose times all lie below ``min_live``."""
        raise NotImplementedError

    def _stream_time_changed(self) -> None:
        """Hook: the stream time moved (persist it)."""

    def advance_stream_time(self, ts: int) -> None:
        """Move observed stream time forward to ``ts`` (never back), expiring what
        falls out of retention. Operators call it with the query's event time, so
        retention follows event time even where nothing was put for a while (and
        every partition of a temporal join judges a batch by the same time)."""
        ts = check_timestamp("ts", ts)
        if self._stream_time is None or ts > self._stream_time:
            self._advance(ts)

    def _advance(self, ts: int) -> None:
        """Move stream time forward to ``ts`` (callers check that it is later) and
        expire what fell out of retention."""
        self._stream_time = ts
        if not self._time_dirty:
            self._time_dirty = True
            self._stream_time_changed()
        min_live = self._live_from(ts)
        first_live = min_live // self.segment_interval_ms
        if first_live > self._first_live_segment:
            self._first_live_segment = first_live
            self._expire(min_live)


class DBStore(Store):
    """A store inside a :class:`~sessionstore.engine.db.Database`: its write scope
    (:meth:`batch`) and the operator metadata it keeps next to its rows."""

    _db: Database

    def batch(self) -> AbstractContextManager[Any]:
        """One atomic write scope on the store's database: the writes made inside
        (to any store of that database) commit together when the outermost scope
        exits and are all discarded if it raises. Re-entrant."""
        return self._db.batch()

    def read_aux(self, name: str) -> bytes | None:
        """Operator metadata saved with :meth:`write_aux`, or None."""
        return self._db.get_meta(aux_key(self.name, name))

    def write_aux(self, name: str, value: bytes) -> None:
        """Save operator metadata ``name`` in the current batch."""
        self._db.put_meta(aux_key(self.name, name), value)


class SegmentedDBStore(DBStore, TimedStore):
    """A store with retention inside a database: its recorded spec, its segments
    as column families and its persisted stream time.

    It is a :class:`~sessionstore.engine.db.Participant` of the batches that move
    its stream time, and :meth:`reload` re-reads what it caches.
    """

    _segments: Segments

    def _attach(self, db: Database, requested_interval: int | None) -> None:
        """Record (or check) the spec, then load segments and stream time."""
        self._db = db
        self._meta_key = stream_time_key(self.name)
        with db.batch():
            spec = record_store_spec(
                db, self.name, self.spec(), explicit_interval=requested_interval is not None
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
            record_store_spec(
                self._db, self.name, spec, explicit_interval=segment_interval_ms is not None
            )
        except Exception:
            self._set_retention(old_retention)
            raise

    def segment_ids(self) -> list[int]:
        """Ids of the live history segments."""
        return self._segments.ids()

    def _load_stream_time(self) -> None:
        raw = self._db.get_meta(self._meta_key)
        self._stream_time = None if raw is None else INT64.unpack(raw)[0]

    def _stream_time_changed(self) -> None:
        self._db.enlist(self)

    def before_commit(self) -> None:
        """Write the stream time into the batch being committed."""
        self._time_dirty = False
        if self._stream_time is not None:
            self._db.put_meta(self._meta_key, INT64.pack(self._stream_time))

    def after_rollback(self) -> None:
        """Drop the rolled-back stream time and segments: re-read them."""
        self.reload()

    def reload(self) -> None:
        """Re-read the stream time and segments from the database (after a rollback
        or a replay of changelogs into it)."""
        self._time_dirty = False
        self._first_live_segment = TS_MIN  # recomputed at the next advance
        self._load_stream_time()
        self._segments.reload()


# ----------------------------------------------------------- no retention
class UntimedStore(DBStore):
    """A store without retention or segments (key-value, processor): rows keyed by
    the encoded key first in ``<store>.kv``, and the other column families its kind
    names in :attr:`families`.

    It takes the arguments every store kind takes (see
    :mod:`~sessionstore.stores.registry`) and ignores ``retention_ms`` and
    ``segment_interval_ms``. Nothing is cached in memory, so a rollback or a replay
    leaves nothing to re-read. A kind gives :meth:`_row`, the reader's row of a raw
    row of ``<store>.kv``.
    """

    kind: str
    #: Layout fields (fixed for the store's life) beyond the common arguments.
    layout: tuple[str, ...] = ()
    #: Time filters :meth:`read_rows` takes: none, these kinds keep no times.
    row_filters: frozenset[str] = frozenset()
    #: Fields of :meth:`read_rows`' rows that are event times (epoch ms), which the
    #: CLI shows as ISO-8601: none, these kinds keep no times.
    time_columns: tuple[str, ...] = ()
    #: Suffixes of its column families ``<store>.<suffix>``, created in this order;
    #: the first, ``kv``, holds the rows.
    families: tuple[str, ...] = ("kv",)
    #: The value serde when none is given.
    default_value_serde: Callable[[], Any] = MsgpackSerde
    #: Keys always use the ordered codec, whatever key serde is given.
    codec_keys_only = False

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
        self._init_store(
            name,
            None if self.codec_keys_only else key_serde,
            value_serde if value_serde is not None else self.default_value_serde(),
        )
        self._families = [f"{name}.{suffix}" for suffix in self.families]
        self._cf = self._families[0]
        with db.batch():
            record_store_spec(db, name, self.spec())
        for family in self._families:
            db.create_column_family(family)

    def spec(self) -> dict[str, Any]:
        """The recorded description of this store (no retention, no segments)."""
        return describe_store(self.kind, 0, 0, self.key_serde, self.value_serde)

    def reconfigure(self, retention_ms: int, segment_interval_ms: int | None) -> None:
        """No retention or segments; nothing to change."""

    def reload(self) -> None:
        """Nothing is cached in memory; nothing to re-read."""

    def _scan(self, key_from: Any, key_to: Any) -> Iterator[tuple[bytes, bytes]]:
        """Raw ``(row key, value)`` rows of ``<store>.kv`` whose key is in
        ``[key_from, key_to]`` (None is open), in key order, streamed."""
        bounds = key_range(self.encode_key, key_from, key_to)
        return iter(()) if bounds is None else self._db.scan(self._cf, *bounds)

    def read_rows(
        self, key: Any = None, key_from: Any = None, key_to: Any = None, **_times: Any
    ) -> Iterator[dict[str, Any]]:
        """Rows as the reader shows them (:meth:`_row`), of ``key`` or of the keys in
        ``[key_from, key_to]`` (None is open), in key order. The time filters
        (``from_ts``, ``to_ts``, ``as_of``) do not apply to these kinds: the reader
        refuses them (:attr:`row_filters`), and they are ignored here."""
        if key is not None:  # the rows of one key: those its encoding prefixes
            key_from = key_to = key
        for raw, value in self._scan(key_from, key_to):
            yield self._row(raw, value)

    def _row(self, raw: bytes, value: bytes) -> dict[str, Any]:
        """The reader's row of the raw row ``raw`` of ``<store>.kv``."""
        raise NotImplementedError
