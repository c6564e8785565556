"""StatefulProcessor parity with Spark's transformWithState(InPandas): the same
processor class runs through Spark's operator and through ours on the same input,
and the outputs are compared micro-batch by micro-batch (the batches that emitted
rows, in order: Spark's own batches without data emit nothing here)."""

from __future__ import annotations

import shutil

import pytest

from spark_integration import StateBackend, transform_with_state, transform_with_state_in_pandas
from tests.spark import processors as P
from tests.spark.shared_runs import SharedRuns
from tests.spark.streams import json_source, run_stream_batches, spark_confs, write_json

pytestmark = pytest.mark.slow

SCHEMA = "id string, item string, ts long"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Spark's operator runs on one partition here: its output is per key, whatever
#: the partition a key lands in, and each partition costs every micro-batch a
#: task, a Python worker and a RocksDB commit. Ours keep ``num_partitions=2``.
SHUFFLE = "spark.sql.shuffle.partitions"


@pytest.fixture
def conf(spark):
    """Set Spark confs for one test (Spark's transformWithState runs only on its
    RocksDB provider; one shuffle partition, :data:`SHUFFLE`); every conf is
    restored afterwards."""
    saved = {}

    def set_(key, value):
        if key not in saved:
            saved[key] = spark.conf.get(key, None)
        spark.conf.set(key, value)

    set_(PROVIDER, ROCKSDB)
    set_(SHUFFLE, "1")
    yield set_
    for key, value in saved.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def _batches(out, checkpoint, steps, mode="update"):
    """Each step's file through the query; the rows of every micro-batch that
    emitted any, in batch order, each batch's rows sorted."""
    return [
        sorted(tuple(row.values()) for row in rows)
        for rows in run_stream_batches(out, checkpoint, steps, mode)
        if rows
    ]


def _run(spark, tmp_path, tag, batches, make, prepare=None, mode="update"):
    """``make(df)``'s output over micro-batches of ``SCHEMA`` rows (``prepare(df)``
    first), batch by batch (:func:`_batches`)."""
    src = tmp_path / f"in-{tag}"
    df = json_source(spark, src, SCHEMA)
    if prepare is not None:
        df = prepare(df)
    steps = [lambda i=i, b=b: write_json(src, i, b) for i, b in enumerate(batches)]
    return _batches(make(df), tmp_path / f"ck-{tag}", steps, mode)


def _both(spark, tmp_path, batches, theirs, ours, prepare=None, mode="update"):
    """``theirs(df)`` (Spark's operator) and ``ours(df, backend)`` over the same
    micro-batches (:func:`_run`); their outputs."""
    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    return (
        _run(spark, tmp_path, "spark", batches, theirs, prepare, mode),
        _run(spark, tmp_path, "ours", batches, lambda df: ours(df, backend), prepare, mode),
    )


def _same_processor(spark, tmp_path, batches, api, processor, schema=None, **kwargs):
    """:func:`_both` for ``processor`` in ``api`` with output ``schema``
    (``P.PARITY_SCHEMA``); ``time_mode`` and ``prepare`` as there."""
    schema = schema or P.PARITY_SCHEMA
    mode = kwargs.pop("time_mode", "None")
    return _both(
        spark, tmp_path, batches,
        lambda df: _sparks(df, api, processor, schema, mode),
        lambda df, b: _ours(df, api, processor, schema, b, mode),
        **kwargs,
    )  # fmt: skip


def _sparks(df, api, processor, schema, time_mode="None", **kwargs):
    grouped = df.groupBy("id")
    method = grouped.transformWithStateInPandas if api == "pandas" else grouped.transformWithState
    return method(
        statefulProcessor=processor,
        outputStructType=schema,
        outputMode=kwargs.pop("outputMode", "Update"),
        timeMode=time_mode,
        **kwargs,
    )


def _ours(df, api, processor, schema, backend, time_mode="None", **kwargs):
    run = transform_with_state_in_pandas if api == "pandas" else transform_with_state
    return run(df, "id", processor, schema, time_mode=time_mode, backend=backend,
               num_partitions=2, **kwargs)  # fmt: skip


def _rows(pairs, ts=0):
    return [{"id": k, "item": i, "ts": ts} for k, i in pairs]


def _event_time(df):
    from pyspark.sql import functions as F

    return df.withColumn("event", F.timestamp_millis("ts")).withWatermark("event", "10 seconds")


# ------------------------------------------------------------------ item 1
@pytest.mark.parametrize("api", ["pandas", "rows"])
def test_a_timer_due_when_registered_fires_in_the_same_batch(spark, tmp_path, conf, api):
    """A timer registered at the batch's watermark fires in that batch (Spark's
    expiry test is inclusive), after the key's rows; the batch's watermark is the
    eviction one (the event time of the batches before, minus the delay). No row
    is late here: Spark's batches without data move its watermark for late rows,
    which ours, without such batches, move a batch later (docs/operators.md)."""
    processor = P.PandasWatermarkTimer() if api == "pandas" else P.RowWatermarkTimer()
    batches = [
        [{"id": "a", "item": "x", "ts": 20_000}, {"id": "b", "item": "x", "ts": 20_000}],
        [{"id": "a", "item": "x", "ts": 12_000}],
        [{"id": "a", "item": "x", "ts": t} for t in (11_000, 13_000, 15_000)],
    ]
    theirs, ours = _same_processor(
        spark, tmp_path, batches, api, processor, time_mode="EventTime", prepare=_event_time
    )
    assert ours == theirs
    assert theirs == [
        [("a", "fired", 0), ("a", "seen", 20_000), ("b", "fired", 0), ("b", "seen", 20_000)],
        [("a", "fired", 10_000), ("a", "seen", 20_000)],
        [("a", "fired", 10_000), ("a", "seen", 20_000)],
    ]


# ------------------------------------------------------------------ item 2
def test_pandas_timestamps_arrive_as_sparks_naive_nanoseconds(spark, tmp_path, conf):
    """Spark hands a pandas processor timestamps as timezone-naive
    ``datetime64[ns]`` in the session time zone."""
    from pyspark.sql import functions as F

    conf("spark.sql.session.timeZone", "America/New_York")
    processor = P.PandasTimestamps()
    batches = [_rows([("a", "x"), ("a", "y"), ("b", "z")], ts=20_000)]

    def prepare(df):
        return df.withColumn("event", F.timestamp_millis("ts"))

    theirs, ours = _same_processor(spark, tmp_path, batches, "pandas", processor, prepare=prepare)
    assert ours == theirs
    # 20 s after the epoch, as New York's wall clock (UTC-5) reads it
    wall = 20 - 5 * 3600
    assert theirs == [[("a", "datetime64[ns]", wall)] * 2 + [("b", "datetime64[ns]", wall)]]


# ------------------------------------------------------------------ item 3
@pytest.mark.parametrize("api", ["pandas", "rows"])
def test_a_deleted_state_variable_is_refused_as_in_spark(spark, tmp_path, conf, api):
    processor = P.PandasDeletedState() if api == "pandas" else P.RowDeletedState()
    batches = [_rows([("a", "x")]), _rows([("a", "y"), ("b", "y")])]
    theirs, ours = _same_processor(spark, tmp_path, batches, api, processor)
    assert ours == theirs
    assert ("a", "value.exists: PySparkRuntimeError: Error checking value state exists", 0) in (
        theirs[0]
    )
    assert ("a", "count", 2) in theirs[1]


# ------------------------------------------------------------------ item 4
@pytest.mark.parametrize("api", ["pandas", "rows"])
def test_a_bare_string_map_key_is_taken_as_spark_takes_it(spark, tmp_path, conf, api):
    """PySpark serialises a key as a sequence: a one-character str is the key of a
    one-field schema (what processors written against Spark rely on)."""
    processor = P.PandasBareMapKey() if api == "pandas" else P.RowBareMapKey()
    batches = [_rows([("k", "a"), ("k", "b"), ("k", "a")]), _rows([("k", "b"), ("j", "b")])]
    theirs, ours = _same_processor(spark, tmp_path, batches, api, processor)
    assert ours == theirs
    assert theirs[1] == [
        ("j", "contains 'a'", 0), ("j", "contains 'b'", 1), ("j", "key ('b',)", 1),
        ("k", "contains 'a'", 1), ("k", "contains 'b'", 1),
        ("k", "key ('a',)", 2), ("k", "key ('b',)", 2),
    ]  # fmt: skip


def test_a_longer_bare_string_map_key_fails_in_both(spark, tmp_path, conf):
    """...and a longer one is as many values as characters: both refuse it."""
    processor = P.RowBareMapKey()
    batches = [_rows([("k", "ab")])]

    def failure(run):
        try:
            run()
        except Exception as e:  # the query's error and its text are what is compared
            return str(e)
        raise AssertionError("no error")

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    theirs = failure(
        lambda: _run(spark, tmp_path, "spark", batches,
                     lambda df: _sparks(df, "rows", processor, P.PARITY_SCHEMA))
    )  # fmt: skip
    ours = failure(
        lambda: _run(spark, tmp_path, "ours", batches,
                     lambda df: _ours(df, "rows", processor, P.PARITY_SCHEMA, backend))
    )  # fmt: skip
    for message in (theirs, ours):
        assert "PySparkRuntimeError: Error getting value: [STRUCT_ARRAY_LENGTH_MISMATCH]" in (
            message
        )
        assert "1 fields are required while 2 values are provided" in message


# ------------------------------------------------------------------ item 5
@pytest.mark.parametrize("api", ["pandas", "rows"])
def test_event_time_column_feeds_an_append_mode_aggregation(spark, tmp_path, conf, api):
    """The processor's output carries event time (Spark's ``eventTimeColumnName``):
    an append-mode aggregation downstream runs on its watermark."""
    from pyspark.sql import functions as F

    processor = P.PandasFirstEventTime() if api == "pandas" else P.RowFirstEventTime()
    schema = "id string, out_time timestamp"
    batches = [
        [{"id": "a", "item": "x", "ts": 10_000}, {"id": "b", "item": "x", "ts": 15_000}],
        [{"id": "a", "item": "x", "ts": 11_000}, {"id": "c", "item": "x", "ts": 25_000}],
        [{"id": "a", "item": "x", "ts": 40_000}],
    ]

    def count(out):
        return out.groupBy("out_time").count()

    def prepare(df):
        return df.withColumn("event", F.timestamp_millis("ts")).withWatermark("event", "5 seconds")

    theirs, ours = _both(
        spark, tmp_path, batches,
        lambda df: count(_sparks(df, api, processor, schema, outputMode="Append",
                                 eventTimeColumnName="out_time")),
        lambda df, b: count(_ours(df, api, processor, schema, b, event_time_column="out_time")),
        prepare=prepare, mode="append",
    )  # fmt: skip
    assert sorted(r for b in ours for r in b) == sorted(r for b in theirs for r in b)
    assert len(theirs) >= 2


# ------------------------------------------------------------------ item 7
@pytest.mark.parametrize(
    "key, value, sizes",
    [
        ("spark.sql.execution.arrow.maxRecordsPerBatch", "2", "2,2,1"),
        ("spark.sql.execution.arrow.maxBytesPerBatch", "1", "1,1,1,1,1"),
        # in the jar, but Spark 4.3's worker reads the keys above only
        ("spark.sql.execution.arrow.transformWithStateInPandas.maxRecordsPerBatch", "2", "5"),
    ],
)
def test_a_keys_rows_come_in_dataframes_of_sparks_arrow_batch_size(
    spark, tmp_path, conf, key, value, sizes
):
    conf(key, value)
    processor = P.PandasFrameSizes()
    batches = [_rows([("a", str(i)) for i in range(5)] + [("b", "x")])]
    theirs, ours = _same_processor(spark, tmp_path, batches, "pandas", processor)
    assert ours == theirs == [[("a", sizes, 5), ("b", "1", 1)]]


# ------------------------------------------------------------------ item 8
def test_int_output_for_a_decimal_field_is_coerced_when_spark_coerces(spark, tmp_path, conf):
    from decimal import Decimal

    conf("spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled", "true")
    processor = P.PandasIntForDecimal()
    schema = "id string, amount decimal(10,2)"
    batches = [_rows([("a", "x"), ("a", "y"), ("b", "z")])]
    theirs, ours = _same_processor(spark, tmp_path, batches, "pandas", processor, schema)
    assert ours == theirs == [[("a", Decimal("200.00")), ("b", Decimal("100.00"))]]


# ------------------------------------------------------------------ item 6
class NeedsSchemaRecordedEncoding(AssertionError):
    """Ours differs from Spark's on a state schema change (Spark's side held)."""


ENCODING = "spark.sql.streaming.stateStore.encodingFormat"


def _first_run(spark, where, tag, first, make):
    """``make(df, first)`` on one batch in ``where`` (source ``in-TAG``, checkpoint
    ``ck-TAG``), stopped: its batches."""
    src = where / f"in-{tag}"
    df = json_source(spark, src, SCHEMA)
    step = lambda: write_json(src, 0, _rows([("a", "x")]))  # noqa: E731
    return _batches(make(df, first), where / f"ck-{tag}", [step])


def _restart(spark, src, checkpoint, second, make):
    """``make(df, second)`` on source folder ``src``, restarted on ``checkpoint`` for
    the next batch: its batches, or the restart's error text."""
    df = json_source(spark, src, SCHEMA)
    step = lambda: write_json(src, 1, _rows([("a", "y")]))  # noqa: E731
    try:
        return _batches(make(df, second), checkpoint, [step])
    except Exception as e:  # the restart's refusal is what is compared
        return str(e)


def _backend(where):
    return StateBackend(f"file://{where}/state", local_dir=str(where / "local"))


def _first_runs(spark, where, api, first):
    """Spark's and our first run of ``first`` (:func:`_first_run`) in ``where``."""
    theirs = _first_run(spark, where, "spark", first,
                        lambda df, p: _sparks(df, api, p, P.PARITY_SCHEMA))  # fmt: skip
    backend = _backend(where)
    try:
        ours = _first_run(spark, where, "ours", first,
                          lambda df, p: _ours(df, api, p, P.PARITY_SCHEMA, backend))  # fmt: skip
    except Exception as e:
        raise NeedsSchemaRecordedEncoding(f"ours failed: {e}") from e
    return theirs, ours


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory):
    """The first runs of :func:`_versions`, once per API, first processor's class and
    confs: two restart tests whose first runs are the same run (the same processor
    class, API, batch, partition count, provider and state encoding) share it. Each
    test restarts its own copy of the run's checkpoints and of our state (a copied
    checkpoint is a checkpoint like its original: sessionstore/checkpoint/partition/
    identity.py), so no restart sees another's batch. The restart reads the run's
    own input folder (Spark's file source knows its files by path, under the
    folder it was started on), first given back the first run's file alone; the
    copy leaves out our local directory (the restart loads the state from the
    checkpoint)."""
    runs = SharedRuns(tmp_path_factory)

    def get(spark, api, first):
        key = (api, type(first).__name__, spark.conf.get(PROVIDER, None),
               spark.conf.get(ENCODING, None))  # fmt: skip
        return runs.get(key, lambda where: (where, _first_runs(spark, where, api, first)))

    return get


def _versions(spark, tmp_path, first_runs, first, second, api="rows"):
    """Spark's and our runs of ``first`` on one batch and of ``second`` restarted on
    its checkpoint for the next: each side's (first batches, restart's batches or
    error text)."""
    shared, (theirs, ours) = first_runs(spark, api, first)
    where = tmp_path / "restart"
    for name in ("ck-spark", "ck-ours", "state"):
        shutil.copytree(shared / name, where / name)
    for tag in ("spark", "ours"):  # the input as the first run left it
        (shared / f"in-{tag}" / "part-0001.json").unlink(missing_ok=True)
    backend = _backend(where)

    def sparks(df, p):
        return _sparks(df, api, p, P.PARITY_SCHEMA)

    def ours_(df, p):
        return _ours(df, api, p, P.PARITY_SCHEMA, backend)

    theirs_after = _restart(spark, shared / "in-spark", where / "ck-spark", second, sparks)
    try:
        ours_after = _restart(spark, shared / "in-ours", where / "ck-ours", second, ours_)
    except Exception as e:
        raise NeedsSchemaRecordedEncoding(f"ours failed: {e}") from e
    return (theirs, theirs_after), (ours, ours_after)


@pytest.mark.parametrize("api", ["rows", "pandas"])
def test_a_restart_with_an_evolved_state_schema_reads_the_old_state_as_spark(
    spark, tmp_path, conf, first_runs, api
):
    """Spark's Avro state encoding resolves an old value by field name: a new
    nullable field reads as None, fields may move, int widens to long."""
    conf(ENCODING, "avro")
    first, second = (
        (P.RowProfile(), P.RowProfileEvolved())
        if api == "rows"
        else (P.PandasProfile(), P.PandasProfileEvolved())
    )
    theirs, ours = _versions(spark, tmp_path, first_runs, first, second, api)
    assert theirs == (
        [[("a", "None", 2)]],
        [[("a", "(None, 'x', 1)", 3)]],
    )
    if ours != theirs:
        raise NeedsSchemaRecordedEncoding(f"ours {ours} != Spark's {theirs}")


@pytest.mark.parametrize(
    "first, second, condition",
    [
        (P.RowProfileLong(), P.RowProfileNarrowed(), "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION"),
        (P.RowProfile(), P.RowProfileNotNullable(), "TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE"),
    ],
)
def test_a_restart_with_a_state_schema_spark_refuses_fails_as_in_spark(
    spark, tmp_path, conf, first_runs, first, second, condition
):
    conf(ENCODING, "avro")
    theirs, ours = _versions(spark, tmp_path, first_runs, first, second)
    assert theirs[0] == [[("a", "None", 2)]]
    assert isinstance(theirs[1], str) and condition in theirs[1]
    if ours[0] != theirs[0] or not isinstance(ours[1], str) or condition not in ours[1]:
        raise NeedsSchemaRecordedEncoding(f"ours {ours} != Spark's {theirs}")


# ------------------------------------------------------- issue 43: composite state
COMPOSITE_BATCHES = [
    [{"id": "a", "item": "x", "ts": 0}, {"id": "a", "item": "y", "ts": 0},
     {"id": "b", "item": "q", "ts": 0}],
    [{"id": "a", "item": "z", "ts": 0}],
]  # fmt: skip


@pytest.fixture(scope="module")
def composite(spark, tmp_path_factory):
    """``P.RowComposite`` (value, list and map state with a TTL holding structs
    given as dicts, Rows and tuples; a timer per key; an initial state) through
    Spark's transformWithState and ours, once for the module's tests: each
    query's rows and checkpoint (Spark's) or state URI (ours)."""
    from tests.spark.test_transform_with_state import _run as run_endless

    tmp = tmp_path_factory.mktemp("composite")
    initial = spark.createDataFrame(
        [("a", [{"key": "seed", "value": "1"}, None])],
        "id string, tags array<struct<key: string, value: string>>",
    )

    def run(tag, make, endless):
        src = tmp / f"in-{tag}"
        df = json_source(spark, src, SCHEMA)
        steps = [lambda i=i, b=b: write_json(src, i, b) for i, b in enumerate(COMPOSITE_BATCHES)]
        # no batch without data after the last file's: RowComposite's timers never
        # fire (P.COMPOSITE_TIMER_MS) and its TTL of an hour expires nothing here
        return run_endless(make(df), tmp / f"ck-{tag}", steps, endless=endless, after=0)

    state = f"file://{tmp}/state"
    backend = StateBackend(state, local_dir=str(tmp / "local"))
    with spark_confs(spark, {PROVIDER: ROCKSDB, SHUFFLE: "1"}):
        theirs = run("spark", lambda df: df.groupBy("id").transformWithState(
            statefulProcessor=P.RowComposite(), outputStructType=P.COMPOSITE_SCHEMA,
            outputMode="Update", timeMode="ProcessingTime", initialState=initial.groupBy("id"),
        ), endless=True)  # ProcessingTime: Spark's query runs batch after batch
        ours = run("ours", lambda df: transform_with_state(
            df, "id", P.RowComposite(), P.COMPOSITE_SCHEMA, time_mode="ProcessingTime",
            backend=backend, num_partitions=2, initial_state=initial,
        ), endless=False)  # fmt: skip
    return {"theirs": theirs, "ours": ours, "spark_ck": str(tmp / "ck-spark"), "state": state}


def test_structs_given_as_dicts_rows_and_tuples_match_sparks_state_and_output(composite):
    """Issue 43 item 1: what each state kind reads back in the batch and the next,
    the initial state's dicts, and nested Rows in output rows, as in Spark."""
    theirs, ours = composite["theirs"], composite["ours"]
    assert sorted(ours) == sorted(theirs)
    by_kind = {(r[0], r[1]): r for r in theirs if r[1].startswith("after")}
    # the case: a dict in an array is a struct by field name
    assert by_kind[("b", "after profile")][2].startswith(
        "([Row(key='env', value='q'), None, Row(key=None, value='only'), Row(key='k', value='v'), "
        "Row(key='t1', value=None)], {'a': Row(n=1, note='z'), 'b': None, 'q': Row(n=2, note='w'),"
    )
    # a nested Row of an output row is read by field name
    assert by_kind[("b", "after profile")][3] == [("after", "v"), ("d", None), None]
    seeded = [r for r in theirs if r[:2] == ("a", "before profile")]
    assert "([Row(key='seed', value='1'), None], None, Row(names=None, pos=Row(x=None, y=7)))" in {
        r[2] for r in seeded
    }
    assert len(theirs) == 18


def _plain(v, pairs=False):
    """A data source or dump value in one comparable form: structs, tuples and
    lists as lists, a TTL wrapper ``{"value", "ttlExpirationMs"}`` as a pair, maps
    as sorted ``[key, value]`` pairs (``pairs``: a list that is such pairs)."""
    if isinstance(v, dict) and set(v) == {"value", "ttlExpirationMs"}:
        return [_plain(v["value"]), v["ttlExpirationMs"]]
    if isinstance(v, dict) or pairs:
        items = v.items() if isinstance(v, dict) else v
        return sorted(([_plain(k), _plain(x)] for k, x in items), key=repr)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _no_expiry(rows, column):
    """``rows`` (Rows of the reader) with every ``ttlExpirationMs`` of ``column``
    checked to be an epoch ms after 2024 and then dropped (the two queries ran at
    different times)."""
    out = []
    for r in rows:
        d = r.asDict()
        v = d[column]
        wrapped = v.values() if isinstance(v, dict) else v if isinstance(v, list) else [v]
        for w in wrapped:
            assert w.ttlExpirationMs > 1_704_067_200_000
        strip = [(w.value, None) for w in wrapped]
        d[column] = dict(zip(v, strip, strict=True)) if isinstance(v, dict) else (
            strip if isinstance(v, list) else strip[0]
        )
        d.pop("partition_id")
        out.append(d)
    return sorted(out, key=lambda d: repr(_plain(d)))


def _dumped(rows):
    """``sessionstore dump`` rows (JSON) as comparable lists, in a canonical order."""
    out = [
        [r["partition"], [r["key"]],
         *[_plain(v, c == "map_value") for c, v in r.items() if c not in ("partition", "key")]]
        for r in rows
    ]  # fmt: skip
    return sorted(out, key=repr)


def _read(rows):
    """The data source's rows as :func:`_dumped` gives the dump's."""
    out = [
        [r.partition_id, list(r.key),
         *[_plain(v) for c, v in r.asDict().items() if c not in ("partition_id", "key")]]
        for r in rows
    ]  # fmt: skip
    return sorted(out, key=repr)


def test_the_data_source_reads_processor_state_as_sparks_statestore_reader(spark, composite):
    """Issue 43 item 2: ``stateVarName`` (value, list, map state with a TTL, flattened
    or not), ``readRegisteredTimers`` and ``batchId`` give Spark's reader's schema
    and rows for the same processor, and ``sessionstore dump`` the same rows."""
    from spark_integration.datasource import register
    from tests.tools.test_cli_local import rows_of
    from tests.tools.test_cli_local import run as cli

    register(spark)

    def ours(**options):
        reader = spark.read.format("sessionstore").option("path", composite["state"])
        for k, v in {"keySchema": "id string", **options}.items():
            reader = reader.option(k, v)
        return reader.load()

    def theirs(**options):
        reader = spark.read.format("statestore")
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load(composite["spark_ck"])

    columns = {("profile", "true"): "value", ("profile", "false"): "value",
               ("events", "true"): "list_element", ("events", "false"): "list_value",
               ("pairs", "true"): "user_map_value", ("pairs", "false"): "map_value"}  # fmt: skip
    for (var, flat), column in columns.items():
        a = ours(stateVarName=var, flattenCollectionTypes=flat)
        b = theirs(stateVarName=var, flattenCollectionTypes=flat)
        assert a.schema.simpleString() == b.schema.simpleString(), (var, flat)
        rows = a.collect()
        assert _no_expiry(rows, column) == _no_expiry(b.collect(), column), (var, flat)
        # the CLI shows the same rows
        args = ["--state-var", var] + ([] if flat == "true" else ["--no-flatten"])
        dumped = rows_of(cli("dump", composite["state"], "--store", "processor", *args))
        assert _dumped(dumped) == _read(rows), (var, flat)
    timers = ours(readRegisteredTimers="true")
    spark_timers = theirs(readRegisteredTimers="true")
    assert timers.schema.simpleString() == spark_timers.schema.simpleString()
    assert sorted(timers.drop("partition_id").collect()) == sorted(
        spark_timers.drop("partition_id").collect()
    ) == [(("a",), P.COMPOSITE_TIMER_MS), (("b",), P.COMPOSITE_TIMER_MS)]
    dumped = rows_of(cli("dump", composite["state"], "--store", "processor", "--timers"))
    assert [(r["key"], r["expiration_timestamp_ms"]) for r in dumped] == [
        ("a", P.COMPOSITE_TIMER_MS), ("b", P.COMPOSITE_TIMER_MS)
    ]
    # an older version: ours counts batches done (1), Spark's names the batch (0)
    older = ours(stateVarName="profile", batchId="1").collect()
    assert _no_expiry(older, "value") == _no_expiry(
        theirs(stateVarName="profile", batchId="0").collect(), "value"
    )
    assert _no_expiry(older, "value") != _no_expiry(ours(stateVarName="profile").collect(), "value")
    with pytest.raises(Exception, match="STDS_CONFLICT_OPTIONS"):
        ours(stateVarName="profile", readRegisteredTimers="true")
    with pytest.raises(Exception, match=r"no state variable 'nope' \(variables: \['events', "):
        ours(stateVarName="nope")
    whole = spark.read.format("sessionstore").option("path", composite["state"])
    with pytest.raises(Exception, match=r'by state variable: .option\("stateVarName", NAME\)'):
        whole.option("store", "processor").load()
