"""Driver-side planning: input checks and the TCP worker warning (no Spark session
needed)."""

from __future__ import annotations

from tests.spark.fakes import fake_session


def test_input_checks_name_the_missing_column_and_the_bad_time_type():
    from types import SimpleNamespace

    import pytest
    from pyspark.sql import types as T

    from spark_integration.planning.resolve import checked_fields, time_column

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
    from spark_integration.dev.local import UNIX_SOCKET_CONF

    def session(version, conf):
        spark_conf = SimpleNamespace(get=lambda key, default=None: conf.get(key, default))
        return SimpleNamespace(
            version=version, sparkContext=SimpleNamespace(getConf=lambda: spark_conf)
        )

    monkeypatch.setattr(planning, "_warned_tcp", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning here fails the test
        assert not planning.warn_tcp_workers(session("4.0.1", {}))  # 4.0 has no such setting
        on = {UNIX_SOCKET_CONF: "true"}
        assert not planning.warn_tcp_workers(session("4.3.0", on))
    with pytest.warns(UserWarning, match="spark.python.unix.domain.socket.enabled is off"):
        assert planning.warn_tcp_workers(session("4.1.0", {UNIX_SOCKET_CONF: "false"}))
    assert not planning.warn_tcp_workers(session("4.3.0", {}))  # once per process


def checkpoint_with(tmp_path, partitions):
    """A file:// backend whose operator "op" was created with ``partitions``."""
    from sessionstore.checkpoint import StateStoreProvider
    from sessionstore.stores.spec import StoreSpec
    from spark_integration import StateBackend

    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    spec = StoreSpec("sessions", "session", 1_000)
    StateStoreProvider(
        backend.checkpoint_uri, "op", 0, [spec], str(tmp_path / "local"), num_partitions=partitions
    ).close()
    return backend


def test_a_new_checkpoint_gets_two_partitions_per_core_unless_told(tmp_path):
    import pytest

    from spark_integration import StateBackend
    from spark_integration.planning.resolve import PARTITIONS_CONF, partition_count

    backend = StateBackend(f"file://{tmp_path}/ck")
    # Spark's spark.sql.shuffle.partitions (200 by default) plays no part
    shuffle = {"spark.sql.shuffle.partitions": "200"}
    assert partition_count(fake_session(shuffle, cores=2), backend, "op") == 4
    assert partition_count(fake_session(shuffle, cores=16), backend, "op") == 32
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
    import warnings

    import pytest

    from sessionstore.checkpoint import CheckpointMismatchError
    from spark_integration.planning.resolve import PARTITIONS_CONF, partition_count

    backend = checkpoint_with(tmp_path, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert partition_count(fake_session(cores=8), backend, "op") == 3
        assert partition_count(fake_session(), backend, "op", 3) == 3
        assert partition_count(fake_session({PARTITIONS_CONF: "3"}), backend, "op") == 3
    # the conf sets new checkpoints' count: said once per operator built, not applied
    with pytest.warns(
        UserWarning,
        match=r"spark.sessionstore.partitions=7 is ignored by operator 'op': its checkpoint .* has 3 partitions",
    ):
        assert partition_count(fake_session({PARTITIONS_CONF: "7"}), backend, "op") == 3
    # an explicit other count fails on the driver, with the provider's message
    with pytest.raises(
        CheckpointMismatchError,
        match=r"op/_metadata was written with 3 partitions, but this query has 5; the "
        r"partition count is fixed",
    ):
        partition_count(fake_session(), backend, "op", 5)
    # another operator of the same checkpoint is new
    assert partition_count(fake_session(cores=8), backend, "other") == 16
