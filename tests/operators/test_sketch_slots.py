"""Sketch slots folded a group at a time (``hll_extend``/``kll_extend``, the
columnar paths) equal the same values added one by one (the record path), byte
for byte: a sketch's estimate depends on how its values were grouped into unions,
so the two paths must fold at the same places."""

from __future__ import annotations

import datasketches
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.operators import sketches

VALUES = st.lists(
    st.one_of(
        st.none(),
        st.integers(-50, 50),
        st.text(max_size=3),
        st.floats(-5, 5),
        st.booleans(),
        st.binary(max_size=2),
    ),
    max_size=900,
)


def _start(make, add, already):
    slot = make()
    for v in already:
        slot = add(slot, v)
    return slot


@settings(max_examples=60, deadline=None)
@given(already=VALUES, values=VALUES, lg_k=st.sampled_from([4, 9, 12]))
def test_hll_extend_equals_adding_one_by_one(already, values, lg_k):
    one = _start(lambda: sketches.hll_slot(lg_k), sketches.hll_add, already)
    many = _start(lambda: sketches.hll_slot(lg_k), sketches.hll_add, already)
    for v in values:
        one = sketches.hll_add(one, v)
    many = sketches.hll_extend(many, values)
    assert many == one
    assert sketches.hll_estimate(many) == sketches.hll_estimate(one)


@settings(max_examples=40, deadline=None)
@given(already=VALUES, values=VALUES)
def test_kll_extend_equals_adding_one_by_one(already, values):
    def numbers(vs):
        return [v if v is None or isinstance(v, (int, float)) else len(v) for v in vs]

    already, values = numbers(already), numbers(values)
    one = _start(lambda: sketches.kll_slot(200), sketches.kll_add, already)
    many = _start(lambda: sketches.kll_slot(200), sketches.kll_add, already)
    for v in values:
        one = sketches.kll_add(one, v)
    assert sketches.kll_extend(many, values) == one


def test_a_slot_holding_more_pending_values_than_a_fold_folds_at_its_next_value():
    full = [9, None, list(range(sketches.FOLD_EVERY + 3))]  # as a merge of old slots may leave
    one = sketches.hll_add([9, None, list(full[2])], 7)
    assert sketches.hll_extend([9, None, list(full[2])], [7]) == one
    assert one[2] == [] and one[1] is not None
    assert sketches.hll_extend([9, None, list(full[2])], [None]) == [9, None, full[2]]


def _stored_estimate(slot):
    """The model: the estimate of the slot's sketch serialized as a state stores
    it and read back (every pending value folded in)."""
    lg_k, data, pending = slot
    if not pending:
        return (
            0 if data is None else round(datasketches.hll_sketch.deserialize(data).get_estimate())
        )
    sketch = datasketches.hll_sketch(lg_k, datasketches.tgt_hll_type.HLL_8)
    for v in pending:  # the documented mapping: a bool as an int, bytes as hex
        sketch.update(int(v) if isinstance(v, bool) else v.hex() if isinstance(v, bytes) else v)
    if data is not None:
        union = datasketches.hll_union(lg_k)
        union.update(datasketches.hll_sketch.deserialize(data))
        union.update(sketch)
        sketch = union.get_result(datasketches.tgt_hll_type.HLL_8)
    stored = datasketches.hll_sketch.deserialize(sketch.serialize_compact())
    return round(stored.get_estimate())


@settings(max_examples=80, deadline=None)
@given(values=VALUES, merged=VALUES, lg_k=st.sampled_from([4, 9, 12]))
def test_hll_estimate_is_the_estimate_of_the_stored_sketch(values, merged, lg_k):
    # the estimate is taken from the sketch as built; what a restored state holds is
    # its serialized bytes: both must give the same count
    slot = sketches.hll_extend(sketches.hll_slot(lg_k), values)
    slot = sketches.hll_merge(slot, sketches.hll_extend(sketches.hll_slot(lg_k), merged))
    slot = sketches.hll_extend(slot, values[:7])
    assert sketches.hll_estimate(slot) == _stored_estimate(slot)


SMALL = st.lists(
    st.one_of(
        st.none(),
        st.integers(-3, 3),
        st.sampled_from([0.0, -0.0, 1.0, 2.5, float("nan")]),
        st.booleans(),
        st.text(max_size=2),
        st.binary(max_size=1),
        st.sampled_from([2**63 - 1, -(2**63), 2**63 + 5, 4607182418800017408]),  # 1.0's bits
        st.sampled_from([(1).to_bytes(8, "little").decode(), "é" * 4, "abcdefgh"]),  # 8 bytes
    ),
    max_size=14,
)


@settings(max_examples=300, deadline=None)
@given(values=SMALL, lg_k=st.integers(4, 21))
def test_a_short_unfolded_slot_gives_the_sketch_estimate(values, lg_k):
    # counted without a sketch up to EXACT_UP_TO distinct values: 1 and 1.0 and True,
    # 0.0 and -0.0, NaN, bytes and ints beyond int64 as the sketch sees them
    slot = sketches.hll_extend(sketches.hll_slot(lg_k), values)
    try:
        want = _stored_estimate(slot)
    except (TypeError, OverflowError, ValueError):  # the sketch refuses the value
        return
    assert sketches.hll_estimate(slot) == want


STRS = st.lists(
    st.sampled_from(["", "a", "b", "abcdefgh", "é" * 4, "z" * 9, "q", "r", "s", "t", "u"]),
    max_size=14,
)
INTS = st.lists(st.one_of(st.integers(-12, 12), st.sampled_from([2**63 - 1, -(2**63)])),
                max_size=14)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.one_of(STRS, INTS, SMALL, VALUES), max_size=8),
    homogeneous=st.sampled_from([STRS, INTS]).flatmap(lambda s: st.lists(s, max_size=8)),
    fold=st.lists(st.booleans(), max_size=8),
)
def test_the_estimates_of_many_slots_at_once_are_each_slots_estimate(groups, homogeneous, fold):
    """``hll_estimates`` (column-wise: short unfolded slots of strs or of int64s
    counted together) gives each slot what ``hll_estimate`` gives it, however the
    slots mix types, empty strs, long or folded slots."""
    for lists in (groups, homogeneous):
        folded = sketches.hll_extend(sketches.hll_slot(9), list(range(sketches.FOLD_EVERY)))
        slots = [
            # a folded slot with the values pending, or an unfolded one
            sketches.hll_extend([9, folded[1], []] if folding else sketches.hll_slot(9), values)
            for values, folding in zip(lists, fold + [False] * len(lists), strict=False)
        ]
        try:
            want = [sketches.hll_estimate(slot) for slot in slots]
        except (TypeError, OverflowError, ValueError):  # the sketch refuses a value
            continue
        assert sketches.hll_estimates(slots) == want


@settings(max_examples=60, deadline=None)
@given(values=VALUES, cuts=st.lists(st.integers(0, 900), max_size=5), size=st.sampled_from([4, 9]))
def test_group_slots_equal_extending_an_empty_slot_with_each_group(values, cuts, size):
    bounds = sorted({0, len(values), *[c for c in cuts if c <= len(values)]})
    starts, ends = bounds[:-1], bounds[1:]
    numbers = [v if v is None or isinstance(v, (int, float)) else len(v) for v in values]
    for make, extend, vs in (
        (sketches.hll_slot, sketches.hll_extend, values),
        (sketches.kll_slot, sketches.kll_extend, numbers),
    ):
        want = [extend(make(size if make is sketches.hll_slot else 200), vs[a:b])
                for a, b in zip(starts, ends, strict=True)]  # fmt: skip
        slots = sketches.group_slots(size if make is sketches.hll_slot else 200, extend)
        assert slots(vs, starts, ends) == want


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(st.integers(0, 61), min_size=1, max_size=62),
    n=st.integers(0, 900),
    lg_k=st.sampled_from([4, 9, 12]),
)
def test_a_sketch_of_repeated_strs_counts_each_once_to_the_same_bytes(picks, n, lg_k):
    """Strs are counted once each, in first-seen order: every fold and estimate,
    HIP estimator included, is byte for byte what updating every value in turn
    gives (a session's values: up to 900, of up to 62 distinct, repeated)."""
    pool = [f"/p{i}" for i in range(60)] + ["", "é"]
    values = [pool[picks[(i * 7 + i // len(picks)) % len(picks)]] for i in range(n)]
    hll = datasketches.tgt_hll_type.HLL_8

    def sketch_of(data, chunk):
        sketch = datasketches.hll_sketch(lg_k, hll)
        for v in chunk:  # every value, repeats included
            sketch.update(v)
        if data is None:
            return sketch
        union = datasketches.hll_union(lg_k)
        union.update(datasketches.hll_sketch.deserialize(data))
        union.update(sketch)
        return union.get_result(hll)

    data, at, every = None, 0, sketches.FOLD_EVERY
    while len(values) - at >= every:
        data = sketch_of(data, values[at : at + every]).serialize_compact()
        at += every
    slot = sketches.hll_extend(sketches.hll_slot(lg_k), list(values))
    assert slot == [lg_k, data, values[at:]]
    rest = values[at:]
    want = 0 if not values else round(sketch_of(data, rest).get_estimate()) if rest else None
    if want is None:
        want = round(datasketches.hll_sketch.deserialize(data).get_estimate())
    assert sketches.hll_estimate(slot) == want
