"""A query's planning and the ``sessionstore`` data source against a store that is
not there: they answer within the retry bound with one line naming the URI, what
was tried and how to fix it (real sockets: one that never answers, one that
refuses)."""

from __future__ import annotations

import time

import pytest

from sessionstore.checkpoint.storage.first_contact import StoreUnreachableError
from spark_integration import StateBackend, sessionize
from tests.tools.test_cli_first_contact import refused_port, silent_endpoint

pytestmark = pytest.mark.slow

#: Spark's own planning and its Python data source worker, on a busy machine.
SLACK_S = 15.0


def test_planning_a_query_on_an_unanswering_store_fails_within_the_bound(spark):
    df = spark.createDataFrame([("a", 1)], "user string, ts long")
    with silent_endpoint() as port:
        backend = StateBackend(
            "s3://some-bucket/state", retry_max_seconds=3,
            storage_options={
                "endpoint_override": f"127.0.0.1:{port}", "scheme": "http",
                "access_key": "a", "secret_key": "b", "region": "us-east-1",
            },
        )  # fmt: skip
        started = time.monotonic()
        with pytest.raises(StoreUnreachableError) as info:
            sessionize(df, "user", "ts", gap="1 second", backend=backend)
        elapsed = time.monotonic() - started
    message = str(info.value)
    assert "\n" not in message
    assert "cannot reach s3://some-bucket/state" in message
    assert (
        f"http://127.0.0.1:{port}" in message and "spark.sessionstore.retry.maxSeconds" in message
    )
    assert elapsed < 3 + SLACK_S, elapsed


def test_the_data_source_on_a_refusing_store_fails_within_the_bound(spark):
    from spark_integration.datasource import register

    register(spark)
    port = refused_port()
    reader = (
        spark.read.format("sessionstore")
        .option("path", "gs://some-bucket/state")
        .option("store", "sessions")
        .option("storage.endpoint_override", f"127.0.0.1:{port}")
        .option("storage.scheme", "http")
        .option("storage.anonymous", "true")
        .option("storage.retry_max_seconds", "3")
    )
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        reader.load().collect()
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "cannot reach gs://some-bucket/state" in message
    assert "anonymous access" in message and f"http://127.0.0.1:{port}" in message
    assert elapsed < 3 + SLACK_S, elapsed
