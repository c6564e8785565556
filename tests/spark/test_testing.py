"""ProcessorTester: a StatefulProcessor run on rows without a Spark job, with the
times a test sets, its state and timers shown; and the same output as the
streaming operator on the same batches."""

from __future__ import annotations

import pandas as pd
import pytest
from pyspark.sql import Row

from spark_integration.testing import ProcessorTester
from tests.spark.processors import (
    OUT_SCHEMA,
    PARITY_SCHEMA,
    TIMER_SCHEMA,
    PandasTracker,
    RowDeletedState,
    RowExpiry,
    RowNestedValue,
    RowTracker,
    RowTrackerTTL,
)


def test_rows_state_and_output_batch_by_batch():
    with ProcessorTester(RowTracker(), OUT_SCHEMA, key="id") as tester:
        out = tester.run([{"id": "a", "item": "x"}, {"id": "b", "item": "y"},
                          {"id": "a", "item": "z"}])  # fmt: skip
        assert sorted(out) == [
            Row(id="a", total=2, distinct_items=2, recent="x,z"),
            Row(id="b", total=1, distinct_items=1, recent="y"),
        ]
        assert tester.state("a") == {
            "count": {"value": [2], "expires_ms": None},
            "seen": [
                {"key": ["x"], "value": [0], "expires_ms": None},
                {"key": ["z"], "value": [1], "expires_ms": None},
            ],
            "recent": [{"value": ["x"], "expires_ms": None}, {"value": ["z"], "expires_ms": None}],
        }
        out = tester.run([Row(id="a", item="x"), Row(id="a", item="w")])
        # a key's rows come in the operator's deterministic order (sorted), as in the job
        assert out == [Row(id="a", total=4, distinct_items=3, recent="z,w,x")]
        assert tester.state("a")["count"]["value"] == [4]
        assert tester.state("b")["count"]["value"] == [1]  # untouched by batch 2
        assert tester.state("nobody") == {} and tester.version == 2


def test_event_time_timers_fire_at_the_watermark_the_test_sets():
    with ProcessorTester(RowExpiry(), TIMER_SCHEMA, time_mode="EventTime", key="id") as tester:
        assert tester.run([{"id": "a", "ts": 100}, {"id": "a", "ts": 250}]) == []
        assert tester.timers("a") == [260]  # latest event + 10
        assert tester.state("a") == {"events": {"value": [2], "expires_ms": None}}
        tester.set_watermark(259)
        assert tester.run() == []  # not due yet
        tester.set_watermark(260)  # due at or before the watermark, as in Spark 4.3
        assert tester.run() == [Row(id="a", events=2, fired_at=260)]
        assert tester.timers("a") == [] and tester.state("a") == {}
        with pytest.raises(ValueError, match="forward only"):
            tester.set_watermark(100)


def test_ttl_expires_by_the_clock_the_test_sets():
    tester = ProcessorTester(RowTrackerTTL(), OUT_SCHEMA, time_mode="ProcessingTime", key="id")
    try:
        tester.set_processing_time(1_000)
        tester.run([{"id": "a", "item": "x"}])
        assert tester.state("a")["seen"] == [
            {"key": ["x"], "value": [0], "expires_ms": 1_000 + 3_600_000}
        ]
        tester.advance_processing_time(3_599_999)  # not expired yet
        tester.run()
        assert len(tester.state("a")["seen"]) == 1
        tester.advance_processing_time(1)  # the expiry time reached: expired
        tester.run()
        assert "seen" not in tester.state("a")  # expired: the variable is gone
        assert tester.state("a")["count"]["value"] == [1]  # no TTL
    finally:
        tester.close()


def test_pandas_processor_and_initial_state():
    with ProcessorTester(PandasTracker(), OUT_SCHEMA, key="id", api="pandas") as tester:
        out = tester.run(
            pd.DataFrame({"id": ["a", "a"], "item": ["x", "y"]}),
            initial_state=[{"id": "a", "start": 10}, {"id": "c", "start": 5}],
        )
        assert out.to_dict("records") == [
            {"id": "a", "total": 12, "distinct_items": 2, "recent": "x,y"}
        ]
        assert tester.state("c")["count"]["value"] == [5]  # initial state only
        with pytest.raises(ValueError, match="first batch only"):
            tester.run(initial_state=[{"id": "a", "start": 1}])


def test_bad_use_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="api must be"):
        ProcessorTester(RowTracker(), OUT_SCHEMA, key="id", api="arrow")
    with ProcessorTester(RowTracker(), OUT_SCHEMA, key="id") as tester:
        with pytest.raises(ValueError, match="needs time_mode"):
            tester.set_processing_time(5)
        with pytest.raises(ValueError, match="no key column 'id'"):
            tester.run([{"user": "a", "item": "x"}])
        assert tester.version == 0  # nothing committed


@pytest.mark.slow
def test_same_output_as_the_streaming_operator(spark, tmp_path):
    from spark_integration import StateBackend, transform_with_state
    from tests.spark.streams import json_source, run_stream, write_json

    batches = [
        [{"id": "a", "item": "x"}, {"id": "b", "item": "y"}, {"id": "a", "item": "z"}],
        [{"id": "a", "item": "x"}, {"id": "c", "item": "q"}],
        [{"id": "b", "item": "y"}, {"id": "b", "item": "v"}, {"id": "a", "item": "u"}],
    ]
    source = tmp_path / "in"
    df = json_source(spark, source, "id string, item string")
    out = transform_with_state(
        df, "id", RowTracker(), OUT_SCHEMA,
        backend=StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local")),
        name="tracker",
    )  # fmt: skip
    steps = [lambda i=i, rows=rows: write_json(source, i, rows) for i, rows in enumerate(batches)]
    streamed = sorted(tuple(r[k] for k in ("id", "total", "distinct_items", "recent"))
                      for r in run_stream(out, tmp_path / "ckpt", steps))  # fmt: skip
    with ProcessorTester(RowTracker(), OUT_SCHEMA, key="id") as tester:
        tested = sorted(tuple(r) for rows in batches for r in tester.run(rows))
    assert tested == streamed
    assert len(tested) == 6 and ("a", 4, 3, "z,x,u") in tested


#: Two processors whose output depends on how the task builds the handle: a
#: variable ``deleteIfExists`` removed refuses calls with PySpark's
#: ``PySparkRuntimeError``, and a nested struct is read back as a ``Row``.
HANDLE_DEPENDENT = [
    (RowDeletedState, [[("a", "x")], [("a", "y"), ("b", "y")]]),
    (RowNestedValue, [[("a", "x"), ("a", "z")], [("a", "y"), ("b", "y")], [("b", "q")]]),
]


def _tested(cls, batches):
    with ProcessorTester(cls(), PARITY_SCHEMA, key="id") as tester:
        return [
            sorted(tuple(r) for r in tester.run([{"id": k, "item": i} for k, i in rows]))
            for rows in batches
        ]


def test_the_tester_builds_the_handle_as_the_task_does():
    deleted = _tested(*HANDLE_DEPENDENT[0])
    assert ("a", "value.exists: PySparkRuntimeError: Error checking value state exists", 0) in (
        deleted[0]
    )
    assert ("b", "count", 1) in deleted[1]
    assert _tested(*HANDLE_DEPENDENT[1]) == [
        [("a", "none", 0)],
        [("a", "Row z", 2), ("b", "none", 0)],
        [("b", "Row y", 1)],
    ]


@pytest.mark.slow
@pytest.mark.parametrize("cls, batches", HANDLE_DEPENDENT, ids=["deleted", "nested"])
def test_the_tester_behaves_as_spark_and_our_query(spark, tmp_path, cls, batches):
    """The tester, Spark's ``transformWithState`` and ``transform_with_state`` give
    the same rows batch by batch for processors that depend on the handle's build."""
    from spark_integration import StateBackend, transform_with_state
    from tests.spark.streams import json_source, run_stream_batches, write_json

    provider = "spark.sql.streaming.stateStore.providerClass"
    saved = spark.conf.get(provider, None)
    spark.conf.set(
        provider, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    )

    def run(tag, make):
        source = tmp_path / f"in-{tag}"
        df = json_source(spark, source, "id string, item string")
        steps = [
            lambda i=i, rows=rows: write_json(source, i, [{"id": k, "item": x} for k, x in rows])
            for i, rows in enumerate(batches)
        ]
        out = run_stream_batches(make(df), tmp_path / f"ck-{tag}", steps, "update")
        return [sorted(tuple(r.values()) for r in rows) for rows in out if rows]

    try:
        sparks = run("spark", lambda df: df.groupBy("id").transformWithState(
            statefulProcessor=cls(), outputStructType=PARITY_SCHEMA, outputMode="Update",
            timeMode="None",
        ))  # fmt: skip
    finally:
        if saved is None:
            spark.conf.unset(provider)
        else:
            spark.conf.set(provider, saved)
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    ours = run("ours", lambda df: transform_with_state(
        df, "id", cls(), PARITY_SCHEMA, backend=backend, num_partitions=2,
    ))  # fmt: skip
    assert _tested(cls, batches) == sparks == ours
