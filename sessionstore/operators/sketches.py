"""Mergeable sketches kept in accumulators: HyperLogLog for ``approx_count_distinct``
and KLL for ``percentile_approx`` (Apache DataSketches, the ``datasketches`` package).

An accumulator must be data (it is stored with msgpack), so a sketch slot is
``[size, sketch bytes or None, pending values]`` (``size``: HLL's ``lg_k`` or
KLL's ``k``): values are appended to ``pending`` (a list append per record, no
sketch work) and folded into the sketch, whose serialized bytes replace the old
ones, once ``pending`` holds :data:`FOLD_EVERY` values or two slots merge past
it; a result folds a copy.

Sizes follow Spark's definitions:

* ``approx_count_distinct(c, rsd)``: Spark's HyperLogLog++ uses
  ``p = ceil(2 * log2(1.106 / rsd))`` registers bits; the HLL sketch here uses the
  same ``lg_k = p`` (its relative standard error is about ``1.04 / sqrt(2^p)``),
  so rsd 0.05 (Spark's default) gives ``lg_k = 9``.
* ``percentile_approx(c, p, accuracy)``: Spark's relative rank error is
  ``1 / accuracy``; KLL's ``k`` is the smallest whose normalized rank error
  (single-sided, as DataSketches reports it) is within that, at most 65535. While
  a KLL sketch holds fewer than ``k`` values it is exact.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from functools import lru_cache
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.arrow_pandas import numpy_of

__all__ = [
    "FOLD_EVERY", "EXACT_UP_TO", "hll_lg_k", "kll_k", "hll_slot", "hll_add", "hll_extend",
    "hll_merge", "hll_estimate", "hll_estimates", "kll_slot", "kll_add", "kll_extend",
    "kll_merge", "kll_quantiles", "group_slots",
]  # fmt: skip

#: Pending values a slot holds before they are folded into its sketch.
FOLD_EVERY = 256
#: Distinct values an HLL sketch keeps as a list of exact hash coupons (at every
#: ``lg_k``): an estimate up to this many is their count.
EXACT_UP_TO = 8
_F64, _F64_AS_I64 = struct.Struct("<d"), struct.Struct("<q")
_LG_K_MIN, _LG_K_MAX = 4, 21
_KLL_K_MAX = 65535


def _ds() -> Any:
    import datasketches

    return datasketches


def hll_lg_k(rsd: float) -> int:
    """Spark's HyperLogLog++ precision for relative standard deviation ``rsd``;
    ``ValueError`` when it needs fewer than 4 bits (rsd above 0.39) as in Spark."""
    if not isinstance(rsd, (int, float)) or isinstance(rsd, bool) or not rsd > 0:
        raise ValueError(f"rsd must be a positive number, got {rsd!r}")
    p = math.ceil(2.0 * math.log(1.106 / rsd) / math.log(2.0))
    if p < _LG_K_MIN:
        raise ValueError(f"rsd {rsd!r} is too large: it must be at most 0.39 (as in Spark)")
    return min(p, _LG_K_MAX)


@lru_cache(maxsize=32)
def kll_k(accuracy: int) -> int:
    """The smallest KLL ``k`` whose rank error is within ``1 / accuracy`` (at most
    65535)."""
    if type(accuracy) is not int or accuracy < 1:
        raise ValueError(f"accuracy must be a positive int, got {accuracy!r}")
    error = _ds().kll_doubles_sketch.get_normalized_rank_error
    target = 1.0 / accuracy
    lo, hi = 8, _KLL_K_MAX
    if error(hi, False) > target:
        return hi
    while lo < hi:  # the error falls as k grows
        mid = (lo + hi) // 2
        if error(mid, False) <= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


#: Types the HLL sketch hashes as they are (exact types: a bool is counted as an int).
_HLL_PLAIN = frozenset({int, float, str})


def _hll_value(value: Any) -> Any:
    # the sketch hashes ints, floats and strs; anything else by its text
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.hex()
    return repr(value)


def hll_slot(lg_k: int) -> list:
    """An empty HLL slot of ``lg_k`` bits."""
    return [lg_k, None, []]


def _hll_sketch(slot: list) -> Any:
    """The slot's sketch with its pending values counted (None for an empty slot)."""
    lg_k, data, pending = slot
    ds = _ds()
    if not pending:
        return None if data is None else ds.hll_sketch.deserialize(data)
    sketch = ds.hll_sketch(lg_k, ds.tgt_hll_type.HLL_8)
    update = sketch.update
    if len(pending) > EXACT_UP_TO and set(map(type, pending)) == {str}:
        # a repeated value changes no register (nor the HIP estimator's running
        # sum, which only register changes add to), and equal strs are hashed
        # alike (their UTF-8 bytes): count each once, in first-seen order
        pending = dict.fromkeys(pending)
    for v in pending:  # the common types without a call per value
        update(v if type(v) in _HLL_PLAIN else _hll_value(v))
    if data is None:
        return sketch
    union = ds.hll_union(lg_k)
    union.update(ds.hll_sketch.deserialize(data))
    union.update(sketch)
    return union.get_result(ds.tgt_hll_type.HLL_8)


def _hll_fold(slot: list) -> bytes | None:
    """The slot's sketch bytes with its pending values counted."""
    if not slot[2]:
        return slot[1]
    return _hll_sketch(slot).serialize_compact()


def _extend(slot: list, values: list, fold: Any) -> list:
    """``slot`` with the non-null ``values`` added in order, folded exactly where
    adding them one by one folds (every :data:`FOLD_EVERY` pending values: a
    sketch's estimate depends on how its values were grouped into unions)."""
    if None in values:
        values = [v for v in values if v is not None]
    pending = slot[2]
    room = max(1, FOLD_EVERY - len(pending))  # a slot already full folds at its next value
    if len(values) < room:
        pending.extend(values)
        return slot
    slot[2].extend(values[:room])
    slot = [slot[0], fold(slot), []]
    at = room
    while len(values) - at >= FOLD_EVERY:
        slot = [slot[0], fold([slot[0], slot[1], values[at : at + FOLD_EVERY]]), []]
        at += FOLD_EVERY
    slot[2] = values[at:]
    return slot


def group_slots(
    size: int, extend: Callable[[list, list], list]
) -> Callable[[list, Sequence[int], Sequence[int]], list]:
    """``slots(values, starts, ends)``: the slot of each group ``values[a:b]`` (``a``,
    ``b`` from ``starts``, ``ends``), an empty slot of ``size`` with the group's
    values added in order by ``extend`` (:func:`hll_extend`, :func:`kll_extend`).
    A group without nulls and shorter than :data:`FOLD_EVERY` is its values pending,
    as ``extend`` leaves it, without a call per group."""

    def slots(values: list, starts: Sequence[int], ends: Sequence[int]) -> list:
        bounds = zip(starts, ends, strict=True)
        if None in values:
            return [extend([size, None, []], values[a:b]) for a, b in bounds]
        return [
            [size, None, values[a:b]]
            if b - a < FOLD_EVERY
            else extend([size, None, []], values[a:b])
            for a, b in bounds
        ]

    return slots


def hll_add(slot: list, value: Any) -> list:
    """``slot`` with ``value`` counted (nulls skipped)."""
    if value is None:
        return slot
    slot[2].append(value)
    if len(slot[2]) >= FOLD_EVERY:
        return [slot[0], _hll_fold(slot), []]
    return slot


def hll_extend(slot: list, values: list) -> list:
    """``slot`` with each of ``values`` counted, as :func:`hll_add` one by one."""
    return _extend(slot, values, _hll_fold)


def hll_merge(a: list, b: list) -> list:
    """Two HLL slots as one (the union of what they counted)."""
    lg_k = max(a[0], b[0])
    if a[1] is None and b[1] is None and len(a[2]) + len(b[2]) < FOLD_EVERY:
        return [lg_k, None, a[2] + b[2]]
    ds = _ds()
    union = ds.hll_union(lg_k)
    for s in (a, b):
        data = _hll_fold(s)
        if data is not None:
            union.update(ds.hll_sketch.deserialize(data))
    return [lg_k, union.get_result(ds.tgt_hll_type.HLL_8).serialize_compact(), []]


def _few_distinct(pending: list) -> int | None:
    """How many distinct values the sketch would see in ``pending``, when that is at
    most :data:`EXACT_UP_TO` and every value is an int64, a non-NaN float or a
    str; else None. The sketch hashes the 8 bytes of an int64 or of a float (-0.0
    as 0.0), and a str's UTF-8 bytes (an empty one not at all), so values are told
    apart by those bytes: 0 and 0.0 are one value, 1 and 1.0 two."""
    seen: set = set()
    for v in pending:
        t = type(v)
        if t is str:
            data = v.encode()
            if len(data) == 8:  # the bytes of an int64 too
                seen.add(int.from_bytes(data, "little", signed=True))
            elif data:
                seen.add(data)
        elif t is int or t is bool:
            if not -(2**63) <= v < 2**63:
                return None  # hashed as a float
            seen.add(int(v))
        elif t is float and v == v:
            seen.add(_F64_AS_I64.unpack(_F64.pack(v))[0] if v else 0)
        else:
            return None
        if len(seen) > EXACT_UP_TO:
            return None
    return len(seen)


def hll_estimate(slot: list) -> int:
    """The distinct count estimate (0 for no non-null value, as Spark gives). A
    slot not yet folded with at most :data:`EXACT_UP_TO` distinct values counts
    them: the sketch's estimate there is that count unless two of them share a
    hash coupon, and building a sketch per short session is most of this
    function's cost."""
    if slot[1] is None:
        few = _few_distinct(slot[2])
        if few is not None:
            return few
    return _sketch_estimate(slot)


def _sketch_estimate(slot: list) -> int:
    sketch = _hll_sketch(slot)  # not serialized: the estimate is the sketch's own
    if sketch is None:
        return 0
    return int(round(sketch.get_estimate()))


def hll_estimates(slots: list) -> list[int]:
    """:func:`hll_estimate` of each of ``slots``. The distinct values of the slots
    not yet folded are counted for all of them at once when they are all strs or
    all ints within int64 (``_few_distinct``'s rules for those types: an empty str
    is not counted); the others, and a slot of more than :data:`EXACT_UP_TO`
    distinct values, ask their sketch."""
    out: list[Any] = [None] * len(slots)
    few = [i for i, slot in enumerate(slots) if slot[1] is None]
    counts = _distinct_counts([slots[i][2] for i in few]) if few else None
    if counts is not None:  # counted: a slot of more distinct values goes to its sketch
        for i, n in zip(few, counts.tolist(), strict=True):
            out[i] = n if n <= EXACT_UP_TO else _sketch_estimate(slots[i])
    return [hll_estimate(slot) if n is None else n for slot, n in zip(slots, out, strict=True)]


def _distinct_counts(lists: list[list]) -> np.ndarray | None:
    """The distinct values of each of ``lists`` as an int array, when every value
    is a str (empty ones not counted) or every value an int within int64; else
    None."""
    flat = list(chain.from_iterable(lists))
    if not flat:
        return np.zeros(len(lists), dtype=np.int64)
    kinds = set(map(type, flat))
    if kinds != {str} and kinds != {int}:
        return None  # bytes and bools would convert silently, floats hash apart
    kind = kinds.pop()
    try:
        arr = pa.array(flat, pa.string() if kind is str else pa.int64())
    except (pa.ArrowException, OverflowError, UnicodeError):
        return None  # an int beyond int64, a str that is not UTF-8
    encoded = pc.dictionary_encode(arr)
    codes = numpy_of(encoded.indices).astype(np.int64)
    groups = np.repeat(np.arange(len(lists), dtype=np.int64), [len(v) for v in lists])
    if kind is str:  # an empty str is not hashed
        empty = numpy_of(pc.equal(encoded.dictionary, pa.scalar("", pa.string())))
        keep = ~empty[codes]
        codes, groups = codes[keep], groups[keep]
    size = len(encoded.dictionary)
    pairs = np.unique(groups * size + codes)
    return np.bincount(pairs // size, minlength=len(lists))


def kll_slot(k: int) -> list:
    """An empty KLL slot of size ``k``."""
    return [k, None, []]


def _kll_sketch(slot: list) -> Any:
    k, data, pending = slot
    ds = _ds()
    sketch = ds.kll_doubles_sketch(k) if data is None else ds.kll_doubles_sketch.deserialize(data)
    for v in pending:
        sketch.update(float(v))
    return sketch


def kll_add(slot: list, value: Any) -> list:
    """``slot`` with ``value`` added (nulls skipped)."""
    if value is None:
        return slot
    slot[2].append(value)
    if len(slot[2]) >= FOLD_EVERY:
        return [slot[0], _kll_sketch(slot).serialize(), []]
    return slot


def kll_extend(slot: list, values: list) -> list:
    """``slot`` with each of ``values`` added, as :func:`kll_add` one by one."""
    return _extend(slot, values, lambda s: _kll_sketch(s).serialize())


def kll_merge(a: list, b: list) -> list:
    """Two KLL slots as one."""
    if a[1] is None and b[1] is None and len(a[2]) + len(b[2]) < FOLD_EVERY:
        return [max(a[0], b[0]), None, a[2] + b[2]]
    sa, sb = _kll_sketch(a), _kll_sketch(b)
    if sa.k < sb.k:
        sa, sb = sb, sa
    sa.merge(sb)
    return [sa.k, sa.serialize(), []]


def kll_quantiles(slot: list, ranks: list[float]) -> list[float] | None:
    """The values at normalized ``ranks`` (inclusive: the smallest value whose rank
    reaches it, Spark's definition), or None for no non-null value."""
    sketch = _kll_sketch(slot)
    if sketch.is_empty():
        return None
    return [sketch.get_quantile(r, True) for r in ranks]
