"""A state server process: listens on its abstract socket, serves one task at a
time for workers of its own user, and ends with its executor or when idle (see
the package doc). Its entry point is :func:`main`, run as ``python -m
spark_integration.execution.state_server``."""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import selectors
import socket
import sys
import time

import msgpack
import pyarrow as pa

from sessionstore.arrow_pandas import pandas_on_demand
from sessionstore.checkpoint.service.request_server import RefusalLog, same_user
from sessionstore.engine.memory import memory_budget
from spark_integration.execution.context import TaskContext, TaskInfo
from spark_integration.execution.long_lived import freeze_long_lived
from spark_integration.execution.state_server.config import (
    DEFAULT_SERVER_MEMORY_MB,
    IDLE_EXIT_S,
    IO_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
)
from spark_integration.execution.state_server.protocol import (
    ACCEPTED,
    END,
    ERROR,
    MAGIC,
    MAX_INFO_BYTES,
    MAX_TASK_BYTES,
    METRICS,
    REQUEST,
    SocketReader,
    error_payload,
    read_exact,
    send_frame,
    send_output,
)

__all__ = ["serve_one", "serve", "main"]

log = logging.getLogger(__name__)
#: refused workers of another user: one warning a minute at most, with the count
_refusals = RefusalLog(log)


def serve_one(conn: socket.socket) -> None:
    """Run one task for the worker at the other end of ``conn`` (see the package doc)."""
    ours, pid, uid = same_user(conn)
    if not ours:
        _refusals.refused("refused a task from pid %d of uid %d", pid, uid)
        return
    conn.settimeout(REQUEST_TIMEOUT_S)  # a worker sends its request with the connect
    try:
        head = read_exact(conn, REQUEST.size)
    except EOFError:
        return  # a probe (another worker checking that we listen)
    magic, info_size, task_size = REQUEST.unpack(head)
    if magic != MAGIC or info_size > MAX_INFO_BYTES or task_size > MAX_TASK_BYTES:
        log.warning("dropped a malformed request (%r, %d, %d bytes)", magic, info_size, task_size)
        return
    info_bytes = read_exact(conn, info_size)
    task_bytes = read_exact(conn, task_size)
    conn.settimeout(IO_TIMEOUT_S)
    send_frame(conn, ACCEPTED, str(os.getpid()).encode())
    try:
        info = TaskInfo(*msgpack.unpackb(info_bytes, raw=False))
        # cloudpickle's loads is pickle's: importing it would import pyspark, whose
        # modules a server compiles from Spark's pyspark.zip (no bytecode cache
        # there) at every start, 1-2 s of CPU; the task imports what it needs
        task = pickle.loads(task_bytes)
        inputs = list(pa.ipc.open_stream(SocketReader(conn)))
    except Exception as error:
        send_frame(conn, ERROR, error_payload(error))
        return
    # this process outlives its tasks: snapshot uploads run after the commit
    context = TaskContext(info, outlives_task=True)
    outputs = task.run(iter(inputs), context)
    try:
        for out in outputs:
            send_output(conn, out)
    except (BrokenPipeError, ConnectionResetError):
        outputs.close()  # the worker is gone: Spark runs the task again
        raise
    except Exception as error:
        send_frame(conn, ERROR, error_payload(error))
        return
    send_frame(conn, METRICS, msgpack.packb(context.metrics))
    send_frame(conn, END)


def serve(listener: socket.socket, watch_pid: int, idle_exit_s: float = IDLE_EXIT_S) -> None:
    """Serve tasks on ``listener`` one at a time until process ``watch_pid`` ends
    (the executor's Python daemon) or no task came for ``idle_exit_s``."""
    from sessionstore.checkpoint.service.store_service import StoreService

    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "task")
    try:
        selector.register(os.pidfd_open(watch_pid), selectors.EVENT_READ, "parent")
    except ProcessLookupError:
        return  # the executor ended before we started
    last = time.monotonic()
    while True:
        events = selector.select(max(0.0, last + idle_exit_s - time.monotonic()))
        if any(key.data == "parent" for key, _ in events):
            # the executor is gone: nobody will ask for these databases again, and
            # everything committed is durable (as when a worker dies with it)
            os._exit(0)
        if not events:
            listener.close()  # a task that connects now starts a new server
            StoreService.instance().close_all()
            return
        conn, _ = listener.accept()
        with conn:
            try:
                serve_one(conn)
            except Exception:  # the worker fails its task; keep serving the others
                log.warning("sessionstore state server: a task failed", exc_info=True)
        # the worker has its answer and the task's objects are gone: what it
        # imported stays out of later collections (long_lived)
        freeze_long_lived()
        last = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    """Entry point of a state server process (started by a worker's
    :class:`~spark_integration.execution.state_server.client.ServedTask`)."""
    parser = argparse.ArgumentParser(prog="spark_integration.execution.state_server")
    parser.add_argument("name", help="the abstract socket name, without its NUL")
    parser.add_argument("watch", type=int, help="pid whose end ends this server")
    parser.add_argument(
        "--listen-fd", type=int, required=True,
        help="a socket listening on NAME, bound by the worker that started this server",
    )  # fmt: skip
    args = parser.parse_args(argv)
    pandas_on_demand()  # pandas only for a task that imports it (sessionstore.arrow_pandas)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format=f"sessionstore state server {os.getpid()}: %(levelname)s %(message)s",
    )
    listener = socket.socket(fileno=args.listen_fd)
    if listener.getsockname() != os.fsencode("\0" + args.name):
        raise SystemExit(f"--listen-fd {args.listen_fd} is not a socket bound to {args.name!r}")
    # without memory.maxMB, an executor's servers share what its workers had: a
    # server gets the default over SERVERS_PER_SLOT (a given maxMB is per server)
    memory_budget(DEFAULT_SERVER_MEMORY_MB)
    serve(listener, args.watch)
    return 0
