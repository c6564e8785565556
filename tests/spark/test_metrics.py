"""State metrics of a real streaming query: exact counts per micro-batch, in the
job (observed metrics, the listener's lines) and in ``sessionstore stats``."""

from __future__ import annotations

import json
import time

import pytest

from sessionstore.checkpoint.records.changelog import read_changelog_header
from sessionstore.checkpoint.records.layout import changelog_name
from sessionstore.checkpoint.records.metrics import LOAD_KINDS, summarize_batch
from sessionstore.tools.reader import CheckpointSource
from spark_integration import StateBackend, sessionize
from spark_integration.conf.names import METRICS_CONF
from spark_integration.coordinator.metrics_listener import format_line, log_state_metrics
from spark_integration.coordinator.server import driver_coordinator
from spark_integration.execution.metrics import with_state_metrics
from tests.spark.streams import json_source, without_due_batches, write_json

pytestmark = pytest.mark.slow

GAP_MS = 10


def partition_of(spark, keys, n):
    """The partition ``repartition(n, key)`` sends each key to."""
    df = spark.createDataFrame([(k,) for k in keys], "user string")
    return {r.user: r.p for r in df.selectExpr("user", f"pmod(hash(user), {n}) AS p").collect()}


@pytest.fixture
def metrics_off(spark):
    """The session's metrics setting as a fresh session has it (off), restored after."""
    spark.conf.unset(METRICS_CONF)
    yield
    spark.conf.unset(METRICS_CONF)


class _PassThrough:
    def run(self, batches, context):
        yield from batches


def test_observed_metrics_are_off_unless_the_conf_key_turns_them_on(spark, metrics_off):
    from pyspark.sql import types as T

    df = spark.createDataFrame([("a", 1)], "user string, n long")
    schema = T.StructType(
        [T.StructField("user", T.StringType(), False), T.StructField("n", T.LongType(), False)]
    )
    plain = with_state_metrics(df, _PassThrough(), schema, "off")
    # off: a plain mapInArrow, the declared schema, no metrics operator in the plan
    assert plain.schema == schema
    assert "CollectMetrics" not in plain._jdf.queryExecution().logical().toString()
    # the listener reads the coordinator: it does not add work to the operators
    listener = log_state_metrics(spark, lambda line: None)
    spark.streams.removeListener(listener)
    assert spark.conf.get(METRICS_CONF, "false") == "false"
    spark.conf.set(METRICS_CONF, "true")
    observed = with_state_metrics(df, _PassThrough(), schema, "on")
    assert "CollectMetrics" in observed._jdf.queryExecution().logical().toString()
    assert observed.columns == ["user", "n"]


def test_exact_metrics_per_batch_in_the_job_and_in_stats(spark, tmp_path, metrics_off):
    where = partition_of(spark, [f"k{i}" for i in range(20)], 2)
    a = next(k for k, p in where.items() if p == 0)  # partition 0
    b = next(k for k, p in where.items() if p == 1)  # partition 1
    batches = [
        # batch 0: two rows of a merge into one session, b starts one
        [(a, 100), (a, 105), (b, 200)],
        # batch 1: a starts a new session; partition 1 gets only one row, b's at 50,
        # behind the event time (200 after batch 0): dropped as late. a's first
        # session (ends 105 + gap) closes in this batch and is emitted
        [(a, 300), (b, 50)],
        # batch 2: a's session [300, 300] takes 303 and 306 (within the gap) and
        # becomes [300, 306]; b's session closes and is emitted; partition 1 gets
        # no row
        [(a, 306), (a, 303)],
    ]
    backend = StateBackend(str(tmp_path / "ckpt"), local_dir=str(tmp_path / "local"))
    source = tmp_path / "in"
    lines: list[str] = []
    listener = log_state_metrics(spark, lines.append)
    spark.conf.set(METRICS_CONF, "true")  # observed metrics too: both paths must agree
    with without_due_batches(spark):  # the metrics of each file's batch
        out = sessionize(
            json_source(spark, source, "user string, ts long"),
            key="user", timestamp="ts", gap=f"{GAP_MS} ms", aggregations={"n": "count"},
            backend=backend, name="metered", num_partitions=2,
        )  # fmt: skip
    emitted: list[list[dict]] = []
    query = (
        out.writeStream.outputMode("append")
        .option("checkpointLocation", str(tmp_path / "spark"))
        .foreachBatch(lambda df, _: emitted.append([r.asDict() for r in df.collect()]))
        .start()
    )
    try:
        for i, rows in enumerate(batches):
            write_json(source, i, [{"user": u, "ts": t} for u, t in rows])
            query.processAllAvailable()
        progress = [p for p in query.recentProgress if p.numInputRows]
        run = str(query.runId)
    finally:
        query.stop()
    deadline = time.monotonic() + 30
    while len(lines) < len(batches) and time.monotonic() < deadline:
        time.sleep(0.1)  # listener events reach Python asynchronously
    spark.streams.removeListener(listener)

    # the output has no metrics rows and no metrics column
    assert [[(r["user"], r["session_start"], r["n"]) for r in b] for b in emitted] == [
        [],
        [(a, 100, 2)],
        [(b, 200, 1)],
    ]
    assert set(emitted[1][0]) == {"user", "session_start", "session_end", "n"}

    observed = [p.observedMetrics["sessionstore.metered"].asDict() for p in progress]
    assert [o["batch"] for o in observed] == [0, 1, 2]
    assert [o["partitions"] for o in observed] == [2, 2, 2]
    assert [o["late_dropped"] for o in observed] == [0, 1, 0]
    assert [o["emitted"] for o in observed] == [0, 1, 1]
    # state rows: batch 0 writes a's merged session once (a batch writes its net
    # change) and b's; batch 1 adds another session of a (a closed session stays until
    # its segment expires); batch 2 extends it: the old row goes, the new one comes
    assert [o["rows_total"] for o in observed] == [2, 3, 3]
    assert [o["rows_updated"] for o in observed] == [2, 1, 1]
    assert [o["rows_removed"] for o in observed] == [0, 0, 1]
    assert [o["loads_restore"] for o in observed] == [2, 0, 0]  # then warm or reopened
    kinds = ("loads_warm", "loads_handover", "loads_replay", "loads_restore")
    assert all(sum(o[k] for k in kinds) == 2 for o in observed)
    assert [o["snapshot_lag_max"] for o in observed] == [1, 2, 3]
    assert all(o["commit_ms_max"] > 0 and o["memory_bytes_max"] > 0 for o in observed)
    # the lines come from the records the tasks reported to the driver's coordinator
    # (no request, no extra row), and they say what the observed metrics say
    coordinator = driver_coordinator()
    reported = [coordinator.batch_metrics(run, b)["metered"] for b in range(3)]
    assert [len(r) for r in reported] == [2, 2, 2]
    summaries = [summarize_batch("metered", b, r) for b, r in enumerate(reported)]
    for summary, o in zip(summaries, observed, strict=True):
        for field in ("partitions", "rows_total", "rows_updated", "rows_removed"):
            assert summary[field] == o[field], field
        assert (summary["late_dropped"], summary["emitted"]) == (o["late_dropped"], o["emitted"])
        assert summary["loads"] == {k: o[f"loads_{k}"] for k in LOAD_KINDS if o[f"loads_{k}"]}
    assert lines == [format_line("metered", summary) for summary in summaries]
    assert [line.split(":")[0] for line in lines] == [
        f"sessionstore metered batch {i}" for i in range(3)
    ]
    assert "late 1," in lines[1] and "emitted 1," in lines[1]

    # partition 1's task of batch 1, which received only the late row, recorded it
    source = CheckpointSource(str(tmp_path / "ckpt"))
    late = read_changelog_header(source.root.child("metered/1"), changelog_name(2))["metrics"]
    assert (late["late_dropped"], late["emitted"], late["rows_updated"]) == (1, 0, 0)

    # the checkpoint says the same (commit times: all but the newest batch)
    stats = source.batch_metrics("metered")
    fields = ("partitions", "rows_total", "rows_updated", "rows_removed", "late_dropped", "emitted")
    for row, o in zip(stats, observed, strict=True):
        assert {f: row[f] for f in fields} == {f: o[f] for f in fields}, json.dumps(row)
        assert row["uploaded_bytes"] == o["uploaded_bytes"]
