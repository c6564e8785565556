"""Driver-side planning: input checks and the TCP worker warning (no Spark session
needed)."""

from __future__ import annotations


def test_input_checks_name_the_missing_column_and_the_bad_time_type():
    from types import SimpleNamespace

    import pytest
    from pyspark.sql import types as T

    from spark_integration.planning import checked_fields, time_column

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

    import spark_integration.planning as planning
    from spark_integration.local import UNIX_SOCKET_CONF

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
