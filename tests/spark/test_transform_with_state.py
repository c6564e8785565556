"""transform_with_state(_in_pandas) on real Spark: the same StatefulProcessor
classes give the same output under Spark's transformWithState(InPandas) and ours."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor

from spark_integration import StateBackend, transform_with_state, transform_with_state_in_pandas
from tests.faults import FailOnceAfterCommit
from tests.spark import processors as P
from tests.spark.streams import json_source, spark_confs, write_json

pytestmark = pytest.mark.slow

SCHEMA = "id string, item string, ts long"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
SHUFFLE = "spark.sql.shuffle.partitions"


@pytest.fixture(autouse=True)
def rocksdb_provider(spark):
    """Spark's transformWithState runs only on its RocksDB provider."""
    before = spark.conf.get(PROVIDER)
    spark.conf.set(
        PROVIDER, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    )
    yield
    spark.conf.set(PROVIDER, before)


def _run(out, checkpoint, steps, mode="update", endless=False, after=2):
    """Run each step and let the query process it; ``endless`` for Spark's
    ProcessingTime mode, whose query always runs another batch, so that
    ``processAllAvailable`` never returns: wait until the step's file is processed,
    and after the last step for ``after`` more batches (the ones without data that
    fire timers). An earlier step's later batches run while the next file is
    awaited: the query is stopped only after the last step's ``after``."""
    rows = []
    query = (
        out.writeStream.outputMode(mode)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(lambda b, _: rows.extend(tuple(r) for r in b.collect()))
        .start()
    )
    try:
        for i, step in enumerate(steps):
            step()
            if endless:
                _await_file(query, i, after=after if i == len(steps) - 1 else 0)
            else:
                query.processAllAvailable()
    finally:
        query.stop()
    return rows


def _await_file(query, index, after=2, timeout=120):
    """Wait until the batch that took file ``index`` and ``after`` more are done."""
    deadline = time.monotonic() + timeout
    done_at = None
    while time.monotonic() < deadline:
        progress = query.lastProgress
        if progress is not None:
            end = progress["sources"][0]["endOffset"]  # JSON text
            end = json.loads(end) if isinstance(end, str) else end
            if done_at is None and end and end.get("logOffset", -1) >= index:
                done_at = progress["batchId"]
            if done_at is not None and progress["batchId"] >= done_at + after:
                return
        time.sleep(0.1)
    raise AssertionError(f"the query did not process file {index} in {timeout} s")


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
def test_value_list_map_state_and_initial_state_match_spark(
    spark, tmp_path, one_shuffle_partition, api
):
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
    # the initial state went to the checkpoint, one object per partition with rows
    # and one saying the copy is whole (the tasks' closure carries its token only)
    [token] = (tmp_path / "state" / "transform_with_state" / "initial_state").iterdir()
    where = _partitions(spark, ["a", "e", "z"], 3)
    assert sorted(f.name for f in token.iterdir()) == sorted(
        {str(p) for p in where.values()} | {"complete"}
    )


def _partitions(spark, keys, n):
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(k,) for k in keys], "id string").repartition(n, "id")
    return {r.id: r.p for r in df.withColumn("p", F.spark_partition_id()).collect()}


@pytest.mark.parametrize("api", ["pandas", "rows"])
def test_event_time_timers_fire_in_a_partition_without_data_as_in_spark(spark, tmp_path, api):
    from pyspark.sql import functions as F

    where = _partitions(spark, "abcdefghijkl", 3)
    busy = "c"
    late = next(k for k in where if where[k] == where[busy] and k != busy)
    idle = [k for k in where if where[k] != where[busy]][:2]
    batches = [
        [{"id": idle[0], "item": "x", "ts": 1000}, {"id": idle[1], "item": "y", "ts": 1000}],
        [{"id": busy, "item": "z", "ts": 5000}],
        [{"id": busy, "item": "z", "ts": 6000}, {"id": late, "item": "l", "ts": 500}],
        [{"id": busy, "item": "z", "ts": 7000}],
    ]
    processor = P.PandasExpiry() if api == "pandas" else P.RowExpiry()

    def run(tag, make):
        src = tmp_path / f"in-{tag}"
        df = json_source(spark, src, SCHEMA)
        df = df.withColumn("event", F.timestamp_millis("ts")).withWatermark("event", "0 seconds")
        steps = [lambda i=i, b=b: write_json(src, i, b) for i, b in enumerate(batches)]
        return _run(make(df), tmp_path / f"ck-{tag}", steps)

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    schema = P.TIMER_SCHEMA
    theirs = run("spark", lambda df: _sparks(df, api, processor, schema, "EventTime"))
    ours = run("ours", lambda df: _ours(df, api, processor, schema, backend, "EventTime"))
    # the idle keys' partition got no rows after batch 0; their timers fired anyway,
    # and the late row was dropped in both
    assert sorted(ours) == sorted(theirs) == sorted((k, 1, 1010) for k in idle)


@pytest.fixture
def one_shuffle_partition(spark):
    """Spark's operator on one partition (ours set their own count): for a claim
    about each key's output, whatever partition it lands in; every partition costs
    Spark's query a task, a Python worker and a RocksDB commit per micro-batch."""
    with spark_confs(spark, {SHUFFLE: "1"}):
        yield


@pytest.mark.parametrize("api", ["rows"])
def test_processing_time_timers_and_ttl_match_spark(spark, tmp_path, one_shuffle_partition, api):
    """A timer at the batch's own processing time fires in that batch (Spark's
    expiry test is inclusive); a processing-time TTL of an hour keeps everything.
    The last key only moves our time on (Spark fires its timers in no-data batches
    of its own, batch after batch: :func:`one_shuffle_partition`)."""
    batches = [
        [{"id": "p", "item": "x", "ts": 0}, {"id": "q", "item": "x", "ts": 0}],
        [{"id": "r", "item": "y", "ts": 0}, {"id": "r", "item": "y", "ts": 0}],
        [{"id": "flush", "item": "f", "ts": 0}],
    ]
    expiry = P.RowProcessingExpiry() if api == "rows" else P.PandasProcessingExpiry()
    tracker = P.RowTrackerTTL() if api == "rows" else P.PandasTrackerTTL()

    def run(tag, make):
        src = tmp_path / f"in-{tag}"
        df = json_source(spark, src, SCHEMA)
        steps = [lambda i=i, b=b: write_json(src, i, b) for i, b in enumerate(batches)]
        return _run(make(df), tmp_path / f"ck-{tag}", steps, endless=tag.startswith("spark"))

    for processor, schema in ((expiry, P.TIMER_SCHEMA), (tracker, P.OUT_SCHEMA)):
        name = type(processor).__name__
        backend = StateBackend(f"file://{tmp_path}/state-{name}", local_dir=str(tmp_path / name))

        def theirs_query(df, processor=processor, schema=schema):
            return _sparks(df, api, processor, schema, "ProcessingTime")

        def ours_query(df, processor=processor, schema=schema, backend=backend):
            return _ours(df, api, processor, schema, backend, "ProcessingTime")

        theirs = run(f"spark-{name}", theirs_query)
        ours = run(f"ours-{name}", ours_query)
        ours = [r for r in ours if r[0] != "flush"]
        theirs = [r for r in theirs if r[0] != "flush"]
        assert sorted(ours) == sorted(theirs)
    assert sorted(ours) == [("p", 1, 1, "x"), ("q", 1, 1, "x"), ("r", 2, 1, "y,y")]


def test_restart_and_retry_after_commit_give_the_uninterrupted_output(spark, tmp_path):
    def run(tag, backend, batches, first=0, ck=None):
        src = tmp_path / f"in-{tag}"
        df = json_source(spark, src, SCHEMA)
        steps = [lambda i=i, b=b: write_json(src, first + i, b) for i, b in enumerate(batches)]
        out = transform_with_state(
            df, "id", P.RowTracker(), P.OUT_SCHEMA, backend=backend, name=f"t-{ck or tag}",
            num_partitions=2,
        )  # fmt: skip
        return _run(out, tmp_path / f"ck-{ck or tag}", steps)

    def backend(local, observer=None):
        return StateBackend(
            f"file://{tmp_path}/state", local_dir=str(tmp_path / local), commit_observer=observer
        )

    # RowTracker's output over BATCHES without a stop: each key's count, distinct
    # items and last three items (a key's rows of a batch in item order)
    reference = [
        ("a", 2, 2, "x,y"), ("a", 3, 2, "x,y,x"), ("a", 4, 3, "y,x,z"),
        ("b", 1, 1, "x"), ("b", 3, 2, "x,w,w"), ("c", 1, 1, "z"), ("c", 2, 1, "z,z"),
        ("d", 1, 1, "q"), ("d", 2, 2, "q,r"), ("e", 1, 1, "e"),
    ]  # fmt: skip
    first = run("restart", backend("l2"), BATCHES[:2])
    # a new local directory: the state comes back from the checkpoint
    second = run("restart", backend("l3"), BATCHES[2:], first=2)
    assert sorted(first + second) == reference
    markers = tmp_path / "markers"
    markers.mkdir()
    for batch_id, partition in ((1, 0), (2, 1)):
        (markers / f"fail-{batch_id}-{partition}").touch()
    retried = run("retry", backend("l4", FailOnceAfterCommit(str(markers))), BATCHES)
    assert list(markers.iterdir()) == []  # both injected failures happened
    assert sorted(retried) == reference


def _failure(make):
    try:
        make()
    except Exception as e:  # the kind of error and its text are what the test compares
        return e
    raise AssertionError("no error")


@pytest.mark.parametrize(
    "processor, condition",
    [
        (P.BadStateSchema(), "Error parsing string schema"),
        (
            P.TimerWithoutTimeMode(),
            "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE",
        ),
    ],
)
def test_bad_schemas_and_misuse_fail_as_in_spark(
    spark, tmp_path, one_shuffle_partition, processor, condition
):
    def run(tag, make):
        src = tmp_path / f"in-{tag}"
        df = json_source(spark, src, SCHEMA)
        return _run(make(df), tmp_path / f"ck-{tag}", [lambda: write_json(src, 0, BATCHES[0])])

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    theirs = _failure(lambda: run("spark", lambda df: _sparks(df, "rows", processor, P.OUT_SCHEMA)))
    ours = _failure(
        lambda: run("ours", lambda df: _ours(df, "rows", processor, P.OUT_SCHEMA, backend))
    )
    if condition.startswith("Error parsing"):
        # Spark's query dies with "driver worker exited unexpectedly": its worker
        # raised PySparkRuntimeError("Error parsing string schema: "), reason lost.
        # Ours raises that error, with the parser's reason, when the operator is built
        assert "driver worker exited unexpectedly" in str(theirs)
        assert type(ours).__name__ == "PySparkRuntimeError"
        assert str(ours).startswith("Error parsing string schema: [PARSE_SYNTAX_ERROR]")
    else:  # both queries fail with Spark's error condition in their message
        assert condition in str(theirs)
        assert condition in str(ours)


def test_a_restart_keeps_the_initial_state_batch_0_ran_with_and_a_later_one_deletes_it(
    spark, tmp_path
):
    initial = spark.createDataFrame([("a", 100), ("e", 7), ("z", 1)], "id string, start long")
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    src = tmp_path / "in"
    folder = tmp_path / "state" / "transform_with_state" / "initial_state"

    def run(i):  # a new query (a new planning) on the same checkpoints, for batch i
        df = json_source(spark, src, SCHEMA)
        out = _ours(df, "rows", P.RowTracker(), P.OUT_SCHEMA, backend, initial=initial)
        return _run(out, tmp_path / "ck", [lambda: write_json(src, i, BATCHES[i])])

    def copy():
        return {str(f.relative_to(folder)): f.stat().st_mtime_ns for f in folder.rglob("*")}

    rows = run(0)
    written = copy()
    assert [n for n in written if n.endswith("/complete")]  # one whole copy
    rows += run(1)  # planned with batch 0 committed: the copy is neither rewritten nor gone
    assert copy() == written
    rows += run(2)  # planned after batch 1: gone
    assert not folder.exists() or copy() == {}
    assert sorted(rows) == [
        ("a", 102, 2, "x,y"), ("a", 103, 2, "x,y,x"), ("a", 104, 3, "y,x,z"),
        ("b", 1, 1, "x"), ("b", 3, 2, "x,w,w"), ("c", 1, 1, "z"), ("c", 2, 1, "z,z"),
        ("d", 1, 1, "q"), ("d", 2, 2, "q,r"), ("e", 8, 1, "e"),
    ]  # fmt: skip


# ------------------------------------------------------------- trust (issue 28)
class TypedKeeper(StatefulProcessor):
    """Value, list and map state of timestamps, decimals, nested structs, dates and
    nulls (row API)."""

    def init(self, handle) -> None:
        self.last = handle.getValueState(
            "last", "ts timestamp, amount decimal(10,2), place struct<city: string, zip: int>, "
            "note string",
        )  # fmt: skip
        self.history = handle.getListState("history", "ts timestamp, amount decimal(10,2)")
        self.by_day = handle.getMapState(
            "by_day", "day date", "total decimal(12,2), place struct<city: string, zip: int>"
        )

    def handleInputRows(self, key, rows, timerValues):
        for r in sorted(rows, key=lambda r: r.ts):
            self.last.update((r.ts, r.amount, (r.city, r.zip), None))
            self.history.appendValue((r.ts, r.amount))
            day = r.ts.date()
            now = self.by_day.getValue((day,))
            total = (now[0] if now is not None else Decimal("0")) + r.amount
            self.by_day.updateValue((day,), (total, (r.city, r.zip)))
        last = self.last.get()
        yield Row(
            id=key[0], last_ts=last[0], amount=last[1], city=last[2][0], zip=last[2][1],
            n=len(list(self.history.get())), days=len(list(self.by_day.keys())),
            day_total=sum((v[0] for v in self.by_day.values()), Decimal("0")), note=last[3],
        )  # fmt: skip

    def close(self) -> None:
        pass


TYPED_OUT = (
    "id string, last_ts timestamp, amount decimal(10,2), city string, zip int, n long, "
    "days long, day_total decimal(12,2), note string"
)
TYPED_IN = "id string, ts timestamp, amount decimal(10,2), city string, zip int"
TYPED_BATCHES = [
    [
        {"id": "a", "ts": "2024-01-01T10:00:00", "amount": "12.50", "city": "Paris", "zip": 75001},
        {"id": "a", "ts": "2024-01-01T11:00:00", "amount": "0.25", "city": None, "zip": None},
        {"id": "b", "ts": "2024-01-02T00:00:00", "amount": "-3.00", "city": "Oslo", "zip": 150},
    ],
    [{"id": "a", "ts": "2024-01-03T00:00:01", "amount": "1.00", "city": "Rome", "zip": 100}],
]


def test_stored_values_of_every_type_are_msgpack_and_the_output_matches_spark(
    spark, tmp_path, one_shuffle_partition
):
    """The same processor under Spark and ours gives the same output, and each
    stored value, list and map decodes with plain msgpack to the declared types'
    encodings (sessionstore.encoding.state_values): no pickle in the checkpoint."""
    import calendar
    from datetime import datetime

    import msgpack

    from sessionstore.encoding.keys import encode_key
    from sessionstore.stores.state_db import StateDB
    from sessionstore.tools.reader import CheckpointSource
    from spark_integration.operators.transform_with_state import STORE

    spark.conf.set("spark.sql.session.timeZone", "UTC")

    def run(tag, make):
        src = tmp_path / f"in-{tag}"
        df = json_source(spark, src, TYPED_IN)
        steps = [lambda i=i, b=b: write_json(src, i, b) for i, b in enumerate(TYPED_BATCHES)]
        return _run(make(df), tmp_path / f"ck-{tag}", steps)

    uri = f"file://{tmp_path}/state"
    backend = StateBackend(uri, local_dir=str(tmp_path / "local"))
    processor = TypedKeeper()
    theirs = run("spark", lambda df: _sparks(df, "rows", processor, TYPED_OUT))
    ours = run("ours", lambda df: _ours(df, "rows", processor, TYPED_OUT, backend, n=2))
    assert sorted(ours, key=repr) == sorted(theirs, key=repr) and len(ours) == 3

    def micros(text):
        return calendar.timegm(datetime.fromisoformat(text).timetuple()) * 1_000_000

    rows = {}
    source = CheckpointSource(uri)
    for partition in source.partitions("transform_with_state"):
        restored = tmp_path / f"restored-{partition}"
        with source.open("transform_with_state", partition, None, None, str(restored)):
            pass
        db = StateDB.open(str(restored / "transform_with_state" / str(partition) / "db"))
        try:
            for raw_key, raw in db.scan(f"{STORE}.kv"):
                # a list without a TTL is its bare values after the byte c1
                body, bare = (raw[1:], True) if raw[0] == 0xC1 else (raw, False)
                rows[raw_key] = (
                    bare, msgpack.unpackb(body, use_list=False, strict_map_key=False)
                )  # fmt: skip
        finally:
            db.close()
    a, b = encode_key("a"), encode_key("b")
    assert rows[a + encode_key("last")] == (False, (
        (micros("2024-01-03T00:00:01"), "1.00", ("Rome", 100), None),
        None,
    ))  # fmt: skip
    assert rows[a + encode_key("history")] == (True, (
        (micros("2024-01-01T10:00:00"), "12.50"),
        (micros("2024-01-01T11:00:00"), "0.25"),
        (micros("2024-01-03T00:00:01"), "1.00"),
    ))  # fmt: skip
    assert rows[a + encode_key("by_day")] == (False, {
        (19723,): (("12.75", (None, None)), None),  # 2024-01-01: days since 1970-01-01
        (19725,): (("1.00", ("Rome", 100)), None),
    })  # fmt: skip
    assert rows[b + encode_key("last")] == (False, (
        (micros("2024-01-02T00:00:00"), "-3.00", ("Oslo", 150), None),
        None,
    ))  # fmt: skip
    assert len(rows) == 6
