"""The executor runtime: taking and committing a partition's state, the
deterministic row order, and an aggregator's batch (no Spark session needed)."""

from __future__ import annotations

import os
import random

import pyarrow as pa

from spark_integration.execution.inputs import deterministic_order


def test_any_delivery_order_gives_the_same_sequence():
    rows = [
        {"user": u, "ts": t, "v": v, "s": {"a": a}}
        for u, t, v, a in [
            ("b", 1, 2, 1),
            ("a", 1, 2, 0),
            ("a", 1, 1, 5),
            ("a", 0, 9, None),
            ("b", 1, 2, 0),
        ]
    ]
    want = deterministic_order(pa.Table.from_pylist(rows), ["ts"]).to_pylist()
    assert [r["ts"] for r in want] == [0, 1, 1, 1, 1]
    assert want[1:3] == [
        {"user": "a", "ts": 1, "v": 1, "s": {"a": 5}},
        {"user": "a", "ts": 1, "v": 2, "s": {"a": 0}},
    ]
    rng = random.Random(1)
    for _ in range(20):
        shuffled = rows[:]
        rng.shuffle(shuffled)
        assert deterministic_order(pa.Table.from_pylist(shuffled), ["ts"]).to_pylist() == want


def test_run_aggregator_takes_the_columnar_path_and_its_output_equals_the_record_path(tmp_path):
    """The Spark task's input (two key columns, time in ``TS``, int and string
    values) takes the columnar path, and OperatorOutput turns its table into the
    same output rows as the record path's updates (times as timestamps)."""
    from pyspark.sql import types as T

    from sessionstore import StateStoreProvider, StoreSpec
    from sessionstore.operators import SessionWindowAggregator, SessionWindows
    from sessionstore.operators.batch_paths.arrow_io import columns_of
    from spark_integration.conf.names import TS
    from spark_integration.execution.aggregator_task import run_aggregator
    from spark_integration.execution.context import TaskInfo
    from spark_integration.execution.output import OperatorOutput
    from spark_integration.planning.aggregation_specs import parse_aggregations

    aggregation, value_cols, plan = parse_aggregations(
        {"n": "count", "lo": ("min", "amount"), "hi": ("max", "amount"), "exit": ("last", "page")},
        ["amount", "page"],
    )
    rng = random.Random(3)
    rows = [
        {"user": f"u{rng.randrange(3)}", "device": rng.randrange(2), TS: t,
         "amount": rng.randrange(-50, 50), "page": rng.choice(["/", "/cart"])}
        for t in sorted(rng.sample(range(0, 60_000), 200))
    ] + [{"user": "zz", "device": 0, TS: 10**6, "amount": 0, "page": "/"}]  # fmt: skip
    batch = pa.RecordBatch.from_pylist(
        rows,
        schema=pa.schema([("user", pa.string()), ("device", pa.int32()), (TS, pa.int64()),
                          ("amount", pa.int32()), ("page", pa.string())]),
    )  # fmt: skip
    keys = ["user", "device"]

    def aggregator(name):
        provider = StateStoreProvider(
            f"file://{tmp_path}/ck", name, 0, [StoreSpec("s", "session", 6_001)], tmp_path / name
        )
        handle = provider.get_store(0)
        return (
            provider,
            handle,
            SessionWindowAggregator(
                handle["s"], SessionWindows(5_000, 1_000), aggregations=aggregation, emit="final"
            ),
        )

    provider, handle, agg = aggregator("columnar")
    emitted = run_aggregator(
        agg, provider, TaskInfo(0, 1, 0), [batch], keys, value_cols, None, handle
    )
    table = emitted.table
    assert emitted.updates == emitted.closed == [] and table is not None and table.num_rows > 10
    _, _, reference = aggregator("records")
    k, times, values = columns_of(pa.Table.from_batches([batch]), keys, TS, value_cols)
    expected = reference.process_rows(k, times, values)

    schema = T.StructType(
        [T.StructField("user", T.StringType()), T.StructField("device", T.IntegerType()),
         T.StructField("session_start", T.TimestampType()),
         T.StructField("session_end", T.TimestampType()), T.StructField("n", T.LongType()),
         T.StructField("lo", T.IntegerType()), T.StructField("hi", T.IntegerType()),
         T.StructField("exit", T.StringType())]
    )  # fmt: skip
    output = OperatorOutput(schema.json(), keys, plan, True, "session_start", "session_end")
    got = output.from_table(table)
    assert got.schema.field("lo").type == pa.int32()
    assert got.to_pylist() == pa.Table.from_batches([output.from_updates(expected)]).to_pylist()


def _take_state(
    backend,
    batch_id,
    batches,
    body,
    partition=0,
    shared_event_time=False,
    event_time=None,
    coordinator=None,
):
    """Run one task's ``state_and_inputs`` block of operator "op" (2 partitions),
    committing ``event_time`` as the partition's event time if given."""
    from sessionstore import StoreSpec
    from spark_integration.execution.context import TaskContext, TaskInfo
    from spark_integration.execution.partition_state import state_and_inputs

    specs = [StoreSpec("sessions", "session", 10**12)]
    context = TaskContext(TaskInfo(partition=partition, batch_id=batch_id, attempt=0))
    with state_and_inputs(
        backend, "op", context, specs, 2, batches, shared_event_time, coordinator=coordinator
    ) as (
        handle,
        _,
        inputs,
        shared,
    ):
        if event_time is not None:
            handle.note_event_time(event_time)
        return body(handle["sessions"], inputs) if body else shared


def _retry_values(backend):
    """Batch 1 again on partition 0 (on a thread: a partition left locked would hang
    it): the values of key "a" it finds."""
    import threading

    result = {}

    def retry():
        result["got"] = _take_state(
            backend, 1, iter(()), lambda store, inputs: [v for _, v in store.fetch("a")]
        )

    worker = threading.Thread(target=retry, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the failed task left its partition locked"
    return result["got"]


def test_state_is_taken_while_the_input_arrives_and_commits_after_the_block(tmp_path, monkeypatch):
    import threading

    import spark_integration.execution.partition_state as runtime
    from spark_integration import StateBackend

    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    taken = threading.Event()
    takers = []
    real = runtime.partition_state

    class Recorded:
        def __init__(self, *args):
            self.cm = real(*args)

        def __enter__(self):
            value = self.cm.__enter__()
            takers.append(threading.current_thread())
            taken.set()
            return value

        def __exit__(self, *exc):
            return self.cm.__exit__(*exc)

    monkeypatch.setattr(runtime, "partition_state", Recorded)
    batch = pa.RecordBatch.from_pydict({"x": [1, 2]})

    def batches():
        yield batch
        # the input ends only once the state is taken: taken after it, this times out
        assert taken.wait(10), "the state was not taken while the input arrived"
        yield batch.slice(0, 0)  # empty batches are dropped
        yield batch

    def body(store, inputs):
        assert [b.num_rows for b in inputs] == [2, 2]
        store.put("a", 1, 2, "v")

    _take_state(backend, 0, batches(), body)
    assert len(takers) == 1 and takers[0] is not threading.current_thread()
    # version 1 was committed: the next batch sees the session
    got = _take_state(backend, 1, iter(()), lambda store, inputs: list(store.fetch("a")))
    assert [(w.start, w.end, v) for w, v in got] == [(1, 2, "v")]


def test_a_failing_input_aborts_the_taken_state_and_releases_it(tmp_path):

    import pytest

    from sessionstore import StateStoreProvider, StoreSpec
    from spark_integration import StateBackend

    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    _take_state(backend, 0, iter(()), lambda store, inputs: store.put("a", 1, 2, "kept"))

    def broken():
        yield pa.RecordBatch.from_pydict({"x": [1]})
        raise ConnectionError("the JVM went away")

    def body(store, inputs):
        raise AssertionError("the block must not run without its input")

    with pytest.raises(ConnectionError, match="the JVM went away"):
        _take_state(backend, 1, broken(), body)
    # nothing of batch 1 was committed
    spec = [StoreSpec("sessions", "session", 10**12)]
    reader = StateStoreProvider(backend.checkpoint_uri, "op", 0, spec, str(tmp_path / "other"))
    assert reader.latest_version() == 1
    reader.close()
    # and the partition is free again: a retry takes it (a held lock would hang here)
    assert _retry_values(backend) == ["kept"]


def test_the_shared_event_time_is_read_on_the_helper_thread(tmp_path, monkeypatch):
    import threading

    import spark_integration.execution.partition_state as runtime
    from spark_integration import StateBackend

    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    for partition, t in ((0, 1_000), (1, 7_000)):  # batch 0: committed with its event time
        _take_state(backend, 0, iter(()), lambda store, inputs: None, partition, event_time=t)
    readers = []
    real = runtime.event_time_after

    def after(*args):
        readers.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(runtime, "event_time_after", after)
    assert _take_state(backend, 1, iter(()), None, 0, shared_event_time=True) == 7_000
    assert _take_state(backend, 1, iter(()), None, 1) is None  # not asked for: not read
    assert len(readers) == 1 and readers[0] is not threading.current_thread()


def test_a_failing_event_time_read_fails_the_task_and_frees_its_partition(tmp_path, monkeypatch):

    import pytest

    import spark_integration.execution.partition_state as runtime
    from spark_integration import StateBackend

    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    _take_state(backend, 0, iter(()), lambda store, inputs: store.put("a", 1, 2, "kept"))

    def broken(*args):
        raise OSError("object storage said no")

    monkeypatch.setattr(runtime, "event_time_after", broken)
    with pytest.raises(OSError, match="object storage said no"):
        _take_state(backend, 1, iter(()), None, shared_event_time=True)
    monkeypatch.undo()
    assert _retry_values(backend) == ["kept"]


def test_a_task_reports_its_event_time_only_once_its_commit_is_durable(tmp_path, monkeypatch):
    import pytest

    import spark_integration.execution.partition_state as runtime
    from sessionstore.checkpoint.records.event_time import partition_event_time
    from sessionstore.checkpoint.storage.filesystem import open_filesystem
    from spark_integration import StateBackend
    from spark_integration.coordinator.client import ask
    from spark_integration.coordinator.server import Coordinator

    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    operator = open_filesystem(backend.checkpoint_uri).child("op")
    coordinator = Coordinator()
    try:
        address = coordinator.register(backend.checkpoint_uri, "op", 2)
        durable_when_reported = []
        real = runtime.report_many

        def report_many(address, run, batch, reports):
            for partition, _, _ in reports:
                durable_when_reported.append(partition_event_time(operator, batch, partition))
            return real(address, run, batch, reports)

        monkeypatch.setattr(runtime, "report_many", report_many)

        def failing(store, inputs):
            raise RuntimeError("the task failed before its commit")

        with pytest.raises(RuntimeError):
            _take_state(backend, 0, iter(()), failing, 0, True, 5, address)
        assert durable_when_reported == []  # nothing committed: nothing reported
        for partition, t in ((0, 5), (1, 11)):
            _take_state(backend, 0, iter(()), lambda *_: None, partition, True, t, address)
        assert durable_when_reported == [5, 11]  # the changelog said so already
        state = coordinator.operator(address)
        assert state.reports[(None, 0)] == {0: 5, 1: 11}
        assert state.metrics[(None, 0)][1]["partition"] == 1  # the task's metrics record
        assert ask(address, None, 0) == (True, 11)
        assert _take_state(backend, 1, iter(()), None, 0, True, None, address) == 11
        assert state.stats["durable_reads"] == 0
    finally:
        coordinator.stop()


def test_operator_stores_get_hour_long_segments_unless_their_spec_names_one(tmp_path):
    from sessionstore import StoreSpec
    from spark_integration import StateBackend
    from spark_integration.execution.context import TaskContext, TaskInfo
    from spark_integration.execution.partition_state import partition_state

    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    specs = [StoreSpec("open", "session", 120_001), StoreSpec("named", "session", 120_001, 60_000)]
    with partition_state(backend, "op", TaskContext(TaskInfo(0, 0, 0)), specs, 1) as (
        handle,
        provider,
    ):
        assert handle["open"].segment_interval_ms == 3_600_000
        assert handle["named"].segment_interval_ms == 60_000
        assert [s.segment_interval_ms for s in provider.store_specs] == [3_600_000, 60_000]


def test_a_task_opens_its_database_with_the_backends_memory_budget(tmp_path):
    from sessionstore.engine.memory import DEFAULT_MEMORY_MAX_MB, memory_budget
    from spark_integration import StateBackend

    backend = StateBackend(
        f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"), memory_max_mb=72
    )
    try:

        def body(store, inputs):
            capacity = store._db._rdict_cf("meta").property_int_value(
                "rocksdb.block-cache-capacity"
            )
            return capacity, memory_budget().max_mb

        assert _take_state(backend, 0, iter(()), body) == (72 * 2**20, 72)
    finally:
        memory_budget(DEFAULT_MEMORY_MAX_MB)


def test_a_task_numbered_beyond_the_operators_partitions_is_refused_before_any_state(tmp_path):
    """In a union Spark numbers a later child's tasks after the earlier children's:
    task 5 of a 4-partition operator must not open (or create) partition 5."""
    import pytest

    from sessionstore import StoreSpec
    from spark_integration import StateBackend
    from spark_integration.execution.context import TaskContext, TaskInfo
    from spark_integration.execution.partition_state import partition_state

    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    specs = [StoreSpec("open", "session", 120_001)]
    with pytest.raises(RuntimeError, match=r"partition 5 of its stage but the operator has 4"):
        with partition_state(backend, "op", TaskContext(TaskInfo(5, 0, 0)), specs, 4):
            pass
    assert not (tmp_path / "ck").exists() and not (tmp_path / "local").exists()


def test_each_task_context_gets_its_own_commits_metrics_record(tmp_path):
    """Two partitions' tasks in one process, the second committed inside the first
    (as a Spark task running several state partitions, or a state server): each
    context holds the record of its own commit, and a context whose task has not
    committed holds none."""
    from sessionstore import StoreSpec
    from spark_integration import StateBackend
    from spark_integration.execution.context import TaskContext, TaskInfo
    from spark_integration.execution.partition_state import partition_state

    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    specs = [StoreSpec("open", "session", 120_001)]
    outer, inner = TaskContext(TaskInfo(0, 0, 0)), TaskContext(TaskInfo(1, 0, 0))
    with partition_state(backend, "op", outer, specs, 2):
        with partition_state(backend, "op", inner, specs, 2):
            pass
        assert outer.metrics is None
        assert (inner.metrics["partition"], inner.metrics["batch"]) == (1, 0)
    assert (outer.metrics["partition"], outer.metrics["batch"]) == (0, 0)
    assert (inner.metrics["partition"], inner.metrics["batch"]) == (1, 0)


def test_sessions_an_advance_closes_become_the_rows_their_updates_would(tmp_path):
    """Two key columns, timestamps, every kind of result column (numpy doubles with
    nulls, a sketch's estimates, lists, Python values): the rows OperatorOutput makes
    of ``advance_columns`` equal those it makes of ``advance_to``'s updates."""
    from pyspark.sql import types as T

    from sessionstore import InMemorySessionStore
    from sessionstore.operators import SessionWindowAggregator, SessionWindows
    from spark_integration.execution.output import OperatorOutput
    from spark_integration.planning.aggregation_specs import parse_aggregations

    aggregation, _, plan = parse_aggregations(
        {"n": "count", "avg": ("avg", "amount"), "sd": ("stddev", "amount"),
         "pages": ("approx_count_distinct", "page"), "seen": ("collect_set", "page"),
         "exit": ("last", "page")},
        ["amount", "page"],
    )  # fmt: skip
    rng = random.Random(5)
    rows = [
        ((f"u{rng.randrange(4)}", rng.randrange(2)), t,
         {"amount": rng.choice([None, 1.5, 2.0, -3.25]), "page": rng.choice(["/", "/a", None])})
        for t in sorted(rng.sample(range(100_000), 300))
    ]  # fmt: skip
    out = []
    for as_columns in (False, True):
        agg = SessionWindowAggregator(
            InMemorySessionStore("s", 4_000), SessionWindows(3_000, 500),
            aggregations=aggregation, emit="final", closes_on="advance",
        )  # fmt: skip
        agg.process_rows([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
        out.append(agg.advance_columns(10**6) if as_columns else agg.advance_to(10**6))
    updates, closed = out
    assert closed.count == len(updates) > 50
    schema = T.StructType(
        [T.StructField("user", T.StringType()), T.StructField("device", T.IntegerType()),
         T.StructField("session_start", T.TimestampType()),
         T.StructField("session_end", T.TimestampType()), T.StructField("n", T.LongType()),
         T.StructField("avg", T.DoubleType()), T.StructField("sd", T.DoubleType()),
         T.StructField("pages", T.LongType()),
         T.StructField("seen", T.ArrayType(T.StringType())),
         T.StructField("exit", T.StringType())]
    )  # fmt: skip
    output = OperatorOutput(
        schema.json(), ["user", "device"], plan, True, "session_start", "session_end"
    )
    got = output.from_closed(closed)
    assert got.to_pylist() == output.from_updates(updates).to_pylist()
    assert got.column("sd").null_count > 0 and got.column("avg").type == pa.float64()


def test_a_snapshot_in_a_flush_group_waits_for_the_changelog_it_is_built_on(tmp_path, monkeypatch):
    """A snapshot of version N is built from the local state that changelog N made;
    published (and on a local checkpoint flushed) while changelog N may still be lost
    to a power loss, it would outlive the changelog, and maintenance may delete the
    older data a restore of the replacing attempt's version N needs. So a task's
    snapshot starts once its flush group has made the changelog durable."""
    from sessionstore import StoreSpec
    from sessionstore.checkpoint.storage import flush_group as fg
    from spark_integration import StateBackend
    from spark_integration.execution.context import TaskContext, TaskInfo
    from spark_integration.execution.partition_state import partition_state

    events: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (events.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))
    )
    monkeypatch.setattr(fg, "_syncfs", lambda: lambda fd: events.append("syncfs") or 0)
    ck = tmp_path / "ck"
    backend = StateBackend(f"file://{ck}", local_dir=str(tmp_path / "local"), snapshot_interval=1)
    specs = [StoreSpec("s", "session", 10**9)]
    with fg.flush_group():
        for partition in range(2):  # a worker that exits with its task: snapshots in-thread
            context = TaskContext(TaskInfo(partition, 0, 0))
            with partition_state(backend, "op", context, specs, 2) as (handle, _):
                handle["s"].put("k", 0, 10, {"n": 1})
        assert (ck / "op/0/changelog/0/1.changelog").exists()
        assert not (ck / "op/0/snapshot").exists() and not (ck / "op/1/snapshot").exists()
        assert "syncfs" not in events
    assert (ck / "op/0/snapshot/1.manifest").exists() and (ck / "op/1/snapshot/1.manifest").exists()
    first_snapshot_write = next(i for i, e in enumerate(events) if "/snapshot/" in e or "/files/" in e)
    assert events.index("syncfs") < first_snapshot_write
