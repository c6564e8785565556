"""The worker's side of a state server: :class:`ServedTask` sends an operator task
to the server of its partition, starting the server when there is none, checks
the server runs as our user before sending anything, and streams the input there
and the output back (see the package doc)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pyarrow as pa

from sessionstore.checkpoint.service.request_server import peer_credentials
from sessionstore.process import this_process
from spark_integration.conf.pyspark_archives import without_installed_archives
from spark_integration.execution.context import ContextTask, TaskContext, TaskInfo
from spark_integration.execution.state_server.config import (
    IO_TIMEOUT_S,
    START_TIMEOUT_S,
    servers_here,
)
from spark_integration.execution.state_server.protocol import (
    ACCEPTED,
    END,
    ERROR,
    MAGIC,
    METRICS,
    OUTPUT,
    REQUEST,
    StateServerLost,
    bind,
    error_of,
    metrics_of,
    read_frame,
    server_address,
)

__all__ = ["ForeignStateServer", "ServedTask", "served", "daemon_pid", "SERVER_MODULE"]

log = logging.getLogger(__name__)

#: The module a server process runs (``python -m``).
SERVER_MODULE = "spark_integration.execution.state_server"


class ForeignStateServer(OSError):
    """The socket of a state server is held by a process of another user: nothing
    was sent to it (the worker runs its task itself)."""


def served(task: ContextTask, count: int | None, partitions: int | None = None) -> ContextTask:
    """``task`` (an operator's task over ``partitions`` state partitions) run in its
    partition's state server, of ``count`` per executor (:func:`~.config.server_count`:
    None, each executor decides), or ``task`` itself when the count is 0
    (:data:`~.config.SERVERS_CONF` is off)."""
    return task if count == 0 else ServedTask(task, count, partitions)


#: The once-per-process event of a slot without a server (:mod:`sessionstore.process`).
UNAVAILABLE_WARNING = "state_server_unavailable"


@dataclass
class ServedTask:
    """An operator task that runs ``task`` in the state server of its partition
    (picklable: it ships to the executors like the task it wraps)."""

    task: ContextTask
    #: servers per executor; None: SERVERS_PER_SLOT per core of the executor
    count: int | None
    #: the operator's state partitions, if known: a slot no partition maps to
    #: (``slot >= partitions``) is never started for this operator
    partitions: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_body"}

    def _pickled(self) -> bytes:
        """``task`` cloudpickled, once per Spark task: a Spark task that runs many
        partitions (spark_integration.planning.placement) sends the same task for each."""
        body = self.__dict__.get("_body")
        if body is None:
            from pyspark import cloudpickle

            body = self.__dict__["_body"] = cloudpickle.dumps(self.task)
        return body

    def run(self, batches: Iterator[pa.RecordBatch], context: TaskContext) -> Iterator[Any]:
        """``task``'s output, run as ``context`` in its partition's server (its
        metrics record sent back into ``context``), or here when there is none."""
        info = context.info
        count = servers_here(self.count)
        slot = info.partition % count
        conn = None
        if sys.platform.startswith("linux"):
            try:
                used = count if self.partitions is None else min(count, self.partitions)
                conn, pid = _accepted(slot, count, used, info, self._pickled())
            except OSError as error:
                if this_process().first_time(UNAVAILABLE_WARNING):
                    log.warning(
                        "sessionstore: no state server for slot %d of %d (%s); tasks of "
                        "this worker keep their state in the worker", slot, count, error,
                    )  # fmt: skip
        if conn is None:
            yield from self.task.run(batches, context)
            return
        with conn:
            where = f"state server {pid} (slot {slot} of {count})"
            yield from _exchange(conn, where, context, batches)


def daemon_pid() -> int:
    """The executor's Python daemon: this worker's parent, whose end ends the servers
    it starts (the JVM itself where Spark starts workers without a daemon)."""
    return os.getppid()


def _check_server(conn: socket.socket, address: str) -> None:
    """Raise :class:`ForeignStateServer` unless the process listening at the other
    end of ``conn`` runs as our user (checked before anything is sent)."""
    credentials = peer_credentials(conn)
    if credentials is not None and credentials[1] != os.geteuid():
        pid, uid = credentials
        raise ForeignStateServer(
            f"the state server socket {address[1:]!r} is held by pid {pid} of uid {uid}, "
            f"not uid {os.geteuid()}: nothing was sent to it"
        )


def _accepted(
    slot: int, count: int, used: int, info: TaskInfo, body: bytes
) -> tuple[socket.socket, int]:
    """A connection to the server of ``slot`` that has accepted the pickled task
    ``body``, starting the server if there is none, and with it the other missing
    servers of the first ``used`` slots (the slots the operator's partitions map
    to): ``(connection, server pid)``."""
    payload = msgpack.packb(tuple(vars(info).values()))
    parent = daemon_pid()
    address = server_address(parent, count, slot)
    deadline = time.monotonic() + START_TIMEOUT_S
    started: subprocess.Popen | None = None
    others_started = False
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(IO_TIMEOUT_S)
            conn.connect(address)
            _check_server(conn, address)
            conn.sendall(REQUEST.pack(MAGIC, len(payload), len(body)) + payload + body)
            kind, data = read_frame(conn)
            if kind == ACCEPTED and data.isdigit():
                return conn, int(data)
            raise StateServerLost(f"unexpected first frame {kind!r} from {address[1:]!r}")
        except (
            ConnectionRefusedError, FileNotFoundError, ConnectionResetError, BrokenPipeError,
            EOFError,
        ):  # fmt: skip
            # no server, or one that ended before it accepted this task (idle, or
            # dead while it started): the task never ran, so it goes to a new one
            conn.close()
        except BaseException:
            conn.close()
            raise
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"state server {address[1:]!r} did not start within {START_TIMEOUT_S:.0f} s"
            )
        if not others_started:
            # start every missing server the operator uses at once: the first
            # micro-batch's tasks then wait for one start-up (about 0.5 s), not one
            # each; a slot none of its partitions maps to is left to an operator
            # that needs it (each server costs a process and its imports). A slot
            # whose name another worker holds is that worker's to start.
            others_started = True
            for other in range(used):
                if other != slot:
                    _start(server_address(parent, count, other), parent)
        if started is None or started.poll() is not None:
            if started is not None and started.returncode != 0:
                raise OSError(f"state server exited with {started.returncode}")
            # None: the name is held, by a server starting or ending (connect again)
            started = _start(address, parent) or started
        time.sleep(0.01)


def _start(address: str, parent: int) -> subprocess.Popen | None:
    """Start the server for ``address``, ending with process ``parent``, with this
    worker's interpreter and imports; None if a process holds the name already.

    The worker binds the name and hands the listening socket to the server: the
    name is the lock, taken before anything starts, so workers that find no server
    at once start one process between them, and the tasks that connect while the
    server imports its modules wait in the socket's backlog instead of polling."""
    listener = bind(address)
    if listener is None:
        return None
    env = dict(os.environ)
    # bytecode-cached PySpark where the worker's is a pip install's archive:
    # unpickling a task imports it (cloudpickle's by-value functions)
    env["PYTHONPATH"] = os.pathsep.join(p for p in without_installed_archives(sys.path) if p)
    fd = listener.fileno()
    try:
        return subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, address[1:], str(parent), "--listen-fd", str(fd)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # a daemon worker's stdout is the JVM's channel
            start_new_session=True,  # not killed with the worker's process group
            pass_fds=(fd,),
        )
    finally:
        listener.close()  # the server's now: the name goes when the server ends


def _exchange(
    conn: socket.socket,
    where: str,
    context: TaskContext,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Send the input, then yield the output the server sends back (its metrics
    record into ``context``)."""
    info = context.info
    out = conn.makefile("wb", buffering=1 << 16)
    try:
        writer = None
        for batch in batches:
            if writer is None:
                writer = pa.ipc.new_stream(out, batch.schema)
            writer.write_batch(batch)
        if writer is None:
            writer = pa.ipc.new_stream(out, pa.schema([]))
        writer.close()
        out.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server ended or refused the task early: its answer says which
    what = f"partition {info.partition} of micro-batch {info.batch_id} (attempt {info.attempt})"
    while True:
        try:
            kind, data = read_frame(conn)
        except (EOFError, ConnectionResetError) as error:
            raise StateServerLost(
                f"sessionstore: {where} ended while running {what}; Spark retries the "
                "task, and the retry loads the partition's committed state again"
            ) from error
        if kind == OUTPUT:
            yield from pa.ipc.open_stream(data)
        elif kind == METRICS:
            context.metrics = metrics_of(data, where)
        elif kind == END:
            return
        elif kind == ERROR:
            error, text = error_of(data)
            error.add_note(f"(raised in sessionstore {where}, running {what})\n{text}")
            raise error
        else:
            raise StateServerLost(f"sessionstore: {where} sent an unknown frame {kind!r}")
