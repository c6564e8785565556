"""window_aggregate on real Spark: tumbling and hopping windows equal a brute force."""

from __future__ import annotations

import random

import pytest

from spark_integration import StateBackend, window_aggregate
from tests.spark.suite_a_streams import Streams, flat
from tests.spark.test_sessionize import fed

pytestmark = pytest.mark.slow


SIZE = 10_000


def events():
    rng = random.Random(9)
    batches, t = [], 0
    for _ in range(4):
        rows = []
        for _ in range(30):
            t += rng.randrange(0, 1_500)
            rows.append((f"u{rng.randrange(4)}", t - rng.randrange(0, 1_000), rng.randrange(1, 9)))
        batches.append(rows)
    far = t + 100_000
    return batches + [[("zz", far, 0)], [("zz", far + 1, 0)]]


def brute_force(batches, advance):
    """``(user, start, end, n, spent)`` of every window, from the raw events."""
    step = advance or SIZE
    expected: dict = {}
    for user, ts, amount in (r for b in batches for r in b if r[0] != "zz"):
        first = (ts - SIZE) // step * step + step
        for start in range(first, ts // step * step + 1, step):
            n, spent = expected.get((user, start), (0, 0))
            expected[(user, start)] = (n + 1, spent + amount)
    return sorted(
        (user, start, start + SIZE, n, spent) for (user, start), (n, spent) in expected.items()
    )


def prepared(spark, tmp_path, batches, advance, emit):
    """Count and sum of amount per window over ``batches`` (tumbling without an
    ``advance``), not started (see :func:`tests.spark.test_sessionize.fed`)."""
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))

    def build(stream):
        return window_aggregate(
            stream, key="user", timestamp="ts", size=f"{SIZE} ms",
            advance=None if advance is None else f"{advance} ms", grace="2 seconds",
            aggregations={"n": "count", "spent": ("sum", "amount")}, emit=emit, backend=backend,
        )  # fmt: skip

    return fed(spark, tmp_path / "in", tmp_path / "ck", batches, build)


#: (advance, emit) of each streaming case: tumbling and hopping final windows, and
#: hopping windows in update mode.
CASES = [(None, "final"), (5_000, "final"), (5_000, "update")]


@pytest.fixture(scope="module")
def window_runs(spark, tmp_path_factory):
    """The rows of each micro-batch of every case of :data:`CASES`, by case: the
    streams of test_final_windows_equal_a_brute_force and
    test_update_mode_emits_one_row_per_changed_window_per_batch, driven side by side
    (each case on its own source folder, state and checkpoint: they cannot
    interfere)."""
    with Streams() as streams:
        steps = {}
        for advance, emit in CASES:
            folder = tmp_path_factory.mktemp(f"windows-{advance}-{emit}")
            mode = "update" if emit == "update" else "append"
            run = prepared(spark, folder, events(), advance, emit)
            steps[(advance, emit)] = streams.start_run((advance, emit), run, mode)
        streams.drive(steps)
    return {case: streams.batches(case) for case in CASES}


@pytest.mark.parametrize("advance", [None, 5_000])
def test_final_windows_equal_a_brute_force(window_runs, advance):
    batches = events()
    rows = flat(window_runs[(advance, "final")])
    got = sorted(
        (r["user"], r["window_start"], r["window_end"], r["n"], r["spent"], r["emission"])
        for r in rows
        if r["user"] != "zz"
    )
    assert got == [(*w, "final") for w in brute_force(batches, advance)]


def test_update_mode_emits_one_row_per_changed_window_per_batch(window_runs):
    """Update mode: each micro-batch has at most one row per window, and the rows
    applied in any order build the brute-force windows."""
    batches = events()
    per_batch = window_runs[(5_000, "update")]
    rng = random.Random(2)
    table: dict = {}
    for rows in per_batch:
        idents = [(r["user"], r["window_start"], r["window_end"]) for r in rows]
        assert len(set(idents)) == len(idents)
        assert {r["emission"] for r in rows} <= {"update"}
        rows = list(rows)
        rng.shuffle(rows)
        for r in rows:
            table[(r["user"], r["window_start"], r["window_end"])] = (r["n"], r["spent"])
    got = sorted((*ident, *value) for ident, value in table.items() if ident[0] != "zz")
    assert got == brute_force(batches, 5_000)
    assert sum(map(len, per_batch)) < sum(map(len, batches))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"emit": "soon"}, "emit must be 'update', 'final' or 'on_time', got 'soon'"),
        ({"emit": "update", "early_every": "1 second"}, "early_every_ms needs emit="),
    ],
)
def test_bad_emission_settings_are_refused_on_the_driver(
    spark, tmp_path, monkeypatch, settings, message
):
    import importlib

    resolved = []

    def resolve(*args, **kwargs):
        resolved.append(args)
        raise AssertionError("the operator was planned before its settings were checked")

    # the modules (the package's ``window_aggregate`` is the function), wherever
    # the planning calls it
    for name in ("spark_integration.planning.aggregation_specs", "spark_integration.operators.window_aggregate"):
        module = importlib.import_module(name)
        monkeypatch.setattr(module, "resolve", resolve, raising=False)
    df = spark.createDataFrame([("u", 1, 1)], "user string, ts long, amount int")
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    with pytest.raises(ValueError, match=message):
        window_aggregate(df, key="user", timestamp="ts", size="10 seconds", backend=backend,
                         **settings)  # fmt: skip
    # refused before the checkpoint is read or a coordinator registers the operator
    assert resolved == [] and not (tmp_path / "state").exists()
