"""The CLI where credentials or the network are missing: real processes (a stopped
fake-gcs-server, a socket that accepts and never answers, no Google credentials)
and the ``sessionstore`` CLI as a subprocess, which must exit non-zero within the
bound (``--retry-max-seconds``, else 30 s) with one line naming the URI, what was
tried and how to fix it. Stderr a terminal: a spinner while it waits."""

from __future__ import annotations

import os
import pty
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.object_stores import gcs_server
from tests.packaging import checkout_pythonpath
from tests.tools.test_cli import CLI, storage_flags

#: Python's start and the CLI's imports, on a busy machine.
STARTUP_S = 8.0


@contextmanager
def silent_endpoint() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def refused_port() -> int:
    """A port on 127.0.0.1 nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def no_credentials_env(tmp_path, metadata_port: int) -> dict[str, str]:
    """This process's environment without Google or AWS credentials: no key
    variables, an empty home, the GCE metadata server on a port that refuses."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GOOGLE_", "AWS_", "CLOUDSDK_", "GCE_"))
    }
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(
        HOME=str(home), CLOUDSDK_CONFIG=str(home / "gcloud"),
        GCE_METADATA_HOST=f"127.0.0.1:{metadata_port}", AWS_EC2_METADATA_DISABLED="true",
        PYTHONPATH=checkout_pythonpath(),
    )  # fmt: skip
    return env


def timed_cli(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env=env)
    return out, time.monotonic() - started


def assert_one_line(out: subprocess.CompletedProcess, *parts: str) -> str:
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    line = lines[0]
    for part in parts:
        assert part in line, (part, line)
    assert "reaching" not in out.stderr  # no spinner: stderr is not a terminal
    return line


@pytest.mark.slow
def test_a_stopped_fake_gcs_server_fails_within_the_bound(tmp_path):
    """The emulator is started, then stopped: its port refuses connections."""
    with gcs_server() as options:
        pass
    flags = [
        f"--storage-option={k}={v}" for k, v in options.items() if k != "retry_time_limit"
    ]  # the default, one second per attempt
    env = no_credentials_env(tmp_path, refused_port())
    out, elapsed = timed_cli("ls", "gs://some-bucket", *flags, "--retry-max-seconds", "6", env=env)
    line = assert_one_line(
        out, "cannot reach gs://some-bucket", "Could not connect", "anonymous access",
        f"http://{options['endpoint_override']}", "--retry-max-seconds",
    )  # fmt: skip
    assert " attempts" in line  # what was tried, and how often
    assert elapsed < 6 + STARTUP_S, elapsed


@pytest.mark.slow
def test_an_s3_endpoint_that_never_answers_fails_within_the_default_bound(tmp_path):
    """A socket that accepts and never replies; no --retry-max-seconds: 30 s."""
    env = no_credentials_env(tmp_path, refused_port())
    with silent_endpoint() as port:
        out, elapsed = timed_cli(
            "ls", "s3://some-bucket/state",
            f"--storage-option=endpoint_override=127.0.0.1:{port}", "--storage-option=scheme=http",
            *storage_flags({"access_key": "AKIDEXAMPLE", "secret_key": "s3cr3t-value"}, tmp_path),
            "--storage-option=region=us-east-1", env=env,
        )  # fmt: skip
    line = assert_one_line(
        out, "cannot reach s3://some-bucket/state", "access_key/secret_key storage options",
        f"http://127.0.0.1:{port}", "more than 30 s",
    )  # fmt: skip
    assert "s3cr3t-value" not in line
    assert 20 < elapsed < 30 + STARTUP_S, elapsed


def test_gcs_without_credentials_fails_within_the_bound_naming_what_was_tried(tmp_path):
    """No GOOGLE_APPLICATION_CREDENTIALS, no gcloud file, a metadata server that
    does not answer: the line names each, the endpoint and the fixes."""
    with silent_endpoint() as metadata, silent_endpoint() as storage:
        env = no_credentials_env(tmp_path, metadata)
        out, elapsed = timed_cli(
            "dump", "gs://some-bucket/state", "--store", "sessions",
            f"--storage-option=endpoint_override=127.0.0.1:{storage}",
            "--storage-option=scheme=http", "--retry-max-seconds", "4", env=env,
        )  # fmt: skip
    assert_one_line(
        out, "cannot reach gs://some-bucket/state", "GOOGLE_APPLICATION_CREDENTIALS (not set)",
        "application_default_credentials.json (not found)",
        f"GCE metadata server 127.0.0.1:{metadata}", "gcloud auth application-default login",
        f"http://127.0.0.1:{storage}", "more than 4 s",
    )  # fmt: skip
    assert elapsed < 4 + STARTUP_S, elapsed


def test_s3_without_credentials_names_the_aws_chain(tmp_path):
    env = no_credentials_env(tmp_path, refused_port())
    port = refused_port()
    out, elapsed = timed_cli(
        "ls", "s3://some-bucket", f"--storage-option=endpoint_override=127.0.0.1:{port}",
        "--storage-option=scheme=http", "--retry-max-seconds", "3", env=env,
    )  # fmt: skip
    assert_one_line(
        out, "cannot reach s3://some-bucket", "AWS_ACCESS_KEY_ID (not set)",
        "profile 'default'", "(not found)", "instance metadata", "AWS_PROFILE",
    )  # fmt: skip
    assert elapsed < 3 + STARTUP_S, elapsed


@pytest.mark.skipif(os.name == "nt", reason="a pseudo-terminal")
def test_a_wait_past_a_second_shows_a_spinner_on_a_terminal(tmp_path):
    env = {**no_credentials_env(tmp_path, refused_port()), "TERM": "xterm"}
    with silent_endpoint() as port:
        leader, follower = pty.openpty()
        proc = subprocess.Popen(
            [*CLI, "ls", "s3://some-bucket", f"--storage-option=endpoint_override=127.0.0.1:{port}",
             "--storage-option=scheme=http",
             *storage_flags({"access_key": "a", "secret_key": "b"}, tmp_path),
             "--retry-max-seconds", "3"],
            stdout=subprocess.PIPE, stderr=follower, env=env,
        )  # fmt: skip
        os.close(follower)
        shown = b""
        while True:
            ready, _, _ = select.select([leader], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the process closed its end
                break
            if not chunk:
                break
            shown += chunk
        proc.wait(timeout=30)
        os.close(leader)
    text = shown.decode("utf-8", "replace")
    assert proc.returncode == 2
    assert "reaching s3://some-bucket" in text
    assert "cannot reach s3://some-bucket" in text
