"""The built-in aggregate functions: Spark's null semantics, merges in any grouping
equal to aggregating everything at once (moments, sets, sketches within bounds),
the columnar paths equal to the record path, specs refused with one clear
message, and output plans of older checkpoints still read."""

from __future__ import annotations

import math
import random
import statistics
import tempfile
from datetime import UTC
from decimal import ROUND_HALF_UP, Decimal

import msgpack
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, StateDB
from sessionstore.operators import (
    Aggregation,
    Aggregations,
    SessionWindowAggregator,
    SessionWindows,
    TimeWindows,
    WindowAggregator,
)
from sessionstore.operators.aggregations import OUTPUT_PLAN_AUX, recorded_output
from tests.operators.sessions.records import closed_rows

#: One of every function over value ``x`` (a number or None) and label ``s``.
EVERY = {
    "n": "count",
    "c": ("count", "x"),
    "sum": ("sum", "x"),
    "avg": ("avg", "x"),
    "mean": ("mean", "x"),
    "min": ("min", "x"),
    "max": ("max", "s"),
    "cd": ("count_distinct", "s"),
    "acd": ("approx_count_distinct", "s"),
    "sd": ("stddev", "x"),
    "sds": ("stddev_samp", "x"),
    "sdp": ("stddev_pop", "x"),
    "var": ("variance", "x"),
    "vs": ("var_samp", "x"),
    "vp": ("var_pop", "x"),
    "p": ("percentile_approx", "x", [0.0, 0.3, 0.5, 1.0]),
    "cs": ("collect_set", "s"),
    "cl": ("collect_list", "s"),
    "minby": ("min_by", "s", "x"),
    "maxby": ("max_by", "s", "x"),
}
DOUBLES = {"avg", "mean", "sd", "sds", "sdp", "var", "vs", "vp"}


def _model(rows: list[dict]) -> dict:
    """What Spark gives for the rows in this order (a simple model)."""
    xs = [r["x"] for r in rows if r["x"] is not None]
    ss = [r["s"] for r in rows if r["s"] is not None]
    by = [(r["x"], r["s"]) for r in rows if r["x"] is not None]
    n = len(xs)
    return {
        "n": len(rows), "c": n, "sum": sum(xs) if xs else None,
        "avg": statistics.fmean(xs) if xs else None, "mean": statistics.fmean(xs) if xs else None,
        "min": min(xs) if xs else None, "max": max(ss) if ss else None,
        "cd": len(set(ss)), "acd": len(set(ss)),
        "sd": statistics.stdev(xs) if n > 1 else None, "sds": statistics.stdev(xs) if n > 1 else None,
        "sdp": statistics.pstdev(xs) if n else None,
        "var": statistics.variance(xs) if n > 1 else None,
        "vs": statistics.variance(xs) if n > 1 else None,
        "vp": statistics.pvariance(xs) if n else None,
        # the smallest value whose rank reaches p (exact below KLL's k)
        "p": [sorted(xs)[max(math.ceil(p * n), 1) - 1] for p in (0.0, 0.3, 0.5, 1.0)] if xs else None,
        "cs": sorted(set(ss)), "cl": ss,
        # the first row (in order) holding the extreme
        "minby": min(by, key=lambda b: b[0])[1] if by else None,
        "maxby": max(by, key=lambda b: b[0])[1] if by else None,
    }  # fmt: skip


def _assert_results(got: dict, want: dict, sets_ordered: bool = True) -> None:
    for name, w in want.items():
        g = got[name]
        where = f"{name}: got {g!r}, want {w!r}"
        if (name in DOUBLES or isinstance(w, float)) and g is not None and w is not None:
            assert math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-9), where
        elif name == "acd":
            assert abs(g - w) <= 3 * 0.05 * max(w, 1), where
        elif name == "cs" or (name == "cl" and not sets_ordered):
            assert sorted(g) == sorted(w), where
        else:
            assert g == w, where


ROWS = st.lists(
    st.fixed_dictionaries({
        "x": st.one_of(st.none(), st.integers(-1000, 1000), st.floats(-1e6, 1e6)),
        "s": st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d", "e"])),
    }),
    max_size=40,
)  # fmt: skip


def _aggregate(aggs: Aggregations, rows: list[dict], start: int = 0) -> list:
    acc = aggs.initializer()
    for i, r in enumerate(rows):
        acc = aggs.add("k", r, start + i, acc)
    return acc


@settings(max_examples=200, deadline=None)
@given(rows=ROWS, cuts=st.lists(st.integers(0, 40), max_size=6), seed=st.integers(0, 99))
def test_merging_in_any_grouping_equals_aggregating_all_at_once(rows, cuts, seed):
    """Split the rows into consecutive groups (at ``cuts``), aggregate each, then
    merge the accumulators pairwise in a random tree (keeping their order, as
    sessions merge older first); every result equals the model of all rows, and
    survives a msgpack round trip at every step (accumulators are data)."""
    aggs = Aggregations(EVERY)
    bounds = sorted({0, len(rows), *[c for c in cuts if c <= len(rows)]})
    parts = [_aggregate(aggs, rows[a:b], a) for a, b in zip(bounds, bounds[1:], strict=False)] or [
        aggs.initializer()
    ]
    rng = random.Random(seed)
    while len(parts) > 1:
        i = rng.randrange(len(parts) - 1)
        merged = aggs.merger("k", parts[i], parts[i + 1])
        parts[i : i + 2] = [msgpack.unpackb(msgpack.packb(merged, use_bin_type=True), raw=False)]
    _assert_results(aggs.finish(parts[0]), _model(rows))


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN (column-wise results must be the very values)."""
    if isinstance(a, float) and isinstance(b, float) and a != a:
        return b != b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b and type(a) is type(b)


@settings(max_examples=100, deadline=None)
@given(groups=st.lists(ROWS, max_size=12), odd=st.lists(st.sampled_from(
    [math.inf, -math.inf, math.nan, 0.0, -0.0, 2.0**60]), max_size=3))  # fmt: skip
def test_finishing_many_accumulators_at_once_equals_finishing_each(groups, odd):
    """``finish_columns`` (the results per aggregate, over every session an advance
    closes) gives each accumulator exactly what ``finish`` gives it: avg and the
    moments column-wise in numpy (NaN and infinities too), the HLL estimates of
    short sessions counted together, the others one by one."""
    aggs = Aggregations(
        {**EVERY, "acdx": ("approx_count_distinct", "x"), "sdx": ("stddev_pop", "x")}
    )
    groups = [*groups, [{"x": v, "s": None} for v in odd]]
    accs = [
        msgpack.unpackb(msgpack.packb(_aggregate(aggs, rows), use_bin_type=True), raw=False)
        for rows in groups
    ]
    columns = aggs.finish_columns(accs)
    assert list(columns) == aggs.names
    for i, acc in enumerate(accs):
        for name, want in aggs.finish(acc).items():
            column = columns[name]
            got = column[i] if isinstance(column, list) else column[i].as_py()
            assert _same(got, want), f"{name} of group {i}: {got!r} != {want!r}"
    assert all(len(c) == 0 for c in aggs.finish_columns([]).values())


def test_nulls_are_skipped_and_empty_results_are_sparks():
    """All-null values: sum, avg, moments, min_by and percentile give null, counts
    0, sets empty; one value: sample statistics null, population ones 0."""
    aggs = Aggregations(EVERY)
    out = aggs.finish(_aggregate(aggs, [{"x": None, "s": None}] * 3))
    assert out["n"] == 3 and out["c"] == 0 and out["cd"] == 0 and out["acd"] == 0
    assert out["cs"] == [] and out["cl"] == []
    for name in ("sum", "avg", "min", "max", "sd", "sdp", "vs", "vp", "p", "minby", "maxby"):
        assert out[name] is None, name
    one = aggs.finish(_aggregate(aggs, [{"x": 4, "s": "a"}]))
    assert one["sds"] is None and one["vs"] is None and one["sdp"] == 0.0 and one["vp"] == 0.0
    assert one["p"] == [4.0, 4.0, 4.0, 4.0] and one["minby"] == "a"


@pytest.mark.parametrize("rsd", [0.05, 0.02, 0.1])
def test_approx_count_distinct_stays_within_three_rsd_across_merges(rsd):
    aggs = Aggregations({"u": ("approx_count_distinct", "s", rsd)})
    parts = [_aggregate(aggs, [{"s": f"user-{i}"} for i in range(j, 20_000, 7)]) for j in range(7)]
    acc = parts[0]
    for p in parts[1:]:
        acc = aggs.merger("k", acc, p)
    assert abs(aggs.finish(acc)["u"] - 20_000) <= 3 * rsd * 20_000


@pytest.mark.parametrize("accuracy", [100, 10_000])
def test_percentile_approx_is_within_its_rank_bound(accuracy):
    """Past the sketch's exact size: the rank of each answer is within 1/accuracy
    (single-sided; the bound checked is twice it, both sides) of the percentage."""
    rng = random.Random(1)
    values = [rng.random() for _ in range(30_000)]
    ps = [0.01, 0.25, 0.5, 0.9, 0.99]
    aggs = Aggregations({"q": ("percentile_approx", "x", ps, accuracy)})
    halves = [_aggregate(aggs, [{"x": v} for v in values[i::2]]) for i in range(2)]
    got = aggs.finish(aggs.merger("k", *halves))["q"]
    ordered = sorted(values)
    for p, v in zip(ps, got, strict=True):
        rank = (ordered.index(v) + 1) / len(ordered)
        assert abs(rank - p) <= 2.0 / accuracy + 1.0 / len(values), (p, rank)


@pytest.mark.parametrize(
    "how, message",
    [
        (("avg",), "expected (fn, column)"),
        (("median", "x"), "unknown function 'median'"),
        (("avg", "x", "y"), "avg takes one column"),
        (("min_by", "x"), "expected (fn, column, ordering column)"),
        (("percentile_approx", "x", 1.5), "percentage must be in [0, 1]"),
        (("percentile_approx", "x", [0.5, -0.1]), "percentage must be in [0, 1]"),
        (("percentile_approx", "x", 0.5, 0), "accuracy must be a positive int"),
        (("approx_count_distinct", "x", 0.5), "at most 0.39"),
        (42, "expected 'count' or a tuple"),
    ],
)
def test_bad_specs_raise_one_message_naming_the_aggregate(how, message):
    with pytest.raises(ValueError) as info:
        Aggregations({"ok": "count", "bad": how})
    assert str(info.value).startswith("aggregation 'bad'") and message in str(info.value)


def test_custom_aggregations_sit_beside_built_ins_and_merge_with_the_key():
    seen = []
    product = Aggregation(
        lambda: 1, lambda k, v, acc: acc * v["x"], lambda k, a, b: seen.append(k) or a * b
    )
    keys = Aggregation(list, lambda k, v, acc: acc + [k], lambda k, a, b: a + b, len)
    aggs = Aggregations({"p": product, "avg": ("avg", "x"), "k": keys})
    a = _aggregate(aggs, [{"x": 2}, {"x": 3}])
    b = _aggregate(aggs, [{"x": 5}])
    assert aggs.finish(aggs.merger("key", a, b)) == {"p": 30, "avg": 10 / 3, "k": 3}
    assert seen == ["key"]


def test_an_output_plan_of_an_older_checkpoint_is_still_read():
    """Plans written before the new functions hold [name, fn, column] triples, and
    their stored accumulators keep their layout: read as before."""
    store = InMemorySessionStore("s", 100)
    old = {"layout": "acc", "aggregates": [["n", "count", None], ["t", "sum", "v"],
                                           ["f", "first", "s"], ["all", "collect", "s"]]}  # fmt: skip
    store.write_aux(OUTPUT_PLAN_AUX, msgpack.packb(old))
    finish = recorded_output(store)
    assert finish([3, 0, [5, "x"], ["x", None]]) == (
        {},
        {"n": 3, "t": 0, "f": "x", "all": ["x", None]},
    )


def test_new_plans_record_arguments_and_show_sketches_by_estimate():
    store = InMemorySessionStore("s", 100)
    custom = Aggregation(lambda: 0, lambda k, v, acc: acc + 1, lambda k, a, b: a + b)
    spec = {"u": ("approx_count_distinct", "s", 0.1), "q": ("percentile_approx", "x", [0.5]),
            "mb": ("min_by", "s", "x"), "mine": custom}  # fmt: skip
    agg = SessionWindowAggregator(store, SessionWindows(5), aggregations=spec, emit="final")
    aggs = agg.aggregation
    acc = _aggregate(aggs, [{"s": s, "x": x} for s, x in [("a", 3), ("b", 1), ("a", 2)]])
    fields, shown = recorded_output(store)(msgpack.unpackb(msgpack.packb(acc), raw=False))
    assert shown == {"u": 2, "q": [2.0], "mb": "b", "mine": 3}  # a custom one: its accumulator


# -- exact decimals ----------------------------------------------------------------
#: Averages a real Spark 4 query gave (``groupBy().avg(v)`` over ``decimal(p,s)``):
#: the sum divided at scale 39, rounded half up (away from zero) to decimal(p+4, s+4),
#: both capped at 38.
SPARK_AVERAGES = [
    ("decimal(10,0)", ["1"] + ["0"] * 31, "0.0313"),
    ("decimal(10,0)", ["-1"] + ["0"] * 31, "-0.0313"),
    ("decimal(10,0)", ["3", "3", "3", "2"], "2.7500"),
    ("decimal(10,0)", ["1000000000"] * 3, "1000000000.0000"),
    ("decimal(10,2)", ["0.01", "0.02", "0.02"], "0.016667"),
    ("decimal(10,2)", ["-0.05"] + ["0.00"] * 15, "-0.003125"),
    ("decimal(38,10)", ["0.0000000001", "0.0000000002", "0.0000000002"], "1.6667E-10"),
    ("decimal(38,10)", ["0", "0", "0"], "0E-14"),
    ("decimal(20,18)", ["1.000000000000000001", "0", "0"], "0.3333333333333333336667"),
    ("decimal(5,5)", ["0.00001"] + ["0"] * 31, "3.13E-7"),
    ("decimal(38,36)", ["1.5", "0.000000000000000000000000000000000001"],
     "0.75000000000000000000000000000000000050"),
    ("decimal(38,36)", ["0.1", "0.2", "0.2"], "0.16666666666666666666666666666666666667"),
]  # fmt: skip


@pytest.mark.parametrize("dtype, values, expected", SPARK_AVERAGES)
def test_a_decimal_average_is_sparks_to_the_last_digit(dtype, values, expected):
    aggs = Aggregations({"a": ("avg", "v")}, {"v": dtype})
    got = aggs.finish(_aggregate(aggs, [{"v": Decimal(v)} for v in values]))["a"]
    assert str(got) == expected


def test_a_decimal_sum_or_average_past_its_type_is_an_error_or_null():
    """Spark (ANSI, its default) fails the query; without ANSI it gives null."""
    rows = [{"v": Decimal("1234567890123456789012345678.0123456789")}, {"v": Decimal(1)}]
    # the average of two: 27 integer digits, past decimal(38,14); the sum of 100: 30,
    # past decimal(38,10)
    for fn, many in (("avg", 1), ("sum", 50)):
        spec = {"a": (fn, "v")}
        errors = Aggregations(spec, {"v": "decimal(38,10)"})
        acc = _aggregate(errors, rows * many)
        with pytest.raises(ArithmeticError, match=r"'a'.*cannot be represented as decimal\(38,"):
            errors.finish(acc)
        nulls = Aggregations(spec, {"v": "decimal(38,10)"}, overflow="null")
        assert nulls.finish(acc) == {"a": None}
    # the sum of two fits decimal(38,10) exactly (no rounding to 28 digits)
    both = Aggregations({"s": ("sum", "v")}, {"v": "decimal(38,10)"})
    assert (
        str(both.finish(_aggregate(both, rows))["s"]) == "1234567890123456789012345679.0123456789"
    )


DECIMAL_SPEC = {
    "avg": ("avg", "d"), "sum": ("sum", "d"), "min": ("min", "d"), "max": ("max", "d"),
    "first": ("first", "d"), "last": ("last", "d"), "cl": ("collect_list", "d"),
    "cs": ("collect_set", "d"), "cd": ("count_distinct", "d"), "minby": ("min_by", "d", "o"),
    "maxby": ("max_by", "s", "d"), "all": ("collect", "d"),
}  # fmt: skip
DECIMALS = st.one_of(
    st.none(), st.decimals(-(10**6), 10**6, places=2, allow_nan=False, allow_infinity=False)
)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.fixed_dictionaries({"d": DECIMALS, "o": DECIMALS, "s": st.sampled_from("abc")}),
        max_size=30,
    ),
    cuts=st.lists(st.integers(0, 30), max_size=5),
)
def test_decimal_aggregates_are_exact_in_any_grouping(rows, cuts):
    """Over a decimal(9,2) column: accumulators of consecutive groups merged (each
    through msgpack: decimals are stored as text) give the exact results of a
    model, as Decimals of the column's scale."""
    rows = [{**r, "d": _scaled(r["d"]), "o": _scaled(r["o"])} for r in rows]
    aggs = Aggregations(DECIMAL_SPEC, {"d": "decimal(9,2)", "o": "decimal(9,2)"})
    bounds = sorted({0, len(rows), *[c for c in cuts if c <= len(rows)]})
    acc = aggs.initializer()
    for a, b in zip(bounds, bounds[1:], strict=False):
        part = msgpack.unpackb(msgpack.packb(_aggregate(aggs, rows[a:b], a)), raw=False)
        acc = msgpack.unpackb(msgpack.packb(aggs.merger("k", acc, part)), raw=False)
    got = aggs.finish(acc)
    ds = [r["d"] for r in rows if r["d"] is not None]
    by_o = [r for r in rows if r["o"] is not None]
    by_d = [r for r in rows if r["d"] is not None]
    want = {
        "sum": sum(ds) if ds else None,
        "avg": (sum(ds) / len(ds)).quantize(Decimal("0.000001"), ROUND_HALF_UP) if ds else None,
        "min": min(ds, default=None), "max": max(ds, default=None),
        "first": rows[0]["d"] if rows else None, "last": rows[-1]["d"] if rows else None,
        "cl": ds, "cs": list(dict.fromkeys(ds)), "cd": len(set(ds)), "all": [r["d"] for r in rows],
        "minby": min(by_o, key=lambda r: r["o"])["d"] if by_o else None,
        "maxby": max(by_d, key=lambda r: r["d"])["s"] if by_d else None,
    }  # fmt: skip
    assert got == want
    for v in [got["min"], got["max"], got["sum"], *got["cl"]]:
        assert v is None or v.as_tuple().exponent == -2  # the column's scale
    assert got["avg"] is None or got["avg"].as_tuple().exponent == -6


def _scaled(v: Decimal | None) -> Decimal | None:
    # as Arrow gives a decimal(9,2) value: exponent -2
    return None if v is None else v.quantize(Decimal("0.01"))


def test_a_recorded_plan_finishes_decimal_slots_as_the_operator_does():
    store = InMemorySessionStore("s", 100)
    spec = {"a": ("avg", "d"), "m": ("max", "d"), "n": "count"}
    agg = SessionWindowAggregator(
        store, SessionWindows(5), aggregations=Aggregations(spec, {"d": "decimal(10,2)"})
    )
    acc = _aggregate(agg.aggregation, [{"d": Decimal("0.05")}] + [{"d": Decimal("0.00")}] * 15)
    _, shown = recorded_output(store)(msgpack.unpackb(msgpack.packb(acc), raw=False))
    assert shown == {"a": Decimal("0.003125"), "m": Decimal("0.05"), "n": 16}


def test_built_ins_read_datetimes_and_dates_as_numbers_beside_a_custom_one():
    """Values that arrive as datetime/date (a custom aggregate sees them so) are
    read by the built-ins as epoch microseconds / days, which msgpack stores."""
    from datetime import date, datetime

    custom = Aggregation(
        list, lambda k, v, acc: acc + [type(v["t"]).__name__], lambda k, a, b: a + b
    )
    aggs = Aggregations(
        {"seen": custom, "max": ("max", "t"), "first": ("min_by", "d", "t"), "lo": ("min", "d")},
        {"t": "timestamp", "d": "date"},
    )
    rows = [
        {"t": datetime(2024, 1, 1, 0, 0, 1, 5, tzinfo=UTC), "d": date(1970, 1, 3)},
        {"t": datetime(2024, 1, 1, 0, 0, 0), "d": date(1969, 12, 31)},
        {"t": None, "d": None},
    ]
    acc = msgpack.unpackb(msgpack.packb(_aggregate(aggs, rows)), raw=False)
    assert aggs.finish(acc) == {
        "seen": ["datetime", "datetime", "NoneType"],
        "max": 1_704_067_201_000_005,
        "first": -1,
        "lo": -1,
    }


# -- the columnar paths -------------------------------------------------------------
COLUMNAR = {
    "n": "count", "c": ("count", "f"), "cs": ("count", "s"), "avg": ("avg", "f"),
    "avgi": ("avg", "v"), "sd": ("stddev", "f"), "sdp": ("stddev_pop", "v"),
    "vs": ("var_samp", "f"), "vp": ("var_pop", "f"), "minby": ("min_by", "s", "f"),
    "maxby": ("max_by", "f", "v"), "lo": ("min", "v"), "first": ("first", "s"),
    "cset": ("collect_set", "s"), "cl": ("collect_list", "s"), "cd": ("count_distinct", "v"),
    "acd": ("approx_count_distinct", "s"), "p": ("percentile_approx", "f", [0.5, 0.9]),
    "pv": ("percentile_approx", "v", 0.5),
}  # fmt: skip


def _close(a, b) -> bool:
    """Equal, doubles to 1e-9 (numpy adds in another order than the record path)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _unordered(rows):
    """Emissions or stored sessions with their lists as multisets: the record path's
    list order depends on how sessions merged, the columnar path's is by time."""

    def norm(v):
        return sorted(v, key=repr) if isinstance(v, list) else v

    return [(*r[:-1], {k: norm(v) for k, v in r[-1].items()}) for r in rows]


def _stored(store, aggregation):
    return _unordered([(w, aggregation.finish(acc)) for w, acc in store.fetch_range(None, None)])


def _table(rows, key="user"):
    return pa.table({
        key: pa.array([r[0] for r in rows], pa.string()),
        "ts": pa.array([r[1] for r in rows], pa.int64()),
        "v": pa.array([r[2] for r in rows], pa.int64()),
        "f": pa.array([r[3] for r in rows], pa.float64()),
        "s": pa.array([r[4] for r in rows], pa.string()),
    })  # fmt: skip


COL_ROWS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", None]), st.integers(0, 60), st.integers(-9, 9),
        st.one_of(st.none(), st.sampled_from([0.5, 1.25, -3.0, 7.75, 1e3])),
        st.sampled_from(["x", "y", None]),
    ),
    min_size=1, max_size=30,
)  # fmt: skip


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(batches=st.lists(COL_ROWS, min_size=1, max_size=4), gap=st.integers(0, 10),
       grace=st.integers(0, 6))  # fmt: skip
# a tie on max_by's ordering between rows that arrive out of time order
@example(batches=[[("b", 35, 0, 0.5, "x"), ("b", 34, 0, None, "x")]], gap=1, grace=1)
def test_columnar_sessions_equal_the_record_path(batches, gap, grace):
    """avg, count(c), moments and min_by/max_by over numeric columns with nulls, and
    lists, sets and sketches take the columnar path; emissions and stored
    accumulators equal the record path's."""
    rec_store, col_store = (
        InMemorySessionStore("r", gap + grace + 1),
        InMemorySessionStore("c", gap + grace + 1),
    )
    windows = SessionWindows(gap, grace)
    rec = SessionWindowAggregator(rec_store, windows, aggregations=COLUMNAR, emit="final")
    col = SessionWindowAggregator(col_store, windows, aggregations=COLUMNAR, emit="final")
    for n, rows in enumerate(batches):
        rows = [(k, t + 40 * n, v, f, s) for k, t, v, f, s in rows]
        expected = []
        for k, t, v, f, s in rows:
            expected.extend(rec.process(k, {"v": v, "f": f, "s": s}, t))
        got = col.process_table(_table(rows), "user", "ts", ["v", "f", "s"])
        assert got is not None, "the batch should take the columnar path"
        want = [(u.key, u.start, u.end, u.value) for u in expected]
        mine = [(r["user"], r["start"], r["end"], r["value"]) for r in got.to_pylist()]
        assert _close(_unordered(mine), _unordered(want))
        assert _close(_stored(col_store, col.aggregation), _stored(rec_store, rec.aggregation))


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(batches=st.lists(COL_ROWS, min_size=1, max_size=4), size=st.integers(1, 12),
       grace=st.integers(0, 6))  # fmt: skip
def test_columnar_windows_equal_the_record_path(batches, size, grace):
    with tempfile.TemporaryDirectory() as tmp, StateDB.open(tmp) as db:
        pair = []
        for name in ("rec", "col"):
            store = db.window_store(name, size + grace, window_size_ms=size)
            pair.append(
                WindowAggregator(store, TimeWindows(size, None, grace), aggregations=COLUMNAR,
                                 emit="final")
            )  # fmt: skip
        rec, col = pair
        for n, rows in enumerate(batches):
            rows = [(k, t + 30 * n, v, f, s) for k, t, v, f, s in rows]
            expected = []
            for k, t, v, f, s in rows:
                expected.extend(rec.process(k, {"v": v, "f": f, "s": s}, t))
            got = col.process_table(_table(rows, "key"), "key", "ts", ["v", "f", "s"])
            assert got is not None
            want = [(u.key, u.start, u.end, u.value) for u in expected]
            mine = [(r["key"], r["start"], r["end"], r["value"]) for r in got.to_pylist()]
            assert _close(_unordered(mine), _unordered(want))


def test_non_finite_doubles_and_collect_stay_on_the_record_path():
    store = InMemorySessionStore("s", 100)
    agg = SessionWindowAggregator(
        store, SessionWindows(5), aggregations={"a": ("avg", "f")}, emit="final"
    )
    table = pa.table({"user": ["a"], "ts": [1], "f": [math.inf]})
    assert agg.process_table(table, "user", "ts", ["f"]) is None
    agg = SessionWindowAggregator(
        store, SessionWindows(5), aggregations={"a": ("collect", "f")}, emit="final"
    )
    assert agg.process_table(pa.table({"user": ["a"], "ts": [1], "f": [1.0]}), "user", "ts",
                             ["f"]) is None  # fmt: skip


def test_finish_input_emits_every_open_session_and_window_and_keeps_them_stored():
    """The end of a bounded input: every open session (final mode) and pending
    window is emitted once, stream time stays, the state stays stored, and update
    mode (which emitted every change already) emits nothing more."""

    def rows(updates):
        return sorted((u.key, u.start, u.end, u.value["n"]) for u in updates)

    store = InMemorySessionStore("s", 100)
    agg = SessionWindowAggregator(store, SessionWindows(5), aggregations={"n": "count"},
                                  emit="final")  # fmt: skip
    closed = agg.process_rows(["a", "b", "a", "a"], [1, 2, 3, 20], [None] * 4)
    assert rows(closed) == [("a", 1, 3, 2), ("b", 2, 2, 1)]  # stream time 20 closed them
    assert rows(agg.finish_input()) == [("a", 20, 20, 1)]  # nothing else would
    assert agg.stream_time == 20 and len(list(store.fetch_range(None, None))) == 3
    assert agg.finish_input() == []  # once
    update = SessionWindowAggregator(InMemorySessionStore("u", 100), SessionWindows(5),
                                     aggregations={"n": "count"})  # fmt: skip
    update.process_rows(["a"], [1], [None])
    assert update.finish_input() == []

    with tempfile.TemporaryDirectory() as tmp, StateDB.open(tmp) as db:
        windows = WindowAggregator(db.window_store("w", 10, window_size_ms=10), TimeWindows(10),
                                   aggregations={"n": "count"}, emit="final")  # fmt: skip
        fired = windows.process_rows(["a", "a", "b"], [1, 12, 25], [None] * 3)
        assert [(u.key, u.start) for u in fired] == [("a", 0), ("a", 10)]
        rest = windows.finish_input()
        assert [(u.key, u.start, u.end, u.value, u.kind) for u in rest] == [
            ("b", 20, 30, {"n": 1}, "final")
        ]
        assert windows.stream_time == 25 and windows.finish_input() == []


@pytest.mark.parametrize("track_offsets", [False, True])
def test_sessions_closed_as_columns_equal_the_updates(track_offsets):
    """``advance_columns``/``finish_input_columns`` give the sessions and results
    ``advance_to``/``finish_input`` give, in the same order (offsets tracked or
    not); they need built-in aggregations."""
    rng = random.Random(7)
    rows = sorted(
        ((rng.choice("abcd"), rng.randrange(200), {"x": rng.choice([None, 1, 2.5, -4]),
          "s": rng.choice([None, "a", "b", "c"])}) for _ in range(120)),
        key=lambda r: r[1],
    )  # fmt: skip

    def run(columns):
        agg = SessionWindowAggregator(
            InMemorySessionStore("s", 20), SessionWindows(6, 3), aggregations=EVERY,
            emit="final", closes_on="advance", track_offsets=track_offsets,
        )  # fmt: skip
        out = []
        for n in range(4):
            part = rows[n * 30 : (n + 1) * 30]
            offsets = list(range(n * 30, n * 30 + len(part))) if track_offsets else None
            agg.process_rows([r[0] for r in part], [r[1] for r in part], [r[2] for r in part],
                             offsets)  # fmt: skip
            if columns:
                out.append(closed_rows(agg.advance_columns(agg.stream_time)))
            else:
                out.append([tuple(u[:4]) for u in agg.advance_to(agg.stream_time)])
        closed = agg.finish_input_columns() if columns else agg.finish_input()
        out.append(closed_rows(closed) if columns else [tuple(u[:4]) for u in closed])
        return out

    want = run(False)
    assert sum(map(len, want)) > 20 and run(True) == want
    custom = SessionWindowAggregator(
        InMemorySessionStore("c", 20), SessionWindows(6), initializer=lambda: 0,
        aggregator=lambda k, v, acc: acc + 1, merger=lambda k, a, b: a + b, emit="final",
    )  # fmt: skip
    custom.process("a", None, 1)
    with pytest.raises(TypeError, match="need built-in aggregations"):
        custom.advance_columns(100)
    assert [tuple(u) for u in custom.advance_to(100)] == [("a", 1, 1, 1, 1)]  # nothing lost


@pytest.mark.parametrize("as_columns", [False, True])
def test_a_result_that_fails_at_an_advance_closes_nothing(as_columns):
    """A decimal sum past its type (Spark's ANSI error) raised while an advance
    emits: the advance is undone, so the session is still open and stored, and the
    next advance meets it again instead of losing it."""
    big = Decimal(10**38 - 1)
    aggs = Aggregations({"s": ("sum", "x")}, types={"x": "decimal(38,0)"})
    with tempfile.TemporaryDirectory() as tmp, StateDB.open(tmp) as db:
        store = db.session_store("s", 10)
        agg = SessionWindowAggregator(store, SessionWindows(5), aggregations=aggs,
                                      emit="final", closes_on="advance")  # fmt: skip
        agg.process_rows(["a", "a"], [1, 2], [{"x": big}, {"x": big}])
        advance = agg.advance_columns if as_columns else agg.advance_to
        for _ in range(2):
            with pytest.raises(ArithmeticError):
                advance(100)
            assert [w for w, _ in store.fetch_range(None, None)] != []
            assert agg.state.emitted_close is None
