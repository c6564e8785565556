"""Driver-side planning: input checks and the TCP worker warning (a Spark session
only to plan, never a query)."""

from __future__ import annotations

from tests.spark.fakes import FakeContext, fake_session


def test_input_checks_name_the_missing_column_and_the_bad_time_type():
    from types import SimpleNamespace

    import pytest
    from pyspark.sql import types as T

    from spark_integration.planning.input_columns import checked_fields, time_column

    df = SimpleNamespace(
        schema=T.StructType(
            [T.StructField("user", T.StringType()), T.StructField("ts", T.StringType())]
        )
    )
    assert list(checked_fields(df, ["user", "ts"])) == ["user", "ts"]
    with pytest.raises(
        ValueError, match=r"the left input has no column 'k' \(it has \['ts', 'user'\]\)"
    ):
        checked_fields(df, ["user", "k"], "the left input")
    with pytest.raises(ValueError, match="timestamp column 'ts' must be a timestamp or epoch"):
        time_column(checked_fields(df, ["ts"]), "ts")


def test_tcp_python_workers_get_one_warning_on_spark_41_and_later(monkeypatch):
    import warnings
    from types import SimpleNamespace

    import pytest

    import spark_integration.planning.resolve as planning
    from sessionstore.process import this_process
    from spark_integration.conf.local_spark import UNIX_SOCKET_CONF

    def session(version, conf):
        spark_conf = SimpleNamespace(getAll=lambda: list(conf.items()))
        return SimpleNamespace(
            version=version, sparkContext=FakeContext(getConf=lambda: spark_conf)
        )

    this_process().forget(planning.TCP_WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning here fails the test
        assert not planning.warn_tcp_workers(session("4.0.1", {}))  # 4.0 has no such setting
        on = {UNIX_SOCKET_CONF: "true"}
        assert not planning.warn_tcp_workers(session("4.3.0", on))
    with pytest.warns(UserWarning, match="spark.python.unix.domain.socket.enabled is off"):
        assert planning.warn_tcp_workers(session("4.1.0", {UNIX_SOCKET_CONF: "false"}))
    assert not planning.warn_tcp_workers(session("4.3.0", {}))  # once per process


def checkpoint_with(tmp_path, partitions, key_groups=None):
    """A file:// backend whose operator "op" was created with ``partitions``
    databases (holding ``key_groups`` partitions when given)."""
    from sessionstore.checkpoint import StateStoreProvider
    from sessionstore.stores.spec import StoreSpec
    from spark_integration import StateBackend

    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    spec = StoreSpec("sessions", "session", 1_000)
    StateStoreProvider(
        backend.checkpoint_uri, "op", 0, [spec], str(tmp_path / "local"),
        num_partitions=partitions, key_groups=key_groups,
    ).close()  # fmt: skip
    return backend


def test_a_new_checkpoint_gets_720_partitions_unless_told(tmp_path):
    import pytest

    from spark_integration import StateBackend
    from spark_integration.planning.resolve import PARTITIONS_CONF, partition_count

    backend = StateBackend(f"file://{tmp_path}/ck")
    # Spark's spark.sql.shuffle.partitions (200 by default) plays no part
    shuffle = {"spark.sql.shuffle.partitions": "200"}
    assert partition_count(fake_session(shuffle, cores=2), backend, "op") == 720
    assert partition_count(fake_session(shuffle, cores=16), backend, "op") == 720
    assert partition_count(fake_session({PARTITIONS_CONF: "6"}, cores=16), backend, "op") == 6
    assert partition_count(fake_session({PARTITIONS_CONF: "6"}), backend, "op", 5) == 5
    with pytest.raises(
        ValueError, match=r"spark.sessionstore.partitions must be a positive int, got 'x'"
    ):
        partition_count(fake_session({PARTITIONS_CONF: "x"}), backend, "op")
    with pytest.raises(ValueError, match=r"num_partitions must be a positive int, got 0"):
        partition_count(fake_session(), backend, "op", 0)
    assert not (tmp_path / "ck").exists()  # planning writes nothing


def test_an_existing_checkpoint_keeps_its_recorded_partition_count(tmp_path):
    from spark_integration.planning.resolve import PARTITIONS_CONF, partition_count

    backend = checkpoint_with(tmp_path, 3)
    assert partition_count(fake_session(cores=8), backend, "op") == 3
    assert partition_count(fake_session(), backend, "op", 3) == 3
    # another count, given or by the conf, is the count the query rescales to
    assert partition_count(fake_session({PARTITIONS_CONF: "7"}), backend, "op") == 7
    assert partition_count(fake_session({PARTITIONS_CONF: "7"}), backend, "op", 5) == 5
    # another operator of the same checkpoint is new
    assert partition_count(fake_session(cores=8), backend, "other") == 720


def test_a_store_that_cannot_fence_is_named_once_at_planning(s3_bucket, tmp_path, monkeypatch):
    """Planning an operator on a checkpoint whose store has no conditional create
    (here S3 with ``default_metadata``, which the conditional create cannot honour;
    likewise HDFS, other pyarrow.fs stores, S3 or GCS without the extra) warns once
    per location, naming the risk; a store that fences (S3 with boto3, a local
    path) plans without a word."""
    import warnings
    from types import SimpleNamespace

    import pytest

    from sessionstore.checkpoint.partition import lineage
    from sessionstore.process import this_process
    from spark_integration import StateBackend
    from spark_integration.planning.resolve import resolve

    # once per process: start afresh
    this_process().forget(lineage.UNFENCED_WARNING)
    session = fake_session()
    session.version = "4.0.1"
    df = SimpleNamespace(sparkSession=session)
    uri, options = s3_bucket
    unfenced = StateBackend(uri, storage_options={**options, "default_metadata": {"a": "b"}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning here fails the test
        resolve(df, StateBackend(uri, storage_options=options), 2, "op")
        resolve(df, StateBackend(f"file://{tmp_path}/ck"), 2, "op")
    with pytest.warns(UserWarning) as caught:
        resolve(df, unfenced, 2, "op")
        resolve(df, unfenced, 2, "other")  # the same location: said already
    messages = [str(w.message) for w in caught if "fence" in str(w.message)]
    assert len(messages) == 1, messages
    assert (
        f"{uri} cannot fence two attempts of one micro-batch at the store (the "
        "conditional create does not support the storage option default_metadata)" in messages[0]
    )
    assert "both publish it, the later replacing the other" in messages[0]
    assert "LineageError" in messages[0] and "sessionstore[s3]" in messages[0]


def test_an_operator_reads_its_conf_once_into_one_frozen_snapshot(tmp_path):
    """Planning reads every ``spark.sessionstore.*`` key an operator acts on once,
    into one frozen OperatorConf that the rest of planning is given."""
    import dataclasses
    from types import SimpleNamespace

    import pytest

    from spark_integration import StateBackend
    from spark_integration.coordinator.server import ENABLED_CONF
    from spark_integration.execution.state_server.config import SERVERS_CONF
    from spark_integration.planning.due_batches import DUE_BATCHES_CONF
    from spark_integration.planning.operator_conf import TASKS_CONF, OperatorConf, operator_conf
    from spark_integration.planning.resolve import PARTITIONS_CONF

    session = fake_session(
        {PARTITIONS_CONF: "4", TASKS_CONF: "2", SERVERS_CONF: "off", ENABLED_CONF: "false",
         "spark.sessionstore.metrics.enabled": "true", DUE_BATCHES_CONF: "false"},
        cores=8,
    )  # fmt: skip
    session.version = "4.0.1"
    reads = []
    read = session.conf.get
    session.conf.get = lambda key, default=None: reads.append(key) or read(key, default)
    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    snapshot = operator_conf(SimpleNamespace(sparkSession=session), backend, None, "op")
    assert snapshot == OperatorConf(
        name="op", backend=backend, partitions=4, tasks=2, servers=0, observe_metrics=True,
        due_batches=False, coordinator=None, key_groups=4,
    )  # fmt: skip
    ours = [key for key in reads if key.startswith("spark.sessionstore.")]
    assert sorted(ours) == sorted(set(ours))
    assert {PARTITIONS_CONF, TASKS_CONF, SERVERS_CONF, DUE_BATCHES_CONF} <= set(ours)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.tasks = 4


def test_checked_fields_refuses_a_key_column_of_a_type_keys_cannot_have():
    from types import SimpleNamespace

    import pytest
    from pyspark.sql import types as T

    from spark_integration.planning.input_columns import checked_fields

    kinds = {"s": T.StringType(), "b": T.BinaryType(), "i": T.ByteType(), "l": T.LongType(),
             "t": T.BooleanType(), "day": T.DateType(), "x": T.DoubleType()}  # fmt: skip
    df = SimpleNamespace(schema=T.StructType([T.StructField(n, t) for n, t in kinds.items()]))
    assert list(checked_fields(df, [], keys=["s", "b", "i", "l", "t"])) == list(kinds)
    with pytest.raises(ValueError, match=r"key column 'day' of the input is date: a key column"):
        checked_fields(df, [], keys=["s", "day"])
    with pytest.raises(ValueError, match=r"key column 'x' of the right input is double.*"
                       r"F.col\('x'\).cast\('string'\)"):  # fmt: skip
        checked_fields(df, ["s"], "the right input", keys=["x"])
    with pytest.raises(ValueError, match="the input has no column 'k'"):
        checked_fields(df, [], keys=["k"])
    # Spark groups (and routes) a string of another collation by its collation
    # key, so 'A' and 'a' would be one key to Spark and two to the store
    folded = SimpleNamespace(schema=T.StructType([T.StructField("u", T.StringType("UTF8_LCASE"))]))
    with pytest.raises(
        ValueError, match=r"key column 'u' of the input is string collate UTF8_LCASE"
    ):
        checked_fields(folded, [], keys=["u"])
    assert list(checked_fields(folded, ["u"])) == ["u"]  # a value column may have it


def test_every_operator_refuses_a_date_key_when_planned(spark, tmp_path):
    # planning alone raises (no query starts): before any task runs, where the key
    # codec would refuse the first row
    import pytest

    from spark_integration import (
        StateBackend,
        sessionize,
        temporal_join,
        transform_with_state,
        window_aggregate,
        window_join,
    )  # fmt: skip
    from tests.spark.processors import RowTracker

    backend = StateBackend(f"file://{tmp_path}/state", local_dir=str(tmp_path / "local"))
    df = spark.createDataFrame([], "day date, ts long, v long")
    other = spark.createDataFrame([], "day date, ts long, w long")
    plans = {
        "sessionize": lambda: sessionize(df, "day", "ts", gap=5, backend=backend),
        "window_aggregate": lambda: window_aggregate(df, "day", "ts", size=5, backend=backend),
        "window_join": lambda: window_join(
            df, other, key="day", left_timestamp="ts", right_timestamp="ts", within=5,
            backend=backend,
        ),
        "temporal_join": lambda: temporal_join(
            df, other, key="day", stream_timestamp="ts", table_timestamp="ts",
            history_retention=5, backend=backend,
        ),
        "transform_with_state": lambda: transform_with_state(
            df, "day", RowTracker(), "day date, n long", backend=backend
        ),
    }  # fmt: skip
    sides = {"window_join": "left ", "temporal_join": "stream "}
    for name, plan in plans.items():
        with pytest.raises(ValueError, match=f"key column 'day' of the {sides.get(name, '')}input"):
            plan()


def test_partitions_beyond_two_per_core_share_the_fewest_databases_that_divide_them():
    from spark_integration.planning.resolve import default_slabs

    assert [default_slabs(k, 2) for k in (1, 2, 3, 4)] == [1, 2, 3, 4]  # one each
    assert [default_slabs(k, 2) for k in (8, 200, 720, 1000, 9)] == [4, 4, 4, 4, 3]
    assert default_slabs(7, 2) == 7  # no divisor between 2 and 4: a database each
    assert default_slabs(720, 64) == 120 and default_slabs(200, 64) == 100


def test_a_checkpoint_keeps_its_databases_unless_the_cluster_or_the_tasks_want_more():
    import pytest

    from spark_integration.planning.resolve import TASKS_CONF, explicit_tasks, slab_count

    two, big = fake_session(cores=2), fake_session(cores=64)
    assert slab_count(two, 200) == 4  # a new checkpoint
    assert slab_count(two, 200, (4, 200)) == 4
    assert slab_count(big, 200, (4, 200)) == 100  # a larger cluster: spread
    assert slab_count(two, 200, (100, 200)) == 100  # a smaller one: 50 per task
    assert slab_count(two, 300, (4, 200)) == 4  # another count: rescaled, 4 again
    assert slab_count(two, 6, (6, 6)) == 6  # a database per partition stays so
    assert slab_count(two, 200, (4, 200), tasks=8) == 8  # 8 tasks: 8 databases
    assert slab_count(two, 200, (40, 200), tasks=8) == 40  # 5 per task already
    assert slab_count(two, 200, (10, 200), tasks=4) == 20  # 4 tasks share 20, never fewer
    assert slab_count(two, 720, (45, 720), tasks=8) == 48  # the fewest more: 48, not 360
    # 3 cores want 5 databases: not twice the 4 there are, so no copy of the state
    assert slab_count(fake_session(cores=3), 200, (4, 200)) == 4
    assert explicit_tasks(fake_session({TASKS_CONF: "auto"}), 200) is None
    with pytest.raises(ValueError, match=r"spark.sessionstore.tasks must be .* divisor of .* 200"):
        explicit_tasks(fake_session({TASKS_CONF: "7"}), 200)


def test_a_spread_the_checkpoint_cannot_take_now_leaves_its_databases(tmp_path, caplog):
    """720 partitions in 4 databases, nothing committed yet (a first run that
    stopped early), planned on 64 cores: the spread over 120 databases cannot be
    done, so the query keeps the 4, saying so; asked for by a task count, it fails."""
    import logging
    from types import SimpleNamespace

    import pytest

    from sessionstore.checkpoint.offline.rescale import RescaleError
    from spark_integration.planning.resolve import TASKS_CONF, resolve

    backend = checkpoint_with(tmp_path, 4, key_groups=720)
    session = fake_session(cores=64)
    session.version = "4.0.1"
    with caplog.at_level(logging.WARNING, "spark_integration.planning.rescale"):
        resolved = resolve(SimpleNamespace(sparkSession=session), backend, None, "op")
    assert (resolved.slabs, resolved.partitions, resolved.tasks) == (4, 720, None)
    [line] = caplog.messages
    assert "kept operator 'op' of" in line
    assert "in its 4 databases (this cluster would spread it over 120)" in line
    assert "no committed version" in line
    session = fake_session({TASKS_CONF: "8"}, cores=2)
    session.version = "4.0.1"
    with pytest.raises(RescaleError, match="cannot rescale .* to 720 partitions in 8 databases"):
        resolve(SimpleNamespace(sparkSession=session), backend, None, "op")


def test_the_context_conf_is_read_once_per_spark_context():
    """Each read of a SparkContext's conf through Py4J costs JVM calls per key: the
    driver reads it once per context (it cannot change while the context runs),
    hands out copies, and a new context is read afresh."""
    from types import SimpleNamespace

    from spark_integration.conf.spark_session import conf_value, driver_conf

    reads = []

    def session(conf):
        def get_conf():
            reads.append(conf)
            return SimpleNamespace(getAll=lambda: list(conf.items()))

        return SimpleNamespace(conf=None, sparkContext=FakeContext(getConf=get_conf))

    first = session({"spark.master": "local[2]", "k": "1"})
    assert conf_value(first, "k") == "1" and conf_value(first, "absent", "d") == "d"
    copy = driver_conf(first)
    copy["k"] = "changed"
    assert driver_conf(first) == {"spark.master": "local[2]", "k": "1"}
    assert len(reads) == 1
    second = session({"k": "2"})
    assert conf_value(second, "k") == "2" and len(reads) == 2
