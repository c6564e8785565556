"""Value and key serialisers (serdes), pluggable per store.

A serde is any object with ``dumps(obj) -> bytes`` and ``loads(bytes) -> obj``.
Values default to msgpack. Keys always end up in the order-preserving codec of
:mod:`sessionstore.encoding.keys`: the default key serde *is* that codec, and the bytes of a
custom key serde are wrapped as a bytes component, so they stay prefix-free and
sort in the serde's byte order.

``None`` is never passed to a value serde: in a session store a ``None`` value
means delete, and in a versioned store it means a tombstone. ``b""`` and ``None``
therefore stay distinct.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, runtime_checkable

import msgpack

from sessionstore.encoding.keys import decode_key, encode_key
from sessionstore.encoding.msgpack_ext import ext_default, ext_hook

__all__ = [
    "Serde",
    "MsgpackSerde",
    "BytesSerde",
    "StringSerde",
    "KeyCodecSerde",
    "PickleSerde",
    "key_codec",
    "serde_name",
    "serde_from_name",
]


@runtime_checkable
class Serde(Protocol):
    """Turns objects into bytes and back."""

    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class MsgpackSerde:
    """msgpack with binary and text kept apart. Tuples come back as lists. The
    values of Spark's types msgpack lacks (datetimes, dates, decimals, day-time
    intervals: what a row read from Spark holds) are extension types
    (:mod:`sessionstore.encoding.msgpack_ext`) and read back as they were."""

    name = "msgpack"

    def __init__(self) -> None:
        # dumps(obj) -> bytes and loads(bytes) -> obj are C-level callables, so the
        # hot paths pay no Python frame per value; the hooks run only for the
        # values msgpack lacks
        self.dumps: Callable[[Any], bytes] = msgpack.Packer(
            default=ext_default, use_bin_type=True
        ).pack
        self.loads: Callable[[bytes], Any] = partial(
            msgpack.unpackb, raw=False, strict_map_key=False, ext_hook=ext_hook
        )
        self._stock_loads = self.loads

    def loads_many(self, datas: list[bytes]) -> list[Any]:
        """:attr:`loads` of each of ``datas``, decoded as one stream (a reader
        decodes thousands at a time: half the cost of a call each). The same
        values, and where one of ``datas`` is not exactly one value, the error
        :attr:`loads` raises for it."""
        if self.loads is not self._stock_loads or len(datas) < 16:
            return list(map(self.loads, datas))
        # limits as loose as loads' own for any value that fits in the stream
        stream = msgpack.Unpacker(
            raw=False, strict_map_key=False, ext_hook=ext_hook, max_buffer_size=2**31 - 1
        )
        stream.feed(b"".join(datas))
        values, unpack, tell, end = [], stream.unpack, stream.tell, 0
        try:
            for data in datas:
                end += len(data)
                values.append(unpack())
                if tell() != end:  # a value took more or fewer bytes than its own
                    break
            else:
                return values
        except Exception:  # loads says which value fails, and how
            pass
        return list(map(self.loads, datas))


class BytesSerde:
    """Identity serde for values that are already bytes."""

    name = "bytes"

    def dumps(self, obj: Any) -> bytes:
        if not isinstance(obj, (bytes, bytearray, memoryview)):
            raise TypeError(f"BytesSerde needs bytes, got {type(obj).__name__} {obj!r}")
        return bytes(obj)

    def loads(self, data: bytes) -> Any:
        return data


class StringSerde:
    """UTF-8 text."""

    name = "str"

    def dumps(self, obj: Any) -> bytes:
        if not isinstance(obj, str):
            raise TypeError(f"StringSerde needs str, got {type(obj).__name__} {obj!r}")
        return obj.encode("utf-8")

    def loads(self, data: bytes) -> Any:
        return data.decode("utf-8")


class KeyCodecSerde:
    """The order-preserving tuple codec of :mod:`sessionstore.encoding.keys` (the key default)."""

    name = "keycodec"

    def dumps(self, obj: Any) -> bytes:
        return encode_key(obj)

    def loads(self, data: bytes) -> Any:
        return decode_key(data)


class PickleSerde:
    """Python's pickle (protocol 5): any picklable value, tuples, datetimes and
    decimals included. For state only this library writes and reads back (a
    StatefulProcessor's state variables); never load pickles from untrusted files."""

    name = "pickle"

    def __init__(self) -> None:
        self.dumps: Callable[[Any], bytes] = partial(pickle.dumps, protocol=5)
        self.loads: Callable[[bytes], Any] = pickle.loads


_BY_NAME: dict[str, Callable[[], Any]] = {
    "msgpack": MsgpackSerde,
    "bytes": BytesSerde,
    "str": StringSerde,
    "keycodec": KeyCodecSerde,
    "pickle": PickleSerde,
}


def serde_name(serde: Any) -> str:
    """Name recorded in store metadata; custom serdes are named by their class."""
    name = getattr(serde, "name", None)
    if isinstance(name, str) and name in _BY_NAME and isinstance(serde, _BY_NAME[name]):
        return name
    cls = type(serde)
    return f"{cls.__module__}.{cls.__qualname__}"


def serde_from_name(name: str) -> Any:
    """Instantiate a built-in serde from its recorded name."""
    try:
        return _BY_NAME[name]()
    except KeyError:
        raise ValueError(
            f"unknown serde {name!r}: built-in serdes are {sorted(_BY_NAME)}; "
            "pass custom serdes explicitly"
        ) from None


_KEY_CACHE_SIZE = 65_536


def _cached_str_encoder() -> Callable[[Any], bytes]:
    """``encode_key`` with a bounded cache for str keys, which repeat heavily in
    streams (hot users, Zipf-distributed ids).

    Only exact ``str`` keys are cached: ``1``, ``True`` and ``1.0`` are equal as
    dict keys but must encode differently (or be refused).
    """
    cache: dict[str, bytes] = {}

    def encode(key: Any) -> bytes:
        if type(key) is str:
            kb = cache.get(key)
            if kb is None:
                if len(cache) >= _KEY_CACHE_SIZE:
                    cache.clear()
                kb = cache[key] = encode_key(key)
            return kb
        return encode_key(key)

    # Hot loops look str keys up here first and call encode() only on a miss.
    encode.cache = cache  # type: ignore[attr-defined]
    return encode


#: One cache for the process, not one per store: a Python worker holds the stores of
#: many partitions, and a cache each kept up to ``_KEY_CACHE_SIZE`` keys alive per
#: store (about 7 MB per store at 50k keys, outside any RocksDB budget; issue #16).
#: Encoding a str is pure, so stores can share the results.
_STR_ENCODER = _cached_str_encoder()


def key_codec(
    key_serde: Any | None,
) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """Return ``(encode, decode)`` giving prefix-free, ordered key bytes for a key serde."""
    if key_serde is None or isinstance(key_serde, KeyCodecSerde):
        return _STR_ENCODER, decode_key
    dumps, loads = key_serde.dumps, key_serde.loads

    def encode(key: Any) -> bytes:
        if key is None:
            raise TypeError("key must not be None")
        raw = dumps(key)
        if not isinstance(raw, bytes):
            raise TypeError(f"key serde {serde_name(key_serde)} returned {type(raw).__name__}")
        return encode_key(raw)

    def decode(data: bytes) -> Any:
        return loads(decode_key(data))

    return encode, decode
