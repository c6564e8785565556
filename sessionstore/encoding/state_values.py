"""State values of a StatefulProcessor as data: msgpack, shaped by the schema the
processor declares for each variable, never pickle.

A schema is Spark's JSON form of a ``StructType`` (what ``StructType.jsonValue()``
returns: ``{"type": "struct", "fields": [{"name", "type", "nullable", "metadata"}]}``);
the engine that runs the processor turns a ``StructType`` or DDL string into it
(this package never imports pyspark). A value (a tuple with one item per field)
is stored as a msgpack array with one item per field, each field as its declared
type says:

=============================  =================================================
Spark type                     stored as (msgpack)
=============================  =================================================
byte, short, integer, long     int
float, double                  float 64
boolean, string, binary, null  bool, str, bin, nil
timestamp                      int: microseconds since the epoch (the instant;
                               a naive datetime is local time, as PySpark's
                               ``TimestampType.toInternal``); read back as a
                               naive local datetime, as PySpark does
timestamp_ntz                  int: microseconds since 1970-01-01 of the wall
                               clock; read back as a naive datetime
date                           int: days since 1970-01-01
decimal(p,s)                   str: the decimal's exact text (``"12.30"``)
interval day to second, ...    int: microseconds (a ``timedelta``)
array<T>                       array of T
map<K,V>                       map K -> V
struct<...>                    array, one item per field (nested values)
=============================  =================================================

Null is nil for every type. Any other type (a UDT, a variant) and a variable
declared without a parsed schema use the *generic* form: msgpack with extension
types for the few Python types msgpack lacks
(:mod:`sessionstore.encoding.msgpack_ext`, the default value serde's too), still
data only.

A variable's payload (what one row of the processor store holds) wraps its values
with their TTL expiry (ms, or nil without a TTL):

* value state: ``[value, expiry]``;
* list state: ``[[value, expiry], ...]``; a list without a TTL (whose elements
  never expire) is held as its bare values, in memory and stored: the byte
  ``c1`` (a byte msgpack never uses) then ``[value, ...]``. Either form reads as
  either: a list given a TTL later reads the bare values with no expiry, one that
  lost its TTL drops the expiries, as it ignores them. Worked example,
  ``ListState("items", "item string")`` without a TTL holding ``("a",)`` and
  ``("b",)``: ``c1 92 91 a1 61 91 a1 62`` (with a TTL: ``92 92 91 a1 61 cf ...``);
* map state: a msgpack map ``{user key: [value, expiry]}`` whose keys are arrays
  (decode with ``use_list=False`` so that they are hashable, and
  ``strict_map_key=False``);
* a key's timers: ``[time, ...]`` (ms, ascending).

Worked example: ``ValueState("last", "ts timestamp, amount decimal(10,2)")`` holding
``(datetime(2024, 1, 1), Decimal("12.30"))`` (in a UTC session) with no TTL is
stored as ``92 92 cf 00 06 0d d7 10 21 20 00 a5 31 32 2e 33 30 c0``: a 2-array of
the value (a 2-array of the uint 1704067200000000 and the str ``"12.30"``) and nil.

Schema evolution
----------------
A variable whose value schema changed between runs keeps its earlier schemas
(version 0, 1, ...; the current one is the next). Rows are rewritten lazily: a
row written under version ``n >= 1`` is the payload above after one byte ``n``
(a msgpack positive fixint; no payload starts with one, payloads being arrays or
maps); a row without it is version 0, so a variable that never changed has no
prefix and no per-row check. An older row is decoded with its own version's
codec, then each value mapped by field name into the current schema
(:func:`evolver`: a field the old schema lacks is None, a dropped one is
ignored, ints widen to floats, strings to binary). :func:`check_evolution`
refuses what Spark's Avro state encoding refuses.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

import msgpack

from sessionstore.encoding.msgpack_ext import EPOCH, EPOCH_ORDINAL, ext_default, ext_hook, micros
from sessionstore.errors import StatefulProcessorError

__all__ = [
    "ValueCodec",
    "StructLengthMismatch",
    "value_shaper",
    "check_evolution",
    "evolver",
    "MAX_SCHEMA_VERSIONS",
    "PLAIN_LIST",
    "value_codec",
    "payload_codec",
    "generic_packb",
    "generic_unpackb",
]

#: A converter turns one field's Python value into what is packed (or back).
Convert = Callable[[Any], Any]


#: ``packb``/``unpackb`` of the generic form (tuples and arrays read back as tuples).
generic_packb: Callable[[Any], bytes] = msgpack.Packer(default=ext_default, use_bin_type=True).pack
generic_unpackb: Callable[[bytes], Any] = partial(
    msgpack.unpackb, raw=False, use_list=False, strict_map_key=False, ext_hook=ext_hook
)


# ------------------------------------------------------------- typed converters
def _timestamp_in(v: Any) -> Any:
    if v is None or type(v) is int:
        return v
    seconds = calendar.timegm(v.utctimetuple()) if v.tzinfo else time.mktime(v.timetuple())
    return int(seconds) * 1_000_000 + v.microsecond


def _timestamp_out(v: Any) -> Any:
    if v is None:
        return None
    return datetime.fromtimestamp(v // 1_000_000).replace(microsecond=v % 1_000_000)


def _ntz_in(v: Any) -> Any:
    if v is None or type(v) is int:
        return v
    return calendar.timegm(v.timetuple()) * 1_000_000 + v.microsecond


def _ntz_out(v: Any) -> Any:
    return None if v is None else EPOCH + timedelta(microseconds=v)


def _date_in(v: Any) -> Any:
    return v if v is None or type(v) is int else v.toordinal() - EPOCH_ORDINAL


def _date_out(v: Any) -> Any:
    return None if v is None else date.fromordinal(v + EPOCH_ORDINAL)


def _decimal_in(v: Any) -> Any:
    return None if v is None else str(v)


def _decimal_out(v: Any) -> Any:
    return None if v is None else Decimal(v)


def _interval_in(v: Any) -> Any:
    return v if v is None or type(v) is int else micros(v)


def _interval_out(v: Any) -> Any:
    return None if v is None else timedelta(microseconds=v)


_NATIVE = frozenset(
    {"byte", "short", "integer", "long", "float", "double", "boolean", "string", "binary",
     "null", "void", "char", "varchar"}
)  # fmt: skip
_SIMPLE: dict[str, tuple[Convert, Convert]] = {
    "timestamp": (_timestamp_in, _timestamp_out),
    "timestamp_ntz": (_ntz_in, _ntz_out),
    "date": (_date_in, _date_out),
}
_GENERIC = "generic"


def _converters(
    dtype: Any, make_struct: Callable[[list[str]], Callable[[tuple], Any]] | None
) -> tuple[Convert, Convert] | None | str:
    """``(to stored, from stored)`` for one Spark type in JSON form; None when the
    value is stored as it is; :data:`_GENERIC` for a type this module does not know."""
    if isinstance(dtype, str):
        name = dtype.split("(", 1)[0]
        if name in _NATIVE:
            return None
        if name in _SIMPLE:
            return _SIMPLE[name]
        if name == "decimal":
            return _decimal_in, _decimal_out
        if re.fullmatch(r"interval (day|hour|minute|second)( to (day|hour|minute|second))?", dtype):
            return _interval_in, _interval_out
        if re.fullmatch(r"interval (year|month)( to (year|month))?", dtype):
            return None  # PySpark keeps year-month intervals as ints
        return _GENERIC
    if not isinstance(dtype, dict):
        return _GENERIC
    kind = dtype.get("type")
    if kind == "struct":
        codec = ValueCodec(dtype, make_struct)
        if codec.native and make_struct is None:
            return _tuple_of, _tuple_of
        return codec.encode_item, codec.decode_item
    if kind == "array":
        inner = _converters(dtype.get("elementType"), make_struct)
        if inner == _GENERIC:
            return _GENERIC
        if inner is None:
            return _list_of, _list_of
        to, back = inner
        return (
            lambda v: None if v is None else [to(x) for x in v],
            lambda v: None if v is None else [back(x) for x in v],
        )
    if kind == "map":
        keys = _converters(dtype.get("keyType"), make_struct)
        values = _converters(dtype.get("valueType"), make_struct)
        if _GENERIC in (keys, values):
            return _GENERIC
        kto, kback = keys or (_same, _same)
        vto, vback = values or (_same, _same)
        return (
            lambda v: None if v is None else {kto(k): vto(x) for k, x in v.items()},
            lambda v: None if v is None else {kback(k): vback(x) for k, x in v.items()},
        )
    return _GENERIC


def _same(v: Any) -> Any:
    return v


def _tuple_of(v: Any) -> Any:
    return None if v is None else tuple(v)


def _list_of(v: Any) -> Any:
    return None if v is None else list(v)


class ValueCodec:
    """Encodes values (tuples, one item per field) of one struct schema to what is
    packed, and decodes unpacked ones (see the module doc). ``native``: every field
    is stored as it is, so a value needs no conversion at all (the hot path)."""

    def __init__(
        self,
        schema: dict[str, Any],
        make_struct: Callable[[list[str]], Callable[[tuple], Any]] | None = None,
    ) -> None:
        fields = schema.get("fields")
        if schema.get("type") != "struct" or not isinstance(fields, list):
            raise ValueError(
                f"a state schema is a struct type in Spark's JSON form, got {schema!r}"
            )
        self.schema = schema
        self.names = [f["name"] for f in fields]
        converters = [_converters(f["type"], make_struct) for f in fields]
        self.generic = _GENERIC in converters
        self.native = not self.generic and all(c is None for c in converters)
        self._to = [(i, c[0]) for i, c in enumerate(converters) if isinstance(c, tuple)]
        self._back = [(i, c[1]) for i, c in enumerate(converters) if isinstance(c, tuple)]
        self._make = None if make_struct is None else make_struct(self.names)

    def encode(self, value: tuple) -> tuple:
        """``value`` as packed (a tuple; its converted fields replaced); a
        ``TypeError`` naming the field for a value its schema cannot hold."""
        if not self._to:
            return value
        out = list(value)
        try:
            for i, to in self._to:
                out[i] = to(out[i])
        except (TypeError, AttributeError, ValueError, IndexError, OverflowError):
            raise self._mismatch(value) from None
        return tuple(out)

    def _mismatch(self, value: Any) -> TypeError:
        fields = self.schema["fields"]
        if len(value) != len(fields):
            return TypeError(
                f"a state value of {len(value)} fields for the schema's {len(fields)} "
                f"({', '.join(self.names)}): {value!r:.200}"
            )
        for i, to in self._to:
            try:
                to(value[i])
            except (TypeError, AttributeError, ValueError, IndexError, OverflowError):
                return TypeError(
                    f"state field {fields[i]['name']!r} of type {fields[i]['type']!r} cannot "
                    f"hold {type(value[i]).__name__} {value[i]!r:.100}"
                )
        return TypeError(f"a state value its schema cannot hold: {value!r:.200}")

    def decode(self, stored: tuple) -> tuple:
        """A value as the processor gets it (a plain tuple) from its unpacked form."""
        if not self._back:
            return stored
        out = list(stored)
        for i, back in self._back:
            out[i] = back(out[i])
        return tuple(out)

    # a nested struct: None stays None, and a Row-like maker may build it
    def encode_item(self, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, (tuple, list)):  # a dict or object: by field name
            value = _struct_items(self.names, False, value)
        return self.encode(tuple(value))

    def decode_item(self, stored: Any) -> Any:
        if stored is None:
            return None
        value = self.decode(tuple(stored))
        return value if self._make is None else self._make(value)


# ---------------------------------------------------------- shaping (writes)
class StructLengthMismatch(TypeError):
    """A struct given as a tuple or list of another length than its fields: the
    text is Spark's ``STRUCT_ARRAY_LENGTH_MISMATCH`` (the JVM's refusal, which
    PySpark raises prefixed by the call, e.g. ``Error updating value state: ``)."""

    def __init__(self, fields: int, values: int, value: Any) -> None:
        super().__init__(
            f"[STRUCT_ARRAY_LENGTH_MISMATCH] Input row doesn't have expected number of "
            f"values required by the schema. {fields} fields are required while {values} "
            f"values are provided (the struct value {value!r:.100})"
        )


#: Spark types whose PySpark values need conversion (``DataType.needConversion``).
_CONVERTED = frozenset({"timestamp", "timestamp_ntz", "date", "time"})


def _needs_conversion(dtype: Any) -> bool:
    """PySpark's ``needConversion`` of a type in JSON form: a struct always; an
    array or map when its items do; times, dates, day-time intervals."""
    if isinstance(dtype, str):
        return (
            dtype.split("(", 1)[0] in _CONVERTED
            or dtype.startswith("interval day")
            or (re.fullmatch(r"interval (hour|minute|second).*", dtype) is not None)
        )
    kind = dtype.get("type") if isinstance(dtype, dict) else None
    if kind == "array":
        return _needs_conversion(dtype.get("elementType"))
    if kind == "map":
        return _needs_conversion(dtype.get("keyType")) or _needs_conversion(dtype.get("valueType"))
    return True  # a struct, a UDT


def _struct_items(names: list[str], truncate: bool, value: Any) -> list:
    """The items of a struct value by PySpark's ``StructType.toInternal``: a dict
    by field name (a missing name is None), a tuple, list or ``Row`` by position
    (cut to the fields when a field needs conversion, as its ``zip`` cuts), an
    object by its attributes; anything else is refused with PySpark's error."""
    if isinstance(value, dict):
        return [value.get(n) for n in names]
    if isinstance(value, (tuple, list)):
        return list(value[: len(names)] if truncate else value)
    if hasattr(value, "__dict__"):
        attrs = value.__dict__
        return [attrs.get(n) for n in names]
    raise StatefulProcessorError(
        "UNEXPECTED_TUPLE_WITH_STRUCT", f"Unexpected tuple {value!r:.100} with StructType."
    )


def _shaper(
    dtype: Any, make_struct: Callable[[list[str]], Callable[[tuple], Any]] | None
) -> Convert | None:
    """The converter of a value of ``dtype`` as given to the form it is read back
    in (structs built by ``make_struct``, arrays lists, maps dicts), or None for
    a type whose values are kept as given (no struct, array or map)."""
    kind = dtype.get("type") if isinstance(dtype, dict) else None
    if kind == "struct":
        return _struct_shaper(dtype, make_struct)
    if kind == "array":
        inner = _shaper(dtype.get("elementType"), make_struct) or _same

        def array(v: Any) -> Any:
            if v is None:
                return None
            if not isinstance(v, (list, tuple)):
                raise TypeError(f"an array<...> field cannot hold {type(v).__name__} {v!r:.100}")
            return [inner(x) for x in v]

        return array
    if kind == "map":
        keys = _shaper(dtype.get("keyType"), make_struct) or _same
        values = _shaper(dtype.get("valueType"), make_struct) or _same

        def mapping(v: Any) -> Any:
            if v is None:
                return None
            if not isinstance(v, dict):
                raise TypeError(f"a map<...> field cannot hold {type(v).__name__} {v!r:.100}")
            return {keys(k): values(x) for k, x in v.items()}

        return mapping
    return None


def _struct_shaper(
    schema: dict[str, Any],
    make_struct: Callable[[list[str]], Callable[[tuple], Any]] | None,
    top: bool = False,
) -> Convert:
    fields = schema["fields"]
    names = [f["name"] for f in fields]
    truncate = any(_needs_conversion(f["type"]) for f in fields)
    inner = [(i, s) for i, f in enumerate(fields) if (s := _shaper(f["type"], make_struct))]
    make = tuple if top or make_struct is None else make_struct(names)

    def shape(v: Any) -> Any:
        if v is None:
            return None
        items = _struct_items(names, truncate, v)
        if len(items) != len(names):
            raise StructLengthMismatch(len(names), len(items), v)
        for i, s in inner:
            items[i] = s(items[i])
        return make(tuple(items))

    return shape


def value_shaper(
    schema: dict[str, Any] | None,
    make_struct: Callable[[list[str]], Callable[[tuple], Any]] | None = None,
) -> Convert | None:
    """``shape(value)``: a state value (a tuple, one item per field of ``schema``)
    as PySpark's state client converts it on writing and the value reads back:
    every nested struct given as a dict or object by field name, as a tuple, list
    or ``Row`` by position (``StructType.toInternal``), built by ``make_struct``
    (PySpark's ``Row``); arrays as lists, maps as dicts, None kept at any depth.
    A struct of the wrong length raises :class:`StructLengthMismatch`, one that
    is no struct at all ``UNEXPECTED_TUPLE_WITH_STRUCT``. None when no field of
    ``schema`` holds a struct, array or map (values are kept as given)."""
    if schema is None or not isinstance(schema.get("fields"), list):
        return None
    if not any(_shaper(f["type"], make_struct) for f in schema["fields"]):
        return None
    return _struct_shaper(schema, make_struct, top=True)


def value_codec(
    schema: dict[str, Any] | None,
    make_struct: Callable[[list[str]], Callable[[tuple], Any]] | None = None,
) -> ValueCodec | None:
    """The codec of values of ``schema`` (Spark's JSON form of a struct), or None
    when values use the generic form (no schema, or a type this module does not
    know). ``make_struct(names)`` builds nested structs on reading (PySpark's
    ``Row``); by default they are tuples."""
    if schema is None:
        return None
    codec = ValueCodec(schema, make_struct)
    return None if codec.generic else codec


# ------------------------------------------------------------------- payloads
_packb: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack
_unpackb: Callable[[bytes], Any] = partial(
    msgpack.unpackb, raw=False, use_list=False, strict_map_key=False
)


def payload_codec(
    kind: str,
    value: ValueCodec | None,
    key: ValueCodec | None = None,
    history: list[tuple[ValueCodec | None, Convert | None]] | tuple = (),
) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """``(dumps, loads)`` of one variable's payload (the module doc's shapes):
    ``kind`` is ``value``, ``list``, ``map`` or ``timers``; ``value`` and ``key``
    the codecs of its values and (for a map) user keys, None for the generic form.

    ``history`` holds, for each earlier value schema of the variable (version 0,
    1, ...), the codec its rows were written with and the converter of its values
    into the current schema (:func:`evolver`; None: the same values). With a
    history, the current version is ``len(history)``: rows are written with it as
    a one-byte prefix and read by the version they carry (a row without a prefix
    is version 0; see "Schema evolution" in the module doc).

    Payloads in memory are what :mod:`sessionstore.operators.processors.state`
    works on: ``(value, expiry)``, a list of those, a dict of user key to those,
    a list of times; kind ``plain_list`` is a list state without a TTL, held as a
    list of values (both list kinds read rows of either form)."""
    if history and kind != "timers":
        return _versioned(kind, value, key, history)
    if kind == "timers":
        return _packb, lambda raw: list(_unpackb(raw))
    generic = value is None or (kind == "map" and key is None)
    packb, unpackb = (generic_packb, generic_unpackb) if generic else (_packb, _unpackb)
    enc = _same if value is None or not value._to else value.encode
    dec = _same if value is None or not value._back else value.decode
    if kind == "value":
        if enc is _same and dec is _same:
            return packb, unpackb
        return (
            lambda p: packb((enc(p[0]), p[1])),
            lambda raw: (lambda s: (dec(s[0]), s[1]))(unpackb(raw)),
        )
    if kind in ("list", "plain_list"):
        return _list_codec(kind == "plain_list", packb, unpackb, enc, dec)
    if kind == "map":
        kenc = _same if key is None or not key._to else key.encode
        kdec = _same if key is None or not key._back else key.decode
        if enc is _same and dec is _same and kenc is _same and kdec is _same:
            return packb, unpackb
        return (
            lambda p: packb({kenc(k): (enc(v), e) for k, (v, e) in p.items()}),
            lambda raw: {kdec(k): (dec(v), e) for k, (v, e) in unpackb(raw).items()},
        )
    raise ValueError(f"unknown state variable kind {kind!r}")


#: First byte of a list row of bare values (a list without a TTL): 0xc1, which
#: msgpack never uses, so rows of the two list forms are told apart by it.
PLAIN_LIST = 0xC1
_PLAIN = bytes([PLAIN_LIST])


def _list_codec(
    plain: bool,
    packb: Callable[[Any], bytes],
    unpackb: Callable[[Any], Any],
    enc: Convert,
    dec: Convert,
) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """``(dumps, loads)`` of a list state held as bare values (``plain``) or as
    ``(value, expiry)`` pairs; ``loads`` reads rows of either form."""

    def values(stored: Any) -> list:
        return list(stored) if dec is _same else [dec(v) for v in stored]

    def pairs(stored: Any) -> list:
        return list(stored) if dec is _same else [(dec(v), e) for v, e in stored]

    if plain:

        def loads(raw: bytes) -> list:
            if raw[0] == PLAIN_LIST:
                return values(unpackb(memoryview(raw)[1:]))
            return [v for v, _ in pairs(unpackb(raw))]

        if enc is _same:
            return lambda p: _PLAIN + packb(p), loads
        return lambda p: _PLAIN + packb([enc(v) for v in p]), loads

    def loads_pairs(raw: bytes) -> list:
        if raw[0] == PLAIN_LIST:
            return [(v, None) for v in values(unpackb(memoryview(raw)[1:]))]
        return pairs(unpackb(raw))

    if enc is _same:
        return packb, loads_pairs
    return lambda p: packb([(enc(v), e) for v, e in p]), loads_pairs


# ------------------------------------------------------------ schema evolution
#: Most value schemas one variable may have had (Spark's default
#: ``spark.sql.streaming.stateStore.valueStateSchemaEvolutionThreshold``); a
#: version fits the one-byte prefix of a row (a msgpack positive fixint, which no
#: payload starts with: payloads are arrays or maps).
MAX_SCHEMA_VERSIONS = 16

#: Spark type -> the types its values may be read as (Avro's promotions, without
#: the narrowing Avro allows between Spark's byte, short and int, which all are
#: Avro ints: a stored 300 read as a byte would overflow).
_WIDENS: dict[str, frozenset[str]] = {
    "byte": frozenset({"short", "integer", "long", "float", "double"}),
    "short": frozenset({"integer", "long", "float", "double"}),
    "integer": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"binary"}),
}
_FLOATS = frozenset({"float", "double"})


def _type_text(dtype: Any) -> str:
    if isinstance(dtype, str):
        return dtype
    kind = dtype.get("type") if isinstance(dtype, dict) else None
    if kind == "struct":
        inner = ", ".join(f"{f['name']} {_type_text(f['type'])}" for f in dtype["fields"])
        return f"struct<{inner}>"
    if kind == "array":
        return f"array<{_type_text(dtype.get('elementType'))}>"
    if kind == "map":
        return f"map<{_type_text(dtype.get('keyType'))}, {_type_text(dtype.get('valueType'))}>"
    return repr(dtype)


def _not_nullable(schema: dict[str, Any], path: str = "") -> str | None:
    """The first field (dotted path) of a struct schema that is not nullable."""
    for f in schema.get("fields", ()):
        name = f"{path}{f['name']}"
        if not f.get("nullable", True):
            return name
        t = f["type"]
        if isinstance(t, dict) and t.get("type") == "struct":
            found = _not_nullable(t, name + ".")
            if found:
                return found
    return None


def _incompatible(old: Any, new: Any, path: str) -> tuple[str, Any, Any] | None:
    """``(field, old type, new type)`` of the first field whose stored values
    cannot be read as the new type, or None."""
    if old == new:
        return None
    if isinstance(old, str) and isinstance(new, str):
        return None if new in _WIDENS.get(old, ()) else (path, old, new)
    okind = old.get("type") if isinstance(old, dict) else None
    nkind = new.get("type") if isinstance(new, dict) else None
    if okind != nkind or okind not in ("struct", "array", "map"):
        return (path, old, new)
    if okind == "array":
        return _incompatible(old.get("elementType"), new.get("elementType"), path + "[]")
    if okind == "map":
        return _incompatible(old.get("keyType"), new.get("keyType"), path + "{key}") or (
            _incompatible(old.get("valueType"), new.get("valueType"), path + "{value}")
        )
    olds = {f["name"]: f["type"] for f in old["fields"]}
    for f in new["fields"]:
        if f["name"] in olds:
            bad = _incompatible(olds[f["name"]], f["type"], f"{path}{f['name']}")
            if bad:
                return bad
    return None


def check_evolution(variable: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
    """Refuse, as Spark's Avro state encoding does, a value schema ``new`` that
    the rows of ``old`` (both Spark's JSON form of a struct) cannot be read as:
    a changed schema must have only nullable fields
    (``TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE``), and a field kept by name
    may only widen (``STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION``). Fields may
    be added, removed and reordered. A variable without a parsed schema on either
    side is not checked (its values are not read by field)."""
    if old is None or new is None or old == new:
        return
    field = _not_nullable(new)
    if field is not None:
        raise StatefulProcessorError(
            "TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE",
            f"If Avro encoding is enabled, all the fields in the schema for column family "
            f"{variable} must be nullable when using the TransformWithState operator. "
            f"Please make the schema nullable. Current schema: {_type_text(new)} "
            f"(field {field!r} is not nullable; sessionstore asks it of a changed schema, "
            f"whose rows written before may lack the field).",
        )
    bad = _incompatible(old, new, "")
    if bad is not None:
        path, was, now = bad
        raise StatefulProcessorError(
            "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
            f"Schema evolution is not possible new value_schema={_type_text(new)} and old "
            f"value_schema={_type_text(old)}: state variable {variable!r}, field {path!r} "
            f"was {_type_text(was)} and cannot be read as {_type_text(now)} (a field may "
            f"only widen: byte, short, int, long, float, double in that order, or string "
            f"to binary). Please check https://avro.apache.org/docs/1.11.1/specification/"
            f"_print/#schema-resolution for valid schema evolution.",
        )


def evolver(
    old: Any,
    new: Any,
    make_struct: Callable[[list[str]], Callable[[tuple], Any]] | None = None,
    nested: bool = False,
) -> Convert | None:
    """The converter of a value of type ``old`` (as decoded) to type ``new``, of a
    pair :func:`check_evolution` accepts: struct fields mapped by name (a field
    the old type lacks is None), numbers widened; None when values stay as they are.
    A top-level struct becomes a tuple (a state value); a ``nested`` one is built
    by ``make_struct``, as its codec builds it on reading."""
    if old == new or old is None or new is None:
        return None
    if isinstance(new, str):
        if new in _FLOATS and old not in _FLOATS:
            return lambda v: None if v is None else float(v)
        if new == "binary" and old == "string":
            return lambda v: None if v is None else v.encode()
        return None  # an int widened to a longer int
    kind = new.get("type")
    if kind == "array":
        inner = evolver(old.get("elementType"), new.get("elementType"), make_struct, True)
        return None if inner is None else (lambda v: None if v is None else [inner(x) for x in v])
    if kind == "map":
        k = evolver(old.get("keyType"), new.get("keyType"), make_struct, True) or _same
        x = evolver(old.get("valueType"), new.get("valueType"), make_struct, True) or _same
        return lambda v: None if v is None else {k(a): x(b) for a, b in v.items()}
    positions = {f["name"]: (i, f["type"]) for i, f in enumerate(old["fields"])}
    plan: list[tuple[int | None, Convert]] = []
    for f in new["fields"]:
        i, t = positions.get(f["name"], (None, None))
        plan.append((i, (i is not None and evolver(t, f["type"], make_struct, True)) or _same))
    make = make_struct([f["name"] for f in new["fields"]]) if make_struct and nested else None

    def convert(v: Any) -> Any:
        if v is None:
            return None
        out = tuple(None if i is None else c(v[i]) for i, c in plan)
        return out if make is None else make(out)

    return convert


def _versioned(
    kind: str,
    value: ValueCodec | None,
    key: ValueCodec | None,
    history: list[tuple[ValueCodec | None, Convert | None]] | tuple,
) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    # rows of the current version carry its number as a one-byte prefix; older
    # rows are decoded by their own codec, then each value converted
    version = len(history)
    prefix = bytes([version])
    dumps, current = payload_codec(kind, value, key)
    loaders: list[Callable[[bytes], Any]] = []
    for codec, convert in history:
        loads = payload_codec(kind, codec, key)[1]
        if convert is None:
            loaders.append(loads)
            continue
        if kind == "value":
            loaders.append(lambda raw, ld=loads, c=convert: (lambda p: (c(p[0]), p[1]))(ld(raw)))
        elif kind == "list":
            loaders.append(lambda raw, ld=loads, c=convert: [(c(v), e) for v, e in ld(raw)])
        elif kind == "plain_list":
            loaders.append(lambda raw, ld=loads, c=convert: [c(v) for v in ld(raw)])
        else:
            loaders.append(
                lambda raw, ld=loads, c=convert: {k: (c(v), e) for k, (v, e) in ld(raw).items()}
            )

    def load(raw: bytes) -> Any:
        first = raw[0]
        if first == version:
            return current(raw[1:])
        if first < version:  # a prefixed row of an earlier version
            return loaders[first](raw[1:])
        if first < 0x80:
            raise ValueError(
                f"a state row of schema version {first}, but the variable has had "
                f"{version + 1} schemas: written by a newer job or corrupt"
            )
        return loaders[0](raw)  # written before the first change: no prefix

    return lambda payload: prefix + dumps(payload), load
