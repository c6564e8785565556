"""Spark's hash partitioning of key columns, in numpy: which partition
``df.repartition(n, *key_columns)`` sends a key to.

Spark's ``HashPartitioning`` computes ``pmod(Murmur3Hash(columns, seed=42), n)``.
``Murmur3Hash`` folds the columns in order, each column's hash seeding the next, and
a null column leaves the running hash as it is. Per Spark type
(``org.apache.spark.unsafe.hash.Murmur3_x86_32`` and ``HashExpression``):

* ``integer``, ``short``, ``byte``: ``hashInt(value)``; ``boolean``: ``hashInt``
  of 1 or 0;
* ``long``: ``hashLong(value)``: the low 32 bits, then the high 32 bits, length 8;
* ``string`` (binary collation) and ``binary``: ``hashUnsafeBytes`` over the
  UTF-8 bytes (the bytes): the whole 4-byte words little-endian, then **each
  remaining byte alone, sign-extended** (Spark's own variant, kept for
  compatibility: not the reference tail mixing), and the length in the final mix.

Every step is 32-bit arithmetic on uint32 arrays (numpy wraps on overflow), over
all keys at once, strings grouped by byte length so no row needs a mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "SPARK_SEED", "KEY_TYPES", "check_key_types", "murmur3_hash", "partition_ids", "KeyRouter",
]  # fmt: skip

#: The seed of Spark's ``Murmur3Hash`` in ``HashPartitioning``.
SPARK_SEED = 42

#: Spark type names (``DataType.typeName()``) of the key columns routed here, with
#: the SQL spellings a user may type: every type an operator takes for a key column
#: (``spark_integration.planning.input_columns.checked_fields``), so every
#: checkpoint can be rescaled.
KEY_TYPES = ("string", "long", "integer", "short", "byte", "boolean", "binary")
_ALIASES = {"int": "integer", "bigint": "long", "smallint": "short", "tinyint": "byte"}
_INT_RANGES = {
    "long": (-(2**63), 2**63 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "short": (-(2**15), 2**15 - 1),
    "byte": (-(2**7), 2**7 - 1),
}

_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_M5, _N1 = np.uint32(5), np.uint32(0xE6546B64)
_F1, _F2 = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)


def check_key_types(types: Sequence[str]) -> tuple[str, ...]:
    """``types`` as Spark type names (``int`` -> ``integer``, ``bigint`` -> ``long``);
    ``ValueError`` naming a type this module cannot hash."""
    out = []
    for t in types:
        name = _ALIASES.get(str(t).strip().lower(), str(t).strip().lower())
        if name not in KEY_TYPES:
            raise ValueError(
                f"key column type {t!r} cannot be routed; supported: {', '.join(KEY_TYPES)} "
                f"(or int, bigint, smallint, tinyint)"
            )
        out.append(name)
    if not out:
        raise ValueError("at least one key column type is needed")
    return tuple(out)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * _M5 + _N1


def _fmix(h1: np.ndarray, length: int) -> np.ndarray:
    h1 = h1 ^ np.uint32(length)
    h1 = (h1 ^ (h1 >> np.uint32(16))) * _F1
    h1 = (h1 ^ (h1 >> np.uint32(13))) * _F2
    return h1 ^ (h1 >> np.uint32(16))


def _hash_ints(values: list[int], seeds: np.ndarray, wide: bool) -> np.ndarray:
    v = np.array(values, dtype=np.int64).view(np.uint64)
    low = (v & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    h1 = _mix_h1(seeds, _mix_k1(low))
    if not wide:
        return _fmix(h1, 4)
    high = (v >> np.uint64(32)).astype(np.uint32)
    return _fmix(_mix_h1(h1, _mix_k1(high)), 8)


def _hash_bytes(raw: list[bytes], seeds: np.ndarray) -> np.ndarray:
    lengths = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
    out = np.empty(len(raw), dtype=np.uint32)
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        h1 = seeds[rows]
        if length:
            data = np.frombuffer(b"".join(raw[i] for i in rows.tolist()), dtype=np.uint8)
            data = data.reshape(len(rows), length)
            aligned = length - length % 4
            words = np.ascontiguousarray(data[:, :aligned]).view("<u4")
            for j in range(aligned // 4):
                h1 = _mix_h1(h1, _mix_k1(words[:, j].astype(np.uint32)))
            for i in range(aligned, length):
                # Spark reads each tail byte as a signed Java byte
                tail = data[:, i].view(np.int8).astype(np.int32).view(np.uint32)
                h1 = _mix_h1(h1, _mix_k1(tail))
        out[rows] = _fmix(h1, length)
    return out


def murmur3_hash(
    columns: Sequence[Sequence[Any]], types: Sequence[str], seed: int = SPARK_SEED
) -> np.ndarray:
    """Spark's ``hash(*columns)`` (``Murmur3Hash``) of every row, as int32.

    ``columns[i]`` holds the values of key column ``i`` (Python str, int, bool or
    bytes, None for null) and ``types[i]`` its Spark type. ``ValueError`` names a value that does
    not fit its column's type.
    """
    types = check_key_types(types)
    if len(columns) != len(types):
        raise ValueError(f"{len(columns)} key columns but {len(types)} key types")
    n = len(columns[0]) if columns else 0
    h = np.full(n, np.uint32(seed & 0xFFFFFFFF), dtype=np.uint32)
    for column, kind in zip(columns, types, strict=True):
        rows = [i for i, v in enumerate(column) if v is not None]
        values = [column[i] for i in rows]
        if not values:
            continue
        _check_values(values, kind)
        idx = np.array(rows, dtype=np.int64)
        if kind == "string":
            h[idx] = _hash_bytes([v.encode("utf-8") for v in values], h[idx])
        elif kind == "binary":
            h[idx] = _hash_bytes(values, h[idx])
        elif kind == "boolean":
            h[idx] = _hash_ints([int(v) for v in values], h[idx], wide=False)
        else:
            h[idx] = _hash_ints(values, h[idx], wide=kind == "long")
    return h.view(np.int32)


#: The Python type of a key value of each non-integral Spark type.
_VALUE_TYPES = {
    "string": (str, "a string"),
    "binary": (bytes, "bytes"),
    "boolean": (bool, "a bool"),
}


def _check_values(values: list[Any], kind: str) -> None:
    if kind in _VALUE_TYPES:
        want, named = _VALUE_TYPES[kind]
        bad = next((v for v in values if type(v) is not want), None)
        if bad is not None:
            raise ValueError(f"key value {bad!r} is not {named}, but its column is {kind}")
        return
    lo, hi = _INT_RANGES[kind]
    bad = next((v for v in values if type(v) is not int or not lo <= v <= hi), None)
    if bad is not None:
        raise ValueError(f"key value {bad!r} does not fit its column's Spark type {kind}")


def partition_ids(
    columns: Sequence[Sequence[Any]], types: Sequence[str], num_partitions: int
) -> np.ndarray:
    """The partition Spark's ``repartition(num_partitions, *columns)`` gives each row:
    ``pmod(murmur3_hash(columns), num_partitions)``, as int64."""
    if type(num_partitions) is not int or num_partitions < 1:
        raise ValueError(f"num_partitions must be a positive int, got {num_partitions!r}")
    # numpy's % takes the sign of the divisor: Spark's pmod for a positive n
    return murmur3_hash(columns, types).astype(np.int64) % num_partitions


class KeyRouter:
    """The partition of decoded keys (a value, or a tuple of a composite key's
    values) among ``partitions``, as ``repartition(partitions, *key_columns)`` of
    Spark types ``key_types`` gives it. Nothing is kept between calls, so a reader
    streaming a store keeps flat memory: call it per chunk of rows (a key's rows
    are adjacent in a store, so each distinct key of a chunk is hashed once)."""

    def __init__(self, key_types: Sequence[str], partitions: int) -> None:
        self._types, self._n = tuple(key_types), partitions

    def partitions_of(self, keys: Sequence[Any]) -> list[int]:
        """The partition of each of ``keys``; ``ValueError`` naming a key that does
        not match the key columns."""
        distinct = list(dict.fromkeys(keys))
        ids = partition_ids(self._columns(distinct), self._types, self._n).tolist()
        found = dict(zip(distinct, ids, strict=True))
        return [found[k] for k in keys]

    def _columns(self, keys: list[Any]) -> list[list[Any]]:
        width = len(self._types)
        if width == 1:
            bad = next((k for k in keys if isinstance(k, tuple)), None)
            if bad is None:
                return [keys]
        else:
            bad = next((k for k in keys if not isinstance(k, tuple) or len(k) != width), None)
            if bad is None:
                return [list(column) for column in zip(*keys, strict=True)]
        raise ValueError(
            f"key {bad!r} does not match the {width} key column(s) of types {','.join(self._types)}"
        )
