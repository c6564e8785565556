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
    import socket
    import subprocess
    import sys
    import time

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise RuntimeError("moto server did not start")
    yield {
        "endpoint_override": f"127.0.0.1:{port}",
        "scheme": "http",
        "access_key": "testing",
        "secret_key": "testing",
        "region": "us-east-1",
    }
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket on the moto endpoint; yields (uri, storage_options)."""
    import uuid

    import pyarrow.fs as pafs

    name = f"test-{uuid.uuid4().hex[:12]}"
    pafs.S3FileSystem(**s3_server, allow_bucket_creation=True).create_dir(name)
    yield f"s3://{name}/checkpoints", dict(s3_server)


@pytest.fixture(params=["file", "s3"])
def checkpoint_location(request, tmp_path):
    """(uri, storage_options) in a local folder and on the S3 endpoint."""
    if request.param == "file":
        return f"file://{tmp_path}/remote", None
    return request.getfixturevalue("s3_bucket")
