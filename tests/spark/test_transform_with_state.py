"""transform_with_state(_in_pandas) on real Spark: the same StatefulProcessor
classes give the same output under Spark's transformWithState(InPandas) and ours."""

from __future__ import annotations

import pytest

from spark_integration import StateBackend, transform_with_state, transform_with_state_in_pandas
from tests.faults import FailOnceAfterCommit
from tests.spark import processors as P
from tests.spark.streams import json_source, write_json

pytestmark = pytest.mark.slow

SCHEMA = "id string, item string, ts long"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"


@pytest.fixture(autouse=True)
def rocksdb_provider(spark):
    """Spark's transformWithState runs only on its RocksDB provider."""
    before = spark.conf.get(PROVIDER)
    spark.conf.set(
        PROVIDER, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    )
    yield
    spark.conf.set(PROVIDER, before)


def _run(out, checkpoint, steps, mode="update"):
    rows = []
    query = (
        out.writeStream.outputMode(mode)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(lambda b, _: rows.extend(tuple(r) for r in b.collect()))
        .start()
    )
    try:
        for step in steps:
            step()
            query.processAllAvailable()
    finally:
        query.stop()
    return rows


def _sparks(df, api, processor, schema, time_mode="None", initial=None):
    grouped = df.groupBy("id")
    method = grouped.transformWithStateInPandas if api == "pandas" else grouped.transformWithState
    kwargs = {"initialState": initial.groupBy("id")} if initial is not None else {}
    return method(
        statefulProcessor=processor,
        outputStructType=schema,
        outputMode="Update",
        timeMode=time_mode,
        **kwargs,
    )


def _ours(df, api, processor, schema, backend, time_mode="None", initial=None, n=3):
    run = transform_with_state_in_pandas if api == "pandas" else transform_with_state
    return run(
        df, "id", processor, schema, time_mode=time_mode, backend=backend, num_partitions=n,
        initial_state=initial,
    )  # fmt: skip


BATCHES = [
    [{"id": k, "item": i, "ts": 0} for k, i in [("a", "x"), ("a", "y"), ("b", "x"), ("c", "z")]],
    [{"id": k, "item": i, "ts": 0} for k, i in [("a", "x"), ("b", "w"), ("b", "w"), ("d", "q")]],
    [{"id": k, "item": i, "ts": 0} for k, i in [("a", "z"), ("c", "z"), ("d", "r"), ("e", "e")]],
]


@pytest.mark.parametrize("api", ["pandas", "rows"])
def test_value_list_map_state_and_initial_state_match_spark(spark, tmp_path, api):
    tracker = P.PandasTracker() if api == "pandas" else P.RowTracker()
    initial = spark.createDataFrame([("a", 100), ("e", 7), ("z", 1)], "id string, start long")

    def run(tag, make):
        src = tmp_path / f"in-{tag}"
        df = json_source(spark, src, SCHEMA)
        steps = [lambda i=i, b=b: write_json(src, i, b) for i, b in enumerate(BATCHES)]
        return _run(make(df), tmp_path / f"ck-{tag}", steps)

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    theirs = run("spark", lambda df: _sparks(df, api, tracker, P.OUT_SCHEMA, initial=initial))
    ours = run("ours", lambda df: _ours(df, api, tracker, P.OUT_SCHEMA, backend, initial=initial))
    assert sorted(ours) == sorted(theirs)
    assert ("a", 102, 2, "x,y") in ours  # the initial state seeded a's count
    assert len(ours) == 10
