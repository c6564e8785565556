"""The request server's life: what it opens, it closes when stopped."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from sessionstore.checkpoint.service.request_server import RequestServer


def _open_files() -> set[str]:
    """What each of this process's descriptors refers to (``socket:[inode]``, ...):
    an inode names one socket however its descriptor number is reused."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            pass
    return out


def _listener() -> tuple[socket.socket, str]:
    """A listening Unix socket at an abstract address (no path length limit)."""
    address = f"\0sessionstore-test-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen()
    return listener, address


def _server(listener: socket.socket) -> RequestServer:
    """A server answering a line with the line in capitals."""
    return RequestServer(
        listener, lambda buffer: bytes(buffer) if buffer.endswith(b"\n") else None,
        lambda request: request.upper(), name="test", max_request_bytes=64,
        request_timeout_s=5.0, answer_timeout_s=5.0, max_clients=4, retry_s=0.05,
    )  # fmt: skip


@pytest.mark.parametrize("served", [True, False])
def test_a_stopped_server_keeps_no_descriptor_open(served):
    """The listener and the wake-up pair (and the selector) are closed once ``stop``
    returns, whether the server ever served or not; a wake-up after the stop is
    ignored."""
    before = _open_files()
    listener, address = _listener()
    server = _server(listener)
    # the listener and the wake-up pair (an epoll's link names no inode, so the
    # selector's cannot be told from another's)
    opened = {f for f in _open_files() - before if f.startswith("socket:")}
    assert len(opened) == 3
    if served:
        server.start()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(address)
            client.sendall(b"ping\n")
            assert client.recv(16) == b"PING\n"
    server.stop()
    assert listener.fileno() == -1
    assert opened & _open_files() == set()
    server.wake()
