"""Fewer Spark tasks than state partitions (spark_integration.planning.placement): the task
count, the split of a task's rows by state partition, and real queries whose
state and output do not depend on the number of Spark tasks."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_integration.conf.names import SHARD
from spark_integration.execution.context import TaskContext, TaskInfo
from spark_integration.execution.sharding import ShardedTask
from spark_integration.planning import placement
from spark_integration.planning.placement import task_count
from tests.spark.fakes import fake_session


def _spark(cores, tasks=None):
    return fake_session({} if tasks is None else {placement.TASKS_CONF: tasks}, cores=cores)


@pytest.mark.parametrize(
    ("cores", "partitions", "want"),
    [(2, 2, 2), (2, 1, 1), (2, 4, 2), (2, 3, 3), (2, 200, 2), (2, 50, 2), (2, 7, 7),
     (8, 200, 8), (8, 12, 12), (8, 48, 8), (8, 120, 8), (4, 36, 4), (3, 7, 7), (3, 10, 5),
     (2, 64, 2)],
)  # fmt: skip
def test_auto_task_count(cores, partitions, want):
    assert task_count(_spark(cores), partitions) == want


def test_a_given_task_count_must_divide_the_partitions():
    assert task_count(_spark(2, tasks="8"), 200) == 8
    assert task_count(_spark(2, tasks="200"), 200) == 200
    for bad in ("3", "0", "-4", "many"):
        with pytest.raises(ValueError, match=rf"spark.sessionstore.tasks .*200.*{bad!r}"):
            task_count(_spark(2, tasks=bad), 200)


def test_a_spark_task_runs_each_of_its_state_partitions_with_its_rows():
    """Spark task 1 of 4 over 12 state partitions runs partitions 1, 5 and 9, in
    that order, each once, each with exactly its rows (the routing column
    dropped), also the one that got none."""
    seen = []

    class Each:
        def run(self, batches, context):
            batches = list(batches)
            rows = pa.Table.from_batches(batches).to_pylist() if batches else []
            seen.append((context.info, rows))
            yield pa.table({"p": [context.info.partition]})

    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), (SHARD, pa.int32())])
    batches = [
        pa.record_batch([["a", "b", "c"], [1, 2, 3], [9, 1, 9]], schema=schema),
        pa.record_batch([["d"], [4], [1]], schema=schema),
        pa.record_batch([[], [], []], schema=schema),
    ]
    out = list(ShardedTask(Each(), 12, 4).run(iter(batches), TaskContext(TaskInfo(1, 6, 2, "run"))))
    assert [t.column("p").to_pylist() for t in out] == [[1], [5], [9]]
    assert [(i.partition, i.batch_id, i.attempt, i.run) for i, _ in seen] == [
        (1, 6, 2, "run"), (5, 6, 2, "run"), (9, 6, 2, "run"),
    ]  # fmt: skip
    assert [rows for _, rows in seen] == [
        [{"k": "b", "v": 2}, {"k": "d", "v": 4}],
        [],
        [{"k": "a", "v": 1}, {"k": "c", "v": 3}],
    ]


def test_a_task_numbered_beyond_the_task_count_is_refused():
    with pytest.raises(RuntimeError, match="partition 4 of its stage but the operator has 4 Spark"):
        list(ShardedTask(None, 12, 4).run(iter([]), TaskContext(TaskInfo(4, 0, 0, None))))


@pytest.mark.slow
def test_in_spark_the_routing_column_is_sparks_own_partitioning(spark):
    """``pmod(hash(keys), P)`` is the partition ``repartition(P, keys)`` gives each
    row (what the checkpoint layout and ``sessionstore repartition`` assume), so
    with T dividing P, Spark task t gets exactly partitions t mod T."""
    from pyspark.sql import functions as F

    rows = [(f"user-{i}", i % 7 - 3, "é" * (i % 3)) for i in range(500)] + [(None, 1, "")]
    df = spark.createDataFrame(rows, "k string, n int, s string")
    keys = ["k", "n", "s"]
    checked = (
        df.repartition(12, *keys)
        .withColumn("by_spark", F.spark_partition_id())
        .withColumn(SHARD, F.pmod(F.hash(*keys), F.lit(12)))
        .repartition(4, *keys)
        .withColumn("task", F.spark_partition_id())
        .collect()
    )
    assert len(checked) == 501
    assert all(r["by_spark"] == r[SHARD] for r in checked)
    assert all(r[SHARD] % 4 == r["task"] for r in checked)


@pytest.mark.slow
def test_in_spark_fewer_tasks_give_the_same_state_and_output(spark, tmp_path):
    """sessionize at 8 state partitions in 2 Spark tasks per batch and in 8: the
    same output, every key's sessions in the same state partition, and in the
    sharded run 4 databases (slabs of 2 partitions: 2 per task) committed per
    batch (including those without rows)."""
    from sessionstore.tools.reader import CheckpointSource, store_rows
    from spark_integration import StateBackend, sessionize
    from tests.spark.streams import json_source, run_stream, without_due_batches, write_json
    from tests.spark.test_sessionize import GAP_MS, SCHEMA, generated, rows_of

    # 2 files of 30 rows, then the 2 closing ones: 21 sessions of the 6 users, some
    # across the 2 files (state read back from a batch before)
    batches = generated(seed=5, batches=2, per_batch=30)

    def run(tasks: str):
        spark.conf.set(placement.TASKS_CONF, tasks)
        try:
            uri = f"file://{tmp_path}/state-{tasks}"
            with without_due_batches(spark):  # versions are the files' batches
                out = sessionize(
                    json_source(spark, tmp_path / f"in-{tasks}", SCHEMA), key="user",
                    timestamp="ts", gap=f"{GAP_MS} ms", aggregations={"n": "count"},
                    backend=StateBackend(uri, local_dir=str(tmp_path / f"local-{tasks}")),
                    name="shards", num_partitions=8,
                )  # fmt: skip
        finally:
            spark.conf.unset(placement.TASKS_CONF)
        steps = [
            (lambda i=i, rows=rows: write_json(tmp_path / f"in-{tasks}", i, rows_of(rows)))
            for i, rows in enumerate(batches)
        ]
        rows = run_stream(out, tmp_path / f"ck-{tasks}", steps)
        source = CheckpointSource(uri, {})
        keys = {p: set() for p in range(8)}
        # before the two closing batches, every user's sessions are open
        for r in store_rows(source, "shards", "sessions", version=len(batches) - 2):
            keys[r["partition"]].add(r["key"])
        keys = {p: sorted(k) for p, k in keys.items()}
        return sorted(map(sorted, (r.items() for r in rows))), keys, source

    sharded, sharded_keys, source = run("2")
    plain, plain_keys, _ = run("8")
    assert sharded == plain and len(sharded) > 5
    assert sharded_keys == plain_keys and sum(map(len, plain_keys.values())) == 6
    metrics = source.batch_metrics("shards")
    assert [m["partitions"] for m in metrics] == [4] * len(batches)
    assert source.layout("shards") == (4, 8)
