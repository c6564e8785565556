"""Every aggregate function of ``sessionize`` and ``window_aggregate`` against Spark's
own ``session_window`` / ``window`` + ``agg`` on the same events: a batch DataFrame
(every session and window emitted) and a streaming query (with a late row and a
merge of three sessions), with nulls and time ties."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC
from decimal import Decimal

import pytest

from spark_integration import SessionAggregation, StateBackend, sessionize, window_aggregate
from tests.spark.streams import json_source, write_json
from tests.spark.suite_a_streams import Streams, flat, run_together

pytestmark = pytest.mark.slow

GAP_MS = 10_000
SIZE_MS = 20_000
SCHEMA = (
    "user string, ts long, amount long, price double, page string, at long, cost decimal(10,2), "
    "big decimal(38,18)"
)
RSD = 0.05

#: Every function, as sessionize spells it.
OURS = {
    "n": "count",
    "c": ("count", "amount"),
    "s": ("sum", "amount"),
    "sp": ("sum", "price"),
    "sc": ("sum", "cost"),
    "avg": ("avg", "amount"),
    "mean": ("mean", "price"),
    "cd": ("count_distinct", "page"),
    "acd": ("approx_count_distinct", "page"),
    "acd2": ("approx_count_distinct", "page", 0.1),
    "sd": ("stddev", "price"),
    "sds": ("stddev_samp", "price"),
    "sdp": ("stddev_pop", "price"),
    "var": ("variance", "price"),
    "vs": ("var_samp", "price"),
    "vp": ("var_pop", "price"),
    "p50": ("percentile_approx", "amount", 0.5),
    "pq": ("percentile_approx", "price", [0.25, 0.75], 100),
    "cs": ("collect_set", "page"),
    "cl": ("collect_list", "page"),
    "minby": ("min_by", "page", "price"),
    "maxby": ("max_by", "amount", "price"),
    "minp": ("min", "page"),
    "maxt": ("max", "t2"),
    # over decimals: exact, of Spark's types (avg of decimal(38,18) is decimal(38,22))
    "ac": ("avg", "cost"),
    "ab": ("avg", "big"),
    "sb": ("sum", "big"),
    "minc": ("min", "cost"),
    "maxb": ("max", "big"),
    "clc": ("collect_list", "cost"),
    "csc": ("collect_set", "cost"),
    "cdc": ("count_distinct", "cost"),
    "minbyb": ("min_by", "big", "price"),
    "maxbyb": ("max_by", "page", "big"),
    "fc": ("first", "cost"),
    "lb": ("last", "big"),
    "sdc": ("stddev", "cost"),
    "acdc": ("approx_count_distinct", "cost"),
    "p50c": ("percentile_approx", "cost", 0.5),
}
#: The aggregates over decimal columns (their batches take the record path).
DECIMALS = {
    k for k, v in OURS.items() if isinstance(v, tuple) and any(c in ("cost", "big") for c in v[1:3])
}
#: The functions the columnar path computes (over numeric columns without a sum of
#: nulls or doubles, a decimal or a string minimum): a batch with only these takes it.
COLUMNAR = {k: v for k, v in OURS.items() if k not in {"s", "sp", "minp", *DECIMALS}}
DOUBLES = {"sp", "avg", "mean", "sd", "sds", "sdp", "var", "vs", "vp", "sdc"}
SETS = {"cs", "cl", "csc", "clc"}
#: first/last by event time: Spark's first/last follow row order, so they are
#: checked against the events (the value at the earliest / latest time).
BY_TIME = {"fc": ("cost", min), "lb": ("big", max)}
#: Spark's result types of the decimal aggregates.
DECIMAL_TYPES = {
    "ac": "decimal(14,6)", "ab": "decimal(38,22)", "sb": "decimal(38,18)",
    "minc": "decimal(10,2)", "maxb": "decimal(38,18)", "clc": "array<decimal(10,2)>",
    "csc": "array<decimal(10,2)>", "cdc": "bigint", "minbyb": "decimal(38,18)",
    "maxbyb": "string", "fc": "decimal(10,2)", "lb": "decimal(38,18)", "sdc": "double",
    "acdc": "bigint", "p50c": "decimal(10,2)", "sc": "decimal(20,2)",
}  # fmt: skip


def spark_aggs():
    """The same aggregates in Spark (count_distinct as a set's size: streaming
    refuses distinct aggregates)."""
    from pyspark.sql import functions as F

    return [
        F.count("*").alias("n"), F.count("amount").alias("c"), F.sum("amount").alias("s"),
        F.sum("price").alias("sp"), F.sum("cost").alias("sc"), F.avg("amount").alias("avg"),
        F.mean("price").alias("mean"), F.collect_set("page").alias("cd_set"),
        F.stddev("price").alias("sd"), F.stddev_samp("price").alias("sds"),
        F.stddev_pop("price").alias("sdp"), F.variance("price").alias("var"),
        F.var_samp("price").alias("vs"), F.var_pop("price").alias("vp"),
        F.percentile_approx("amount", 0.5).alias("p50"),
        F.percentile_approx("price", [0.25, 0.75], 100).alias("pq"),
        F.collect_set("page").alias("cs"), F.collect_list("page").alias("cl"),
        F.min_by("page", "price").alias("minby"), F.max_by("amount", "price").alias("maxby"),
        F.min("page").alias("minp"), F.max("t2").alias("maxt"),
        F.avg("cost").alias("ac"), F.avg("big").alias("ab"), F.sum("big").alias("sb"),
        F.min("cost").alias("minc"), F.max("big").alias("maxb"),
        F.collect_list("cost").alias("clc"), F.collect_set("cost").alias("csc"),
        F.min_by("big", "price").alias("minbyb"), F.max_by("page", "big").alias("maxbyb"),
        F.stddev("cost").alias("sdc"), F.percentile_approx("cost", 0.5).alias("p50c"),
    ]  # fmt: skip


def events(seed=5):
    """Batches of events: 4 users, 5% nulls in each value column, time ties, and
    distinct prices (min_by/max_by orderings without ties, which Spark breaks by
    arrival). Batch 1 holds three sessions of user "m" that batch 2 merges into one,
    and batch 3 a late row of "m" (behind the event time, within the 1 minute delay).
    Then an event that closes every session and window: in a stream, the batch
    without data that follows it (Spark's, and sessionstore's due batch) emits them."""
    rng = random.Random(seed)
    prices = iter(rng.sample(range(1, 100_000), 400))
    # distinct decimal(38,18) values (orderings without ties) as JSON text, 5% null,
    # from their own generator (the other columns stay as they were)
    brng = random.Random(seed + 1)
    unscaled = sorted({brng.randrange(-(10**28), 10**28) for _ in range(400)})
    brng.shuffle(unscaled)
    bigs = iter(None if brng.random() < 0.05 else str(Decimal(v).scaleb(-18)) for v in unscaled)
    pages = ["/", "/a", "/b", "/c", "/d", "/e"]

    def row(user, ts):
        def maybe(v):
            return None if rng.random() < 0.05 else v

        return {
            "user": user, "ts": ts, "amount": maybe(rng.randrange(-5, 50)),
            "price": maybe(next(prices) / 7.0), "page": maybe(rng.choice(pages)),
            "at": ts + rng.randrange(0, 5_000), "cost": maybe(rng.randrange(0, 9999) / 100),
            "big": next(bigs),
        }  # fmt: skip

    base = 1_000_000
    out = []
    first = [row("m", base), row("m", base + 2 * GAP_MS), row("m", base + 4 * GAP_MS)]
    t = base
    for _ in range(30):
        t += rng.randrange(0, 3_000)
        first.append(row(f"u{rng.randrange(3)}", t))
    first.append(row("u0", t))  # a tie in time
    first.append(row("nulls", base))
    first[-1].update(amount=None, price=None, page=None, cost=None, big=None)
    out.append(first)
    second = [row("m", base + GAP_MS), row("m", base + 3 * GAP_MS)]  # merges m's three
    for _ in range(30):
        t += rng.randrange(0, 3_000)
        second.append(row(f"u{rng.randrange(3)}", t))
    out.append(second)
    third = [row("m", base + 4 * GAP_MS + 5_000)]  # late, within the delay
    for _ in range(20):
        t += rng.randrange(0, 3_000)
        third.append(row(f"u{rng.randrange(3)}", t))
    out.append(third)
    far = t + 20 * GAP_MS
    out.append([row("zz-close", far)])
    return out


def _timed(df):
    from pyspark.sql import functions as F

    return df.withColumn("t", F.timestamp_millis("ts")).withColumn("t2", F.timestamp_millis("at"))


def _spark_rows(rows, start, end, extra_end=0):
    out = {}
    for r in rows:
        if r["user"] == "zz-close":
            continue
        d = r.asDict() if hasattr(r, "asDict") else dict(r)
        w = d.pop("w")
        ident = (d["user"], _ms(w["start"]), _ms(w["end"]) - extra_end)
        d["cd"] = len(d.pop("cd_set"))
        d["cdc"] = len(d["csc"])
        d["maxt"] = None if d["maxt"] is None else _ms(d["maxt"])
        out[ident] = d
    return out


def _our_rows(rows, start, end):
    out = {}
    for r in rows:
        d = r.asDict() if hasattr(r, "asDict") else dict(r)
        if d["user"] == "zz-close":
            continue
        ident = (d["user"], d[start], d[end])
        d["maxt"] = None if d["maxt"] is None else _ms(d["maxt"])
        out[ident] = d
    return out


def _ms(value):
    return round(value.timestamp() * 1000)


def _exact_values(evs, user, lo, hi, column):
    return sorted(
        e[column]
        for rows in evs
        for e in rows
        if e["user"] == user and lo <= e["ts"] <= hi and e[column] is not None
    )


def _check(ours, theirs, evs, inclusive_end, names=OURS):
    """Every aggregate of every session/window equal (doubles to 1e-9 relative, sets
    as sets, approx_count_distinct within 3 rsd of the exact count, percentile_approx
    within its rank bound)."""
    assert sorted(ours) == sorted(theirs)
    assert len(ours) > 8
    for ident, mine in ours.items():
        spark = theirs[ident]
        user, lo, hi = ident
        hi = hi if inclusive_end else hi - 1
        for name in names:
            a, b = mine[name], spark.get(name)
            where = f"{name} of {ident}: ours {a!r}, Spark's {b!r}"
            if name in ("acd", "acd2", "acdc"):
                exact = spark["cdc" if name == "acdc" else "cd"]
                rsd = 0.1 if name == "acd2" else RSD
                assert abs(a - exact) <= 3 * rsd * max(exact, 1), where
            elif name in BY_TIME:
                column, pick = BY_TIME[name]
                rows = [e for b_ in evs for e in b_ if e["user"] == user and lo <= e["ts"] <= hi]
                at = pick(e["ts"] for e in rows)
                held = [e[column] for e in rows if e["ts"] == at]
                assert a in {v if v is None else Decimal(str(v)) for v in held}, where
                assert a is None or a.as_tuple().exponent == (-2 if column == "cost" else -18)
            elif name in ("p50", "pq", "p50c"):
                column = {"p50": "amount", "pq": "price", "p50c": "cost"}[name]
                values = _exact_values(evs, user, lo, hi, column)
                ps = [0.25, 0.75] if name == "pq" else [0.5]
                got = a if name == "pq" else [a]
                if not values:
                    assert a is None and b is None, where
                    continue
                bound = 1.0 / (100 if name == "pq" else 10000)
                if name == "p50c":
                    assert isinstance(a, Decimal) and isinstance(b, Decimal), where
                    values = [Decimal(str(x)) for x in values]  # as the column holds them
                for p, v in zip(ps, got, strict=True):
                    rank = sum(1 for x in values if x <= v) / len(values)
                    lower = sum(1 for x in values if x < v) / len(values)
                    assert lower - bound <= p <= rank + bound, where
            elif name in SETS:
                assert sorted(a) == sorted(b), where
            elif name in DOUBLES:
                if a is None or b is None:
                    assert a is b, where
                else:
                    assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), where
            elif name in DECIMALS:  # exact: the same digits, scale included
                assert str(a) == str(b), where
            else:
                assert a == b, where
        assert mine["n"] == spark["n"]


def _sessions_builtin(df):
    from pyspark.sql import functions as F

    return df.groupBy(F.session_window("t", f"{GAP_MS // 1000} seconds").alias("w"), "user").agg(
        *spark_aggs()
    )


def _windows_builtin(df):
    from pyspark.sql import functions as F

    return df.groupBy(F.window("t", f"{SIZE_MS // 1000} seconds").alias("w"), "user").agg(
        *spark_aggs()
    )


def _ours_sessions(df, backend, name, aggregations=OURS):
    return sessionize(
        df.drop("t"), key="user", timestamp="ts", gap=f"{GAP_MS} ms", grace="1 minute",
        aggregations=aggregations, backend=backend, name=name,
    )  # fmt: skip


def _ours_windows(df, backend, name, aggregations=OURS):
    return window_aggregate(
        df.drop("t"), key="user", timestamp="ts", size=f"{SIZE_MS} ms", grace="1 minute",
        aggregations=aggregations, backend=backend, name=name,
    )  # fmt: skip


def _decimal_rows(evs):
    """The events with their decimals as ``Decimal`` (for createDataFrame)."""

    def exact(v):
        return None if v is None else Decimal(str(v))

    return [{**e, "cost": exact(e["cost"]), "big": exact(e["big"])} for b in evs for e in b]


def _check_types(ours, spark_schema):
    """Our output types of the decimal aggregates are Spark's, and are those of
    :data:`DECIMAL_TYPES`."""
    for name, expected in DECIMAL_TYPES.items():
        assert ours[name].dataType.simpleString() == expected, name
        if name in spark_schema.names:
            assert spark_schema[name].dataType.simpleString() == expected, name


def test_every_function_on_a_batch_dataframe_equals_spark(spark, tmp_path):
    """A batch DataFrame: every session and window is emitted (the last of each key
    too, which nothing after them closes), with every aggregate equal to Spark's."""
    evs = events()[:3]  # no closing events: a bounded input ends by itself
    df = _timed(spark.createDataFrame(_decimal_rows(evs), SCHEMA))
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))

    theirs = _spark_rows(_sessions_builtin(df).collect(), None, None, GAP_MS)
    built = _ours_sessions(df, backend, "s")
    _check_types(built.schema, _sessions_builtin(df).schema)
    ours = _our_rows(built.collect(), "session_start", "session_end")
    _check(ours, theirs, evs, inclusive_end=True)
    assert any(user == "m" and hi - lo >= 4 * GAP_MS for user, lo, hi in ours)  # merged
    columnar = _ours_sessions(df, backend, "sc", COLUMNAR).collect()
    _check(_our_rows(columnar, "session_start", "session_end"), theirs, evs, True, COLUMNAR)

    theirs = _spark_rows(_windows_builtin(df).collect(), None, None)
    ours = _our_rows(_ours_windows(df, backend, "w").collect(), "window_start", "window_end")
    _check(ours, theirs, evs, inclusive_end=False)
    columnar = _ours_windows(df, backend, "wc", COLUMNAR).collect()
    _check(_our_rows(columnar, "window_start", "window_end"), theirs, evs, False, COLUMNAR)


def _stream_run(spark, tmp_path, folder, build, evs):
    """``build`` over a streaming JSON source of ``evs`` (one file per micro-batch, a
    1 minute watermark), not started: the query, its checkpoint and its steps."""
    out = build(
        _timed(json_source(spark, tmp_path / folder, SCHEMA)).withWatermark("t", "1 minute")
    )
    steps = [
        (lambda i=i, rows=rows: write_json(tmp_path / folder, i, rows))
        for i, rows in enumerate(evs)
    ]
    return out, tmp_path / f"ck-{folder}", steps


def _streamed(spark, tmp_path, builds, evs):
    """The rows each of ``builds`` (by folder) gives over ``evs`` (see
    :func:`_stream_run`), the queries driven side by side, by folder."""
    runs = {
        folder: _stream_run(spark, tmp_path, folder, build, evs) for folder, build in builds.items()
    }
    return {folder: flat(batches) for folder, batches in run_together(runs).items()}


def _custom_spec():
    """A custom SessionAggregation beside built-ins reading a timestamp and decimals
    (``seen`` counts an event once if it sees the values as Spark gives them,
    datetime and Decimal, else 1000 times): the spec, and the built-ins' names."""
    from datetime import datetime

    def as_given(key, value, acc):
        typed = isinstance(value["t2"], datetime) and all(
            value[c] is None or isinstance(value[c], Decimal) for c in ("cost", "big")
        )
        return acc + (1 if typed else 1000)

    seen = SessionAggregation(lambda: 0, as_given, lambda k, a, b: a + b, "bigint")
    names = ["n", "maxt", "ac", "maxb", "maxbyb", "minc", "csc"]
    return {"seen": seen, **{k: OURS[k] for k in names}}, names


@pytest.fixture(scope="module")
def streamed(spark, tmp_path_factory):
    """The rows of each stream over :func:`events`, by folder (see :func:`_streamed`):
    Spark's sessions and windows, ours with every function, and ours with
    :func:`_custom_spec`. Shared by test_every_function_on_a_stream_equals_spark and
    test_custom_aggregations_beside_built_ins_over_times_and_decimals_in_a_stream
    (both compare with Spark's session query over the same events), and by
    test_a_restart_and_a_rescale_mid_session_keep_every_accumulator (``ours-s`` is
    its uninterrupted run), driven side by side: each stream on its own source,
    state and checkpoint, they cannot interfere."""
    tmp_path = tmp_path_factory.mktemp("streams")
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    custom = StateBackend(f"file://{tmp_path}/custom", local_dir=str(tmp_path / "l-custom"))
    spec, _ = _custom_spec()
    return _streamed(spark, tmp_path, {
        "spark-s": _sessions_builtin,
        "ours-s": lambda df: _ours_sessions(df, backend, "s"),
        "spark-w": _windows_builtin,
        "ours-w": lambda df: _ours_windows(df, backend, "w"),
        "ours-custom": lambda df: _ours_sessions(df, custom, "s", spec),
    }, events())  # fmt: skip


def test_every_function_on_a_stream_equals_spark(streamed):
    """A streaming query, one file per micro-batch, 1 minute watermark: the same
    sessions and windows as Spark's, three sessions merged by a later batch and a
    late row counted, with every aggregate equal."""
    evs = events()
    run = streamed.get

    theirs = _spark_rows(run("spark-s"), None, None, GAP_MS)
    ours = _our_rows(run("ours-s"), "session_start", "session_end")
    _check(ours, theirs, evs, inclusive_end=True)
    merged = [ident for ident in ours if ident[0] == "m"]
    assert len(merged) == 1 and ours[merged[0]]["n"] == 6  # three sessions, a bridge, a late row

    theirs = _spark_rows(run("spark-w"), None, None)
    ours = _our_rows(run("ours-w"), "window_start", "window_end")
    _check(ours, theirs, evs, inclusive_end=False)


def test_custom_aggregations_beside_built_ins(spark, tmp_path):
    """Two SessionAggregations and built-ins in one dict, on a batch DataFrame."""
    df = spark.createDataFrame(
        [("a", 1, 3), ("a", 2, None), ("a", 50_000, 4), ("b", 5, 7)], "user string, ts long, v long"
    )
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    product = SessionAggregation(
        lambda: 1, lambda k, v, acc: acc * (v["v"] or 1), lambda k, a, b: a * b, "bigint"
    )
    users = SessionAggregation(
        list, lambda k, v, acc: acc + [k], lambda k, a, b: a + b, "bigint", finish=len
    )
    out = sessionize(
        df, "user", "ts", gap="10 seconds", backend=backend,
        aggregations={"p": product, "avg": ("avg", "v"), "k": users, "n": "count"},
    ).collect()  # fmt: skip
    got = sorted((r.user, r.session_start, r.p, r.avg, r.k, r.n) for r in out)
    assert got == [("a", 1, 3, 3.0, 2, 2), ("a", 50_000, 4, 4.0, 1, 1), ("b", 5, 7, 7.0, 1, 1)]


def test_custom_aggregations_beside_built_ins_over_times_and_decimals_in_a_stream(streamed):
    """A custom SessionAggregation beside built-ins reading a timestamp and
    decimals, in a streaming query: the custom one sees the values as Spark gives
    them (datetime, Decimal), the built-ins equal Spark's (the accumulators of
    open sessions are stored between micro-batches)."""
    evs = events()
    _, names = _custom_spec()
    theirs = _spark_rows(streamed["spark-s"], None, None, GAP_MS)
    ours = _our_rows(streamed["ours-custom"], "session_start", "session_end")
    _check(ours, theirs, evs, True, names)
    assert all(row["seen"] == row["n"] for row in ours.values())


@pytest.mark.parametrize(
    "how, message",
    [
        (("avg", "nope"), "reads column 'nope'"),
        (("frobnicate", "v"), "unknown function 'frobnicate'"),
        (("min_by", "v"), "expected (fn, column, ordering column)"),
        (("percentile_approx", "v", 1.5), "percentage must be in [0, 1]"),
        (("avg", "page"), "avg needs a numeric column"),
    ],
)
def test_bad_specs_fail_when_the_operator_is_built(spark, tmp_path, how, message):
    df = spark.createDataFrame([("a", 1, 3, "/")], "user string, ts long, v long, page string")
    for build in (sessionize, window_aggregate):
        extra = {"gap": "1 second"} if build is sessionize else {"size": "1 second"}
        with pytest.raises(ValueError) as info:
            build(df, "user", "ts", aggregations={"bad": how}, **extra)
        assert "'bad'" in str(info.value) and message in str(info.value)


def test_a_restart_and_a_rescale_mid_session_keep_every_accumulator(spark, tmp_path, streamed):
    """A streaming sessionize with every function, stopped while sessions are open
    (after batch 1), restarted, stopped again (after batch 2), rescaled from 2 to 3
    partitions and continued: the same rows as an uninterrupted run (``streamed``'s
    ``ours-s``: the same operator settings, events and partition count; its input
    also declares the comparison's watermark on ``t``, a column the operator never
    sees). ``dump`` and the data source show the open sessions' aggregates by name."""
    from tests.tools.test_cli import run as cli

    evs = events()

    def run(folder, backend, n, part):
        out = sessionize(
            _timed(json_source(spark, tmp_path / folder, SCHEMA)).drop("t"), key="user",
            timestamp="ts", gap=f"{GAP_MS} ms", grace="1 minute", aggregations=OURS,
            backend=backend, name="s", num_partitions=n,
        )  # fmt: skip
        steps = [
            (lambda i=i, rows=rows: write_json(tmp_path / folder, i, rows))
            for i, rows in enumerate(evs)
            if i in part
        ]
        return out, tmp_path / f"ck-{folder}", steps

    def state(name):
        return StateBackend(f"file://{tmp_path}/{name}", local_dir=str(tmp_path / f"l-{name}"))

    streams = Streams()
    with streams:
        two = state("two")
        for part in ([0], [1]):  # then a restart of the query, sessions open
            steps = streams.start_run("got", run("b", two, 2, part))
            streams.drive({"got": steps})
            streams.stop("got")
        _check_open_sessions(spark, two)
        three = state("three")
        out = cli("repartition", two.checkpoint_uri, "--operator", "s", "--partitions", "3",
                  "--to", three.checkpoint_uri)  # fmt: skip
        assert out.returncode == 0, out.stderr
        steps = streams.start_run("got", run("b", three, 3, range(2, len(evs))))
        streams.drive({"got": steps})
    # the uninterrupted run: the same sessionize on the same events, 2 partitions
    expected, got = streamed["ours-s"], streams.rows("got")

    def canonical(rows):
        return sorted(
            str({k: sorted(v) if k in SETS and v is not None else v for k, v in r.items()})
            for r in rows
        )

    assert len(expected) > 8
    assert canonical(got) == canonical(expected)


def _check_open_sessions(spark, two):
    """``dump`` and the data source show the open sessions' aggregates by name."""
    from spark_integration.datasource import register
    from tests.tools.test_cli import run as cli

    dumped = cli("dump", two.checkpoint_uri, "--operator", "s", "--store", "sessions")
    assert dumped.returncode == 0, dumped.stderr
    rows = [json.loads(line) for line in dumped.stdout.splitlines()]
    merged = [r for r in rows if r["key"] == "m"]
    assert len(merged) == 1 and set(merged[0]["value"]) == set(OURS)
    assert merged[0]["value"]["n"] == 5 and isinstance(merged[0]["value"]["acd"], int)
    register(spark)
    source = spark.read.format("sessionstore").option("path", two.checkpoint_uri)
    shown = source.option("operator", "s").option("store", "sessions").load()
    assert set(shown.schema["value"].dataType.names) == set(OURS)


def test_a_lone_session_aggregation_keeps_its_stored_layout():
    """Alone, a SessionAggregation's accumulator is the stored value (the layout of
    checkpoints written before custom aggregates could sit beside others); beside
    another aggregate it is one slot of the list."""
    from spark_integration.planning.aggregation_specs import parse_aggregations

    double = SessionAggregation(lambda: 1, lambda k, v, a: a * 2, lambda k, a, b: a * b, "bigint")
    alone, columns, plan = parse_aggregations({"p": double}, ["v"])
    acc = alone.add("k", {"v": 1}, 0, alone.initializer())
    assert (acc, alone.finish(acc), columns, plan) == (2, {"p": 2}, ["v"], [("p", "custom", None)])
    both, _, _ = parse_aggregations({"p": double, "n": "count"}, ["v"])
    acc = both.add("k", {"v": 1}, 0, both.initializer())
    assert (acc, both.finish(acc)) == ([2, 1], {"p": 2, "n": 1})


def test_parquet_dumps_show_the_bounds_of_timestamp_operators_as_timestamps(spark, tmp_path):
    """An operator whose input time is a timestamp records so in its output plan:
    ``dump --format parquet`` writes its session and window bounds as
    timestamp[ms, UTC] columns, equal to the operator's own output; one over epoch
    milliseconds keeps int64 columns, and jsonl keeps integers either way."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from tests.tools.test_cli import run as cli

    rows = [("a", 1_000_123), ("a", 1_004_000), ("b", 2_000_000), ("a", 1_100_000)]
    longs = spark.createDataFrame(rows, "user string, ts long")
    stamped = longs.withColumn("ts", F.timestamp_millis("ts"))
    ms = pa.timestamp("ms", tz="UTC")
    for name, df, build, stored in [
        ("s", stamped, lambda df, b: sessionize(df, "user", "ts", gap="10 seconds", backend=b),
         "sessions"),
        ("w", stamped, lambda df, b: window_aggregate(df, "user", "ts", size="1 minute",
                                                       backend=b), "windows"),
        ("l", longs, lambda df, b: sessionize(df, "user", "ts", gap="10 seconds", backend=b),
         "sessions"),
    ]:  # fmt: skip
        backend = StateBackend(f"file://{tmp_path}/{name}", local_dir=str(tmp_path / f"l-{name}"))
        out = build(df, backend).collect()
        start, end = (
            ("window_start", "window_end") if name == "w" else ("session_start", "session_end")
        )
        expected = sorted((r.user, r[start], r[end]) for r in out)
        target = tmp_path / f"{name}.parquet"
        dumped = cli("dump", backend.checkpoint_uri, "--store", stored, "--format", "parquet",
                     "--output", str(target))  # fmt: skip
        assert dumped.returncode == 0, dumped.stderr
        table = pq.read_table(target)
        want = ms if name != "l" else pa.int64()
        assert table.schema.field("start").type == want and table.schema.field("end").type == want
        got = sorted(
            zip(*(table.column(c).to_pylist() for c in ("key", "start", "end")), strict=True)
        )
        # the sessions and windows the store still holds (closed ones are dropped)
        assert len(got) >= 2
        if name == "l":
            assert set(got) <= set(expected)
        else:  # the operator's bounds (naive local datetimes from collect), as instants
            instants = {(k, s.timestamp(), e.timestamp()) for k, s, e in expected}
            assert {(k, s.timestamp(), e.timestamp()) for k, s, e in got} <= instants
            assert all(s.utcoffset() == e.utcoffset() == UTC.utcoffset(None) for _, s, e in got)
        lines = cli("dump", backend.checkpoint_uri, "--store", stored)
        assert all(type(json.loads(line)["start"]) is int for line in lines.stdout.splitlines())
