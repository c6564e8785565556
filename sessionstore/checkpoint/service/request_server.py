"""RequestServer: small requests on short-lived connections, served by one thread.

Shared by the two servers sessionstore runs beside a job: the handover socket of
a worker process (:mod:`sessionstore.checkpoint.service.store_service`) and the driver's
event-time coordinator (``spark_integration/coordinator/server.py``). Both must survive
whatever a client does, so the rules are the same:

* one thread with a selector serves every connection (no thread per client);
* a request must arrive whole within ``request_timeout_s`` and be at most
  ``max_request_bytes``; anything slower, larger, malformed or followed by more
  bytes is dropped unanswered, so memory stays bounded;
* at most ``max_clients`` connections are held: a new one beyond that drops the
  oldest that has not sent its request yet (a flood cannot keep a real client
  out), or is closed if every slot waits for an answer;
* running out of file descriptors pauses accepting for 0.1 s instead of spinning.

An answer may have to wait (a database a task still uses; a read of object
storage on another thread): ``answer(request)`` returns None then, and is asked
again when :meth:`RequestServer.wake` is called or every ``retry_s``, without
holding up other clients, until the client's ``answer_timeout_s`` runs out.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["RequestServer", "NO_REPLY", "RefusalLog", "peer_credentials", "same_user"]

log = logging.getLogger(__name__)

#: What ``answer`` returns to close a connection without a reply (a request it
#: refuses, such as one without the right token).
NO_REPLY = b""


def peer_credentials(conn: socket.socket) -> tuple[int, int] | None:
    """``(pid, uid)`` of the process at the other end of a Unix socket (Linux's
    ``SO_PEERCRED``); None where the platform cannot tell (then the socket is a
    file of ours, mode 0600, which only our user can reach)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return (0, -1)  # unknown: treated as another user's
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def same_user(conn: socket.socket) -> tuple[bool, int, int]:
    """``(ours, pid, uid)`` of the peer of a connected Unix socket: ``ours`` when it
    runs as this process's user (or the platform cannot tell: see
    :func:`peer_credentials`)."""
    credentials = peer_credentials(conn)
    if credentials is None:
        return True, 0, os.geteuid()
    pid, uid = credentials
    return uid == os.geteuid(), pid, uid


class RefusalLog:
    """Warnings about refused peers, at most one per ``every_s`` (default 60 s),
    each counting the refusals since the previous one: whoever can connect must not
    be able to fill a log, or slow the server down with writing it."""

    def __init__(self, logger: logging.Logger, every_s: float = 60.0) -> None:
        self._logger, self._every_s = logger, every_s
        self._count = 0  # refused since the last warning
        self._logged_at = -every_s - 1.0

    def refused(self, message: str, *args: Any) -> None:
        """Count one refusal; log ``message % args`` if none was logged within
        ``every_s``."""
        self._count += 1
        now = time.monotonic()
        if now - self._logged_at >= self._every_s:
            self._logger.warning(
                message + " (%d refused in the last %.0f s)", *args, self._count, self._every_s
            )
            self._count, self._logged_at = 0, now


class _Client:
    __slots__ = ("conn", "buffer", "deadline", "request", "complete")

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        self.conn = conn
        self.buffer = bytearray()
        self.deadline = deadline
        self.request: Any = None
        self.complete = False  # the whole request has arrived


class RequestServer:
    """Serves ``listener`` on one daemon thread (see the module doc).

    ``parse(buffer)`` returns the request once ``buffer`` holds all of it (None
    while more is needed) and raises ``ValueError`` for bytes that can never be
    one. ``answer(request)`` returns the reply bytes, :data:`NO_REPLY`, or None
    to be asked again later. ``admit(conn)``, if given, decides whether an
    accepted connection is served at all.
    """

    def __init__(
        self,
        listener: socket.socket,
        parse: Callable[[bytearray], Any],
        answer: Callable[[Any], bytes | None],
        *,
        name: str,
        max_request_bytes: int,
        request_timeout_s: float,
        answer_timeout_s: float,
        max_clients: int,
        retry_s: float,
        admit: Callable[[socket.socket], bool] | None = None,
    ) -> None:
        self._listener = listener
        self._parse, self._answer_with, self._admit = parse, answer, admit
        self.name = name
        self.max_request_bytes = max_request_bytes
        self.request_timeout_s, self.answer_timeout_s = request_timeout_s, answer_timeout_s
        self.max_clients, self.retry_s = max_clients, retry_s
        self._wake_r, self._wake_w = socket.socketpair()
        #: held by a wake-up's send and by the pair's close: a send racing the close
        #: could otherwise write into whatever file took the closed descriptor's number
        self._wake_lock = threading.Lock()
        for sock in (listener, self._wake_r, self._wake_w):
            sock.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._clients: dict[socket.socket, _Client] = {}  # oldest first
        self._accept_again_at: float | None = None  # accepting paused (out of fds)
        self._paused_before = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: a request waits for its answer (read unlocked by other threads; set
        #: before each try, so that a wake-up meanwhile is not lost)
        self.waiting = False

    def start(self) -> None:
        """Serve on a daemon thread."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, close the listener and every connection."""
        self._stopping = True
        if self._thread is None:  # never served: nothing else holds them
            self._listener.close()
            self._close_wake()
            return
        self._send_wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wake(self) -> None:
        """Ask the waiting requests again now (what they wait for may be ready)."""
        if self.waiting:
            self._send_wake()

    def _send_wake(self) -> None:
        with self._wake_lock:
            try:
                self._wake_w.send(b"\0")
            except OSError:  # full: a wake-up is pending already; or closed
                pass

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stopping:
                try:
                    if not self._serve_once():
                        return
                except Exception:  # keep serving: clients would otherwise wait long
                    log.warning("sessionstore: the %s server failed", self.name, exc_info=True)
                    time.sleep(0.01)
        finally:
            if self._stopping:
                for client in list(self._clients.values()):
                    self._drop(client)
                self._listener.close()
            self._close_wake()

    def _close_wake(self) -> None:
        """Close the selector and the wake-up pair, with the rest of what ``stop``
        closes (the product's servers live as long as their process; a process that
        stops many, as the suite does, would otherwise keep three descriptors for
        each). A wake-up sent after this meets a closed socket (``OSError``, ignored)."""
        self._selector.close()
        with self._wake_lock:
            self._wake_r.close()
            self._wake_w.close()

    def _serve_once(self) -> bool:
        """One round of the loop; False once the listener is gone."""
        for key, _ in self._selector.select(self._timeout()):
            sock = key.fileobj
            if sock is self._listener:
                if not self._accept():
                    return False
            elif sock is self._wake_r:
                try:
                    self._wake_r.recv(4096)
                except OSError:
                    pass
            elif sock in self._clients:  # not dropped earlier in this round
                self._read(self._clients[sock])
        now = time.monotonic()
        if self._accept_again_at is not None and now >= self._accept_again_at:
            self._accept_again_at = None
            self._selector.register(self._listener, selectors.EVENT_READ)
        if self.waiting:
            self._answer_waiting()
        for client in [c for c in self._clients.values() if c.deadline <= now]:
            self._drop(client)  # too slow to send, or its wait ran out
        return True

    def _timeout(self) -> float | None:
        times = [c.deadline for c in self._clients.values()]
        if self._accept_again_at is not None:
            times.append(self._accept_again_at)
        timeout = max(0.0, min(times) - time.monotonic()) if times else None
        if self.waiting:
            timeout = self.retry_s if timeout is None else min(timeout, self.retry_s)
        return timeout

    def _accept(self) -> bool:
        """Accept what is pending; False once the listener is gone."""
        for _ in range(self.max_clients):
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return True
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if not self._paused_before:
                        log.warning("sessionstore: %s paused for 0.1 s at times: %s", self.name, e)
                        self._paused_before = True
                    self._selector.unregister(self._listener)
                    self._accept_again_at = time.monotonic() + 0.1
                    return True
                if e.errno == errno.ECONNABORTED:
                    continue
                return False
            if self._admit is not None and not self._admit(conn):
                conn.close()
                continue
            if len(self._clients) >= self.max_clients:
                unsent = next((c for c in self._clients.values() if not c.complete), None)
                if unsent is None:  # every slot waits for an answer: ask again later
                    conn.close()
                    continue
                self._drop(unsent)
            conn.setblocking(False)
            client = _Client(conn, time.monotonic() + self.request_timeout_s)
            self._clients[conn] = client
            self._selector.register(conn, selectors.EVENT_READ)
            self._read(client)  # a client sends its request with the connect
        return True

    def _read(self, client: _Client) -> None:
        try:
            data = client.conn.recv(self.max_request_bytes - len(client.buffer))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if client.complete or not data:
            self._drop(client)  # hung up, or sent more than one request
            return
        client.buffer += data
        try:
            request = self._parse(client.buffer)
        except ValueError:
            self._drop(client)
            return
        if request is None:
            if len(client.buffer) >= self.max_request_bytes:
                self._drop(client)  # too large to be a request
            return
        client.request, client.complete = request, True
        client.buffer = bytearray()
        client.deadline = time.monotonic() + self.answer_timeout_s
        self._answer(client)

    def _answer(self, client: _Client) -> None:
        # set before trying, so that what we wait for finishing meanwhile wakes us
        self.waiting = True
        try:
            reply = self._answer_with(client.request)
        except Exception:  # the client falls back or tries again
            log.warning("sessionstore: a %s request failed", self.name, exc_info=True)
            self._drop(client)
            return
        if reply is None:
            return
        if reply:
            try:  # replies are small: the socket's buffer takes them whole
                client.conn.send(reply)
            except OSError:
                pass
        self._drop(client)

    def _answer_waiting(self) -> None:
        for client in [c for c in self._clients.values() if c.complete]:
            self._answer(client)
        self.waiting = any(c.complete for c in self._clients.values())

    def _drop(self, client: _Client) -> None:
        self._selector.unregister(client.conn)
        del self._clients[client.conn]
        client.conn.close()
