"""The request server's life: what it opens, it closes when stopped."""

from __future__ import annotations

import os
import socket
import threading
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
    returns, whether the server ever served or not (a server per operator, stopped
    with it, would otherwise keep three descriptors); a wake-up after the stop is
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


def _wake_until(server: RequestServer, done: threading.Event) -> None:
    while not done.is_set():
        server.wake()


def test_wake_ups_racing_the_stop_write_nowhere_else():
    """Threads waking the server while it stops, and pipes opened right after (they
    may take the closed descriptors' numbers): no pipe receives a byte. A wake-up's
    send and the pair's close exclude each other; a send after the close fails
    (ignored) instead of writing to the descriptor's next owner."""
    for _ in range(20):
        server = _server(_listener()[0])
        server.start()
        server.waiting = True  # every wake() sends
        done = threading.Event()
        wakers = [threading.Thread(target=_wake_until, args=(server, done)) for _ in range(3)]
        for waker in wakers:
            waker.start()
        server.stop()
        pipes = [os.pipe() for _ in range(4)]  # the freed numbers go to these
        done.set()
        for waker in wakers:
            waker.join()
        for read_end, write_end in pipes:
            os.set_blocking(read_end, False)
            with pytest.raises(BlockingIOError):  # empty
                os.read(read_end, 1)
            os.close(read_end)
            os.close(write_end)
