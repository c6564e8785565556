"""StoreService: warm providers per process, handed over between processes on demand.

An engine like Spark runs a partition's task in whichever worker process is free,
so the same partition's database may be wanted by another process of the same
machine in the next micro-batch. Opening and closing the database for every task
is safe but cold (an open costs milliseconds, and the block cache starts empty;
figures in BENCHMARKS.md, "Figures quoted in code"). The
service keeps each provider open in the process that used it last and hands it
over when another process asks:

* every process that holds warm providers serves requests on one listener thread
  (a Unix socket in the Linux abstract namespace, so no file is left behind), from
  processes of its own user only (see ``_HandoverServer``);
* the holder writes its pid into ``<local>/<operator>/<partition>/owner``;
* a process that finds the database locked reads the owner's pid and asks it to
  release that database; the holder closes it as soon as no task of its own uses
  it, answers, and the asker opens it. A dead holder's lock disappears with it.

A holder that is running a task of its own answers late: its reply waits for the
GIL, which the task holds through long C calls, and then for a RocksDB close
(several times the cost of an open, measured in Spark tasks: BENCHMARKS.md). So
once a process has seen another one want its partitions (or has had to ask for
one), it closes its databases whenever it has been idle for ``PARK_AFTER_S``, as
between micro-batches; their providers stay, so the next open skips the
checkpoint checks. The next task then finds its partition free and pays one
RocksDB open, off every other task's path. A process that never meets another
one, such as a single Python worker per executor, keeps all of its partitions
warm.

Snapshot uploads also leave the task's path: after a commit that took a snapshot,
the upload (and pruning) runs on the service's background thread, serialised with
any other maintenance of that partition on this machine by the provider's lock.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sessionstore.checkpoint.partition.provider import StateStoreProvider
from sessionstore.checkpoint.records.layout import owner_file
from sessionstore.checkpoint.service.request_server import RefusalLog, RequestServer, same_user
from sessionstore.errors import StateDBLockedError
from sessionstore.process import this_process

__all__ = ["StoreService"]

log = logging.getLogger(__name__)
#: How long a process waits for a partition held by another one.
HANDOVER_TIMEOUT_S = 120.0
#: How long a process that shares partitions with others stays idle before it
#: closes its databases (see the module doc).
PARK_AFTER_S = 0.05
#: The interpreter's thread switch interval in a process that serves handovers.
SWITCH_INTERVAL_S = 0.0005
#: The longest handover request: a database path (Linux's PATH_MAX) and its newline.
MAX_REQUEST_BYTES = 4097
#: How long a connected client may take to send its request (an asker sends it with
#: the connect, so only a stuck or hostile client comes near this).
REQUEST_TIMEOUT_S = 1.0
#: Connections served at once. A new one beyond this drops the oldest connection that
#: has not sent its request yet (a flood cannot keep a real asker out).
MAX_CLIENTS = 64
#: How often a request for a database that a task of ours uses is tried again. The
#: end of a task, or of an idle close, wakes the server at once; this only covers the
#: rare other holders of a provider's lock, without waking a busy process often.
RETRY_S = 0.02
#: At most one warning per this interval about refused peers, or about handover
#: sockets of another user (a flood must not fill the executor's log).
REFUSED_LOG_EVERY_S = 60.0


def _addresses(pid: int) -> list[str]:
    """Where the service of process ``pid`` listens: the Linux abstract namespace
    (nothing on disk), else a socket file in the temporary directory."""
    return [
        f"\0sessionstore-store-service-{pid}",
        os.path.join(tempfile.gettempdir(), f"sessionstore-{pid}.sock"),
    ]


class _Entry:
    def __init__(self, provider: StateStoreProvider) -> None:
        self.provider = provider
        self.lock = threading.Lock()  # held while a task of this process uses it


class _HandoverServer:
    """Handover requests of one process (a :class:`RequestServer`).

    Trust: the socket is reachable by every local process (an abstract socket has no
    file permissions), so a connection is served only if its peer runs as our user
    (``SO_PEERCRED``); others are closed unanswered, with a warning, and change
    nothing. A request is one database path and a newline, at most
    ``MAX_REQUEST_BYTES``, sent within ``REQUEST_TIMEOUT_S``; anything else is
    dropped. At most ``MAX_CLIENTS`` connections are held, so memory, file
    descriptors and threads stay bounded whatever the clients do.

    ``release(db_path)`` closes the database if this process holds it and no task of
    ours uses it: True if it held it, False if not, None while a task uses it. Such
    a request waits, without blocking the others, and is tried again when
    :meth:`wake` is called (a task or an idle close ended) or every ``RETRY_S``.
    """

    def __init__(self, listener: socket.socket, release: Callable[[str], bool | None]) -> None:
        self._release = release
        self._refusals = RefusalLog(log, REFUSED_LOG_EVERY_S)
        self._server = RequestServer(
            listener,
            _parse_path,
            self._answer,
            name="sessionstore-handover",
            max_request_bytes=MAX_REQUEST_BYTES,
            request_timeout_s=REQUEST_TIMEOUT_S,
            answer_timeout_s=HANDOVER_TIMEOUT_S,  # the asker's patience
            max_clients=MAX_CLIENTS,
            retry_s=RETRY_S,
            admit=self._same_user,
        )

    def start(self) -> None:
        """Serve on a daemon thread."""
        self._server.start()

    def wake(self) -> None:
        """Try the waiting requests again now (a provider's lock was released)."""
        self._server.wake()

    def _answer(self, db_path: str) -> bytes | None:
        released = self._release(db_path)
        return None if released is None else b"ok\n" if released else b"no\n"

    def _same_user(self, conn: socket.socket) -> bool:
        ours, pid, uid = same_user(conn)  # not Linux: the socket file is ours, 0600
        if not ours:
            self._refusals.refused(
                "sessionstore: refused a handover request from pid %d of uid %d: only "
                "processes of uid %d may ask this worker for its databases",
                pid, uid, os.geteuid(),
            )  # fmt: skip
        return ours


def _parse_path(buffer: bytearray) -> str | None:
    """A handover request: a database path and a newline (None until it is whole)."""
    end = buffer.find(b"\n")
    return None if end < 0 else os.fsdecode(bytes(buffer[:end]))


class StoreService:
    """The warm providers of this process. Use :meth:`instance`."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._entries_lock = threading.Lock()
        self._server: _HandoverServer | None = None
        self._listen_failed = False
        self._maintenance: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._parking: list[threading.Thread] = []
        self._active = 0  # tasks of this process inside provider()
        #: another process wanted one of our partitions, or we one of its: from then
        #: on only the running task's database is kept open (see the module doc)
        self.contended = False
        #: warnings about handover sockets held by another user (rate-limited)
        self._foreign_holders = RefusalLog(log, REFUSED_LOG_EVERY_S)
        #: counters for tests and logs: databases opened, handed over, reused warm,
        #: closed at a task start (parked)
        self.stats = {"opened": 0, "reused": 0, "released": 0, "parked": 0, "maintenance": 0}

    @classmethod
    def instance(cls) -> StoreService:
        """The service of this process, in its ``store_service`` slot
        (:mod:`sessionstore.process`: a forked child gets its own)."""
        return this_process().get_or_make("store_service", cls)

    # ------------------------------------------------------------------ using
    @contextmanager
    def provider(
        self, key: str, factory: Callable[[], StateStoreProvider]
    ) -> Iterator[StateStoreProvider]:
        """The warm provider for ``key`` (made by ``factory`` the first time), with
        its database open and owned by this process for the duration of the block.

        If the block raises, the provider is closed and forgotten (a failed task may
        have left it in any state); the next use restores it properly.
        """
        listening = self._listen()
        with self._entries_lock:
            self._active += 1
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(factory())
                fresh = True
            else:
                fresh = False
        try:
            with entry.lock:
                with self._entries_lock:
                    # it may have been closed and unlisted while we waited (another
                    # provider of the same database took over): list it again, since
                    # it is about to be reopened (and owned) by us
                    self._entries.setdefault(key, entry)
                try:
                    if fresh or not entry.provider.local_open:
                        self._take(entry.provider)
                    else:
                        self.stats["reused"] += 1
                    yield entry.provider
                except BaseException:
                    self._forget(key, entry)
                    raise
                if not listening:  # nobody could ask us for it: do not keep it locked
                    self._forget(key, entry)
        finally:
            with self._entries_lock:
                self._active -= 1
            if self._server is not None:
                self._server.wake()  # in case another process waits for this database
        if self.contended:
            timer = threading.Timer(PARK_AFTER_S, self._park_if_idle)
            timer.daemon = True
            self._parking = [t for t in self._parking if t.is_alive()] + [timer]
            timer.start()

    def _park_if_idle(self) -> None:
        """Close this process's databases while no task of it runs (their providers
        stay listed, to be reopened when their partition comes back)."""
        with self._entries_lock:
            entries = list(self._entries.values())
        for entry in entries:
            if self._active or not entry.lock.acquire(blocking=False):
                return  # a task started: leave the rest for after it
            try:
                if entry.provider.local_open and not self._active:
                    entry.provider.close()
                    self.stats["parked"] += 1
            except Exception:  # the next open finds out; nothing committed is at risk
                log.warning("sessionstore: closing an idle database failed", exc_info=True)
            finally:
                entry.lock.release()
                if self._server is not None:
                    self._server.wake()

    def maintain_later(self, key: str) -> None:
        """Run ``do_maintenance`` of ``key``'s provider on the background thread."""
        with self._entries_lock:
            entry = self._entries.get(key)
        if entry is None:
            return
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(
                target=self._maintain_forever, name="sessionstore-maintenance", daemon=True
            )
            self._worker.start()
        self._maintenance.put(entry.provider)

    def drain(self, timeout: float = 300.0) -> None:
        """Wait for queued maintenance and parking to finish (tests, and a clean
        shutdown)."""
        deadline = time.monotonic() + timeout
        for thread in self._parking:
            thread.join(max(0.0, deadline - time.monotonic()))
        while self._maintenance.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def close_under(self, local_dir: str) -> int:
        """Close and forget the providers whose database lives under ``local_dir``
        (a scratch directory about to be deleted); how many there were."""
        root = os.path.join(os.path.abspath(local_dir), "")
        with self._entries_lock:
            entries = [
                (key, entry) for key, entry in self._entries.items()
                if os.path.abspath(entry.provider.local_db_path).startswith(root)
            ]  # fmt: skip
        for key, entry in entries:
            with entry.lock:
                self._forget(key, entry)
        return len(entries)

    def close_all(self) -> None:
        """Close every warm provider of this process."""
        self.drain()
        with self._entries_lock:
            entries = list(self._entries.items())
        for key, entry in entries:
            with entry.lock:
                self._forget(key, entry)

    # -------------------------------------------------------------- handover
    def _take(self, provider: StateStoreProvider) -> None:
        """Open ``provider``'s database, asking its holder to let go if need be."""
        deadline = time.monotonic() + HANDOVER_TIMEOUT_S
        while True:
            try:
                provider.open_local()
                break
            except StateDBLockedError:
                if time.monotonic() > deadline:
                    raise
                if not self._release_own(provider):
                    self._ask_owner(provider.local_db_path)
        self.stats["opened"] += 1
        os.makedirs(os.path.dirname(provider.local_db_path), exist_ok=True)
        owner = owner_file(provider.local_db_path)
        tmp = f"{owner}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, owner)

    def _release_own(self, provider: StateStoreProvider) -> bool:
        """Close this process's other providers of the same database (a query
        restarted with other settings gets a new provider for the same partition)."""
        with self._entries_lock:
            others = [
                (k, e)
                for k, e in self._entries.items()
                if e.provider is not provider and e.provider.local_db_path == provider.local_db_path
            ]
        for key, entry in others:
            with entry.lock:
                self._forget(key, entry)
        return bool(others)

    def _ask_owner(self, db_path: str) -> None:
        try:
            with open(owner_file(db_path)) as f:
                pid = int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            pid = 0
        if pid and pid != os.getpid():
            self.contended = True
            for address in _addresses(pid):
                try:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                        conn.settimeout(REQUEST_TIMEOUT_S)  # a listener answers connects at once
                        conn.connect(address)
                        if not self._holder_is_ours(conn, address):
                            continue  # nothing sent; the lock is tried again
                        conn.settimeout(HANDOVER_TIMEOUT_S)
                        conn.sendall(os.fsencode(db_path) + b"\n")
                        if conn.recv(16):  # "ok" or "no": either way, try the lock again
                            return
                        # dropped unanswered: not our user's process, or overloaded
                except OSError:
                    continue  # the owner is gone (its lock with it) or not listening yet
        time.sleep(0.05)

    def _holder_is_ours(self, conn: socket.socket, address: str) -> bool:
        """Whether the process listening at ``address`` runs as our user, checked
        before anything is sent: the name is predictable, so another local user may
        hold it, and would learn the path, or stall the asker until its timeout."""
        ours, pid, uid = same_user(conn)
        if not ours:
            self._foreign_holders.refused(
                "sessionstore: the handover socket %r is held by pid %d of uid %d, not "
                "uid %d: nothing was sent to it",
                address.lstrip("\0"), pid, uid, os.geteuid(),
            )  # fmt: skip
        return ours

    def _listen(self) -> bool:
        """Start the handover server once; False if no socket could be opened (then
        providers are closed after each use, as without a service)."""
        if self._server is not None:
            return True
        if self._listen_failed:
            return False
        for address in _addresses(os.getpid()):
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                if not address.startswith("\0") and os.path.exists(address):
                    os.unlink(address)  # left by a dead process that had our pid
                listener.bind(address)
                if not address.startswith("\0"):
                    os.chmod(address, 0o600)  # before listen: no other user ever connects
                listener.listen(MAX_CLIENTS)
            except OSError:
                listener.close()
                continue
            # A handover is served by this thread while a task of ours may keep the
            # GIL busy; with the default 5 ms switch interval each of the few GIL
            # hand-offs a release needs can wait that long, and a shorter interval
            # made handovers from a busy holder clearly faster (BENCHMARKS.md,
            # "Figures quoted in code"). Only threads that ask for the GIL are
            # affected, and ours mostly wait on sockets.
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            self._server = _HandoverServer(listener, self._try_release)
            self._server.start()
            return True
        log.warning("sessionstore: no handover socket; databases are closed after each task")
        self._listen_failed = True
        return False

    def _try_release(self, db_path: str) -> bool | None:
        """Close the database at ``db_path`` (asked for by a process of our user) once
        no task of ours uses it; its provider stays listed, to reopen the database
        if the partition comes back. Only a database this process holds is touched.
        True if we held it, False if not, None while a task of ours uses it."""
        self.contended = True
        with self._entries_lock:
            found = [e for e in self._entries.values() if e.provider.local_db_path == db_path]
        for entry in found:
            if not entry.lock.acquire(blocking=False):
                return None
            try:
                if entry.provider.local_open:
                    entry.provider.close()
                    self.stats["released"] += 1
            finally:
                entry.lock.release()
        return bool(found)

    def _forget(self, key: str, entry: _Entry) -> None:
        with self._entries_lock:
            if self._entries.get(key) is entry:
                del self._entries[key]
        entry.provider.close()

    # ----------------------------------------------------------- maintenance
    def _maintain_forever(self) -> None:
        while True:
            provider = self._maintenance.get()
            try:
                provider.do_maintenance()
                self.stats["maintenance"] += 1
            except Exception:  # the next maintenance retries; changelogs are the truth
                log.warning("sessionstore: background maintenance failed", exc_info=True)
            finally:
                self._maintenance.task_done()
