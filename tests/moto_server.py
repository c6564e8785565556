"""Helpers for tests and benchmarks (they need the ``test`` extras installed)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["moto_s3_server", "new_bucket"]


@contextmanager
def moto_s3_server() -> Iterator[dict[str, Any]]:
    """Run a moto S3 server on 127.0.0.1; yield pyarrow ``S3FileSystem`` options."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.1)
        yield {
            "endpoint_override": f"127.0.0.1:{port}",
            "scheme": "http",
            "access_key": "testing",
            "secret_key": "testing",
            "region": "us-east-1",
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def new_bucket(options: dict[str, Any]) -> str:
    """Create a uniquely named bucket on the endpoint; return its name."""
    import pyarrow.fs as pafs

    name = f"test-{uuid.uuid4().hex[:12]}"
    pafs.S3FileSystem(**options, allow_bucket_creation=True).create_dir(name)
    return name
