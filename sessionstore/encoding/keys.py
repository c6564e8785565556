"""Order-preserving, prefix-free encoding of user keys and timestamps.

Every store in sessionstore lays its RocksDB keys out as ``enc(user key) ‖ fixed-width
suffix``. Two properties of ``enc`` make range scans exact:

* **Order preserving** – ``a < b`` (Python order) iff ``enc(a) < enc(b)`` (byte order),
  so a key range is a byte range.
* **Prefix free** – no ``enc(a)`` is a proper prefix of ``enc(b)``. A scan of the
  prefix ``enc("a")`` therefore never sees ``"aa"`` or ``"a\\x00"``. (A raw
  ``key ‖ end ‖ start`` layout lacks this; the Quix Streams data-loss bug was of this
  family.)

Layout, in the style of the FoundationDB tuple layer (one type tag, then the body)::

    bytes  01 ‖ escape(b)  ‖ 00 01      escape: every 00 byte becomes 00 FF
    str    02 ‖ escape(utf8(s)) ‖ 00 01
    tuple  05 ‖ enc(item)… ‖ 00         items are encoded recursively
    int    14                           zero
           14+n ‖ n bytes big-endian    positive, n = 1..8 bytes
           14-n ‖ n bytes one's complement of |v|   negative, n = 1..8
           1D ‖ n ‖ n bytes             positive, more than 8 bytes
           0B ‖ n^FF ‖ n bytes (one's complement)   negative, more than 8 bytes
    bool   26 (False) / 27 (True)

Worked examples::

    enc("a")      = 02 61 00 01
    enc("aa")     = 02 61 61 00 01        "a" < "aa", and 02 61 00 01 is no prefix
    enc("a\\x00")  = 02 61 00 FF 00 01     sorts after "a" (FF > 01), no prefix either
    enc(b"\\x00")  = 01 00 FF 00 01
    enc(1)        = 15 01
    enc(-1)       = 13 FE
    enc(("u", 7)) = 05 02 75 00 01 15 07 00

Times that follow a key in a row key use the sign-flipped layout of
:mod:`sessionstore.encoding.session_key`.
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = [
    "TS_MIN",
    "TS_MAX",
    "encode_key",
    "decode_key",
    "decode_keys",
    "encode_str_keys",
    "encoded_length",
    "prefix_upper_bound",
    "check_timestamp",
]

TS_MIN = -(2**63)
TS_MAX = 2**63 - 1

_BYTES = 0x01
_STR = 0x02
_TUPLE = 0x05
_NEG_BIG = 0x0B
_INT_ZERO = 0x14
_POS_BIG = 0x1D
_FALSE = 0x26
_TRUE = 0x27

_TERM = b"\x00\x01"


def _escape(raw: bytes) -> bytes:
    return raw.replace(b"\x00", b"\x00\xff")


def _encode_int(value: int) -> bytes:
    if value == 0:
        return b"\x14"
    if value > 0:
        n = (value.bit_length() + 7) // 8
        body = value.to_bytes(n, "big")
        if n <= 8:
            return bytes((_INT_ZERO + n,)) + body
        if n > 255:
            raise ValueError(f"int key too large to encode ({n} bytes): {value}")
        return bytes((_POS_BIG, n)) + body
    n = ((-value).bit_length() + 7) // 8
    body = (value + (1 << (8 * n)) - 1).to_bytes(n, "big")
    if n <= 8:
        return bytes((_INT_ZERO - n,)) + body
    if n > 255:
        raise ValueError(f"int key too large to encode ({n} bytes): {value}")
    return bytes((_NEG_BIG, n ^ 0xFF)) + body


def _encode_into(key: Any, out: list[bytes]) -> None:
    kind = type(key)
    if kind is str:
        out.append(b"\x02" + _escape(key.encode("utf-8")) + _TERM)
    elif kind is int:
        out.append(_encode_int(key))
    elif kind is bytes:
        out.append(b"\x01" + _escape(key) + _TERM)
    elif kind is tuple:
        out.append(b"\x05")
        for item in key:
            _encode_into(item, out)
        out.append(b"\x00")
    elif kind is bool:
        out.append(b"\x27" if key else b"\x26")
    elif key is None:
        raise TypeError("key must not be None (a None key has no place in a keyed store)")
    elif isinstance(key, (bytearray, memoryview)):
        _encode_into(bytes(key), out)
    elif isinstance(key, float):
        raise TypeError(
            f"float keys are not supported (got {key!r}): floats compare inexactly; "
            "use an int, a str or a tuple of them"
        )
    elif isinstance(key, str):
        _encode_into(str(key), out)
    elif isinstance(key, tuple):
        _encode_into(tuple(key), out)
    elif hasattr(key, "__index__"):  # numpy integers and other int-likes
        _encode_into(operator.index(key), out)
    else:
        raise TypeError(
            f"unsupported key type {type(key).__name__} ({key!r}): "
            "keys must be str, bytes, int, bool or tuples of them"
        )


def encode_key(key: Any) -> bytes:
    """Encode a user key (str, bytes, int, bool or tuple of them) to ordered bytes.

    Raises ``TypeError`` naming the type for None, floats and unsupported types.
    """
    kind = type(key)
    if kind is str:  # fast path: the common case in streaming jobs
        return b"\x02" + key.encode("utf-8").replace(b"\x00", b"\x00\xff") + _TERM
    if kind is int:
        return _encode_int(key)
    out: list[bytes] = []
    _encode_into(key, out)
    return b"".join(out)


def _unescape_until_term(data: bytes, pos: int) -> tuple[bytes, int]:
    parts = []
    while True:
        zero = data.find(b"\x00", pos)
        if zero < 0 or zero + 1 >= len(data):
            raise ValueError(f"truncated key encoding: {data.hex()}")
        marker = data[zero + 1]
        parts.append(data[pos:zero])
        if marker == 0x01:
            return b"".join(parts), zero + 2
        if marker != 0xFF:
            raise ValueError(f"bad escape in key encoding at byte {zero}: {data.hex()}")
        parts.append(b"\x00")
        pos = zero + 2


def _decode_at(data: bytes, pos: int) -> tuple[Any, int]:
    if pos >= len(data):
        raise ValueError(f"truncated key encoding: {data.hex()}")
    tag = data[pos]
    pos += 1
    if tag == _STR:
        raw, pos = _unescape_until_term(data, pos)
        return raw.decode("utf-8"), pos
    if tag == _BYTES:
        return _unescape_until_term(data, pos)
    if tag == _INT_ZERO:
        return 0, pos
    if _INT_ZERO < tag < _POS_BIG:
        n = tag - _INT_ZERO
        return int.from_bytes(data[pos : pos + n], "big"), pos + n
    if _NEG_BIG < tag < _INT_ZERO:
        n = _INT_ZERO - tag
        return int.from_bytes(data[pos : pos + n], "big") - (1 << (8 * n)) + 1, pos + n
    if tag == _POS_BIG:
        n = data[pos]
        return int.from_bytes(data[pos + 1 : pos + 1 + n], "big"), pos + 1 + n
    if tag == _NEG_BIG:
        n = data[pos] ^ 0xFF
        body = data[pos + 1 : pos + 1 + n]
        return int.from_bytes(body, "big") - (1 << (8 * n)) + 1, pos + 1 + n
    if tag == _TUPLE:
        items = []
        while True:
            if pos >= len(data):
                raise ValueError(f"truncated tuple in key encoding: {data.hex()}")
            if data[pos] == 0x00:
                return tuple(items), pos + 1
            item, pos = _decode_at(data, pos)
            items.append(item)
    if tag == _FALSE:
        return False, pos
    if tag == _TRUE:
        return True, pos
    raise ValueError(f"unknown type tag 0x{tag:02x} in key encoding: {data.hex()}")


def decode_key(data: bytes) -> Any:
    """Decode bytes produced by :func:`encode_key` back to the user key."""
    # fast path, the mirror of encode_key's: a string whose only zero byte is the
    # terminator's (closing a micro-batch's sessions decodes a key per session)
    if data[:1] == b"\x02" and data.find(b"\x00") == len(data) - 2 and data[-1] == 1:
        return data[1:-2].decode("utf-8")
    key, pos = _decode_at(data, 0)
    if pos != len(data):
        raise ValueError(f"trailing bytes after key encoding: {data.hex()}")
    return key


def decode_keys(encoded: Any) -> list[Any]:
    """:func:`decode_key` of each of ``encoded`` (bytes, or a pyarrow binary array
    of them). When all are strings whose only zero byte is the terminator's (the
    fast path of :func:`decode_key`), they are decoded together in Arrow: a close
    emits a key per session, a dump reads thousands at a time."""
    arrow = hasattr(encoded, "to_pylist")
    if len(encoded) < 64:  # fewer keys than pay for Arrow's per-call overhead
        return list(map(decode_key, encoded.to_pylist() if arrow else encoded))
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = encoded if arrow else pa.array(encoded, pa.binary())
    plain = pc.and_(
        pc.and_(pc.starts_with(arr, pattern=b"\x02"), pc.ends_with(arr, pattern=b"\x00\x01")),
        pc.equal(pc.count_substring(arr, pattern=b"\x00"), pa.scalar(1, pa.int32())),
    )
    if pc.all(plain).as_py():
        try:
            return pc.binary_slice(arr, 1, -2).cast(pa.string()).to_pylist()
        except pa.ArrowInvalid:  # not UTF-8: decode_key says where
            pass
    return list(map(decode_key, encoded.to_pylist() if arrow else encoded))


def encode_str_keys(strings: Any) -> list[bytes] | None:
    """:func:`encode_key` of each str of ``strings`` (an Arrow string array without
    nulls), built together in Arrow; None when one holds a zero byte (its encoding
    escapes it: encode those one by one)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pc.any(pc.match_substring(strings, "\x00")).as_py():
        return None
    try:
        raw = strings.cast(pa.binary())  # a large_string column's too, below 2 GiB in all
    except pa.ArrowInvalid:
        return None
    # typed scalars: a Python literal's type is inferred, which imports pandas
    # (sessionstore.arrow_pandas)
    binary = pa.binary()
    prefix, suffix, joiner = (pa.scalar(b, binary) for b in (b"\x02", b"\x00\x01", b""))
    return pc.binary_join_element_wise(prefix, raw, suffix, joiner).to_pylist()


def encoded_length(data: bytes) -> int:
    """Length of the one encoded key at the start of ``data`` (rows that put
    more bytes after a key, such as processor state, split there)."""
    return _decode_at(data, 0)[1]


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string that starts with ``prefix``.

    Returns None when no such bound exists (the prefix is all 0xFF bytes).
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes((stripped[-1] + 1,))


def key_range(encode: Any, key_from: Any, key_to: Any) -> tuple[bytes | None, bytes | None] | None:
    """Byte bounds ``[lo, hi)`` of the keys in ``[key_from, key_to]`` (None is open),
    or None when ``key_from > key_to`` and the range is empty."""
    lo = None if key_from is None else encode(key_from)
    hi_key = None if key_to is None else encode(key_to)
    if lo is not None and hi_key is not None and lo > hi_key:
        return None
    return lo, None if hi_key is None else prefix_upper_bound(hi_key)


def check_timestamp(name: str, value: Any) -> int:
    """Return ``value`` as an int if it is a valid signed 64-bit timestamp.

    Raises ``TypeError`` for non-integers (floats included) and ``ValueError`` naming
    ``name`` and the value when it does not fit in 64 bits.
    """
    if type(value) is not int:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(
                f"{name} must be an int of epoch milliseconds, got {type(value).__name__} {value!r}"
            )
        value = operator.index(value)
    if not TS_MIN <= value <= TS_MAX:
        raise ValueError(f"{name}={value} does not fit in a signed 64-bit integer")
    return value
