"""Shared fixtures."""

from __future__ import annotations

import pytest

from sessionstore import StateDB


@pytest.fixture
def db(tmp_path):
    """A fresh StateDB in a temporary directory, closed after the test."""
    handle = StateDB.open(tmp_path / "db")
    yield handle
    handle.close()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 HTTP endpoint (moto server) on 127.0.0.1, stopped after the session."""
    from tests.moto_server import moto_s3_server

    with moto_s3_server() as options:
        yield options


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket on the moto endpoint; yields (uri, storage_options)."""
    from tests.moto_server import new_bucket

    yield f"s3://{new_bucket(s3_server)}/checkpoints", dict(s3_server)


@pytest.fixture(params=["file", "s3"])
def checkpoint_location(request, tmp_path):
    """(uri, storage_options) in a local folder and on the S3 endpoint."""
    if request.param == "file":
        return f"file://{tmp_path}/remote", None
    return request.getfixturevalue("s3_bucket")


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession whose Python workers use this interpreter."""
    from spark_integration.local import local_spark

    session = local_spark("sessionstore-tests", max_failures=2)  # one retry per task
    yield session
    session.stop()
