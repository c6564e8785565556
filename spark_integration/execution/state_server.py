"""State servers: a partition's state stays open in one process, whichever Python
worker Spark gives its task to.

Why. Spark runs a task in whichever Python worker of the executor is free, and
RocksDB admits one process per database, so a partition's next task finds its
database in the other worker about half the time, and at many partitions per
worker almost always closed (BENCHMARKS.md, "State in the Python workers at 200
partitions": 194 of 200 tasks per micro-batch reopen their database, 50-200 ms
each, the whole gap to Spark's own floor). No setting of Spark pins a partition to a worker.

How. Each executor runs ``count`` state servers (:data:`SERVERS_CONF`; by default
:data:`SERVERS_PER_SLOT` per task slot) and partition ``p``'s tasks always run in
server ``p mod count``, where its database stays open from batch to batch:

* a task, in its Python worker, connects to its server and sends the operator
  task (cloudpickled, as Spark shipped it), what it knows of its Spark task
  (:class:`~spark_integration.execution.runtime.TaskInfo`) and its input as an Arrow IPC
  stream; the server runs the operator task exactly as the worker would have (the
  same provider, commit and coordinator report) and streams the output back, with
  the task's metrics record, or the exception it raised, which the worker raises;
* the first task that finds no server starts it (``python -m
  spark_integration.execution.state_server``, the worker's interpreter and import path, its
  own session). A server listens on an abstract Unix socket named after its user,
  the executor's Python daemon (the worker's parent), ``count`` and its slot:
  binding the name is the lock, so two workers that start one at once get one;
* a server runs one task at a time. Two slots in a row of a micro-batch's tasks map
  to different servers, and with twice as many servers as slots the tasks that run
  at the same time rarely share one (a shared one makes the second task wait);
* it ends with its executor (it watches the daemon's pid) or after
  :data:`IDLE_EXIT_S` without tasks, once its databases are closed and its
  snapshot uploads done.

Trust, in both directions (docs/security.md): the socket name is predictable and an
abstract socket has no permissions, so anyone local could bind it first.

* A server serves only peers that run as our user (``SO_PEERCRED``): a request
  holds the cloudpickled task, which is code, the same trust PySpark's own daemon
  gives its JVM.
* A worker checks the server's credentials the same way right after it connects,
  before it sends anything: a server of another user gets no byte (the task's
  closure holds storage credentials and the coordinator's secret), the worker says
  so in one line and runs the task itself.
* Nothing a worker receives is unpickled: the task's metrics record is msgpack,
  an error is msgpack ``[type name, message, traceback text]`` rebuilt only as a
  type of :data:`REBUILT_ERRORS` (else a ``RuntimeError`` carrying the text), and
  every frame's size is checked against its kind's cap before a byte of it is
  read (:data:`MAX_FRAME_BYTES`).

Failures: a server that dies mid-task ends the connection, the task
fails with an error that names the server, Spark retries it, and the retry starts
a new server, which loads the partition from its local database or the checkpoint
like any new process (the commit protocol is unchanged, so nothing committed is
lost). A task that the server had not accepted yet (it was ending, idle) connects
again. Linux only (abstract sockets, ``pidfd``); elsewhere, or with
:data:`SERVERS_CONF` ``off``, tasks hold state in their worker as before.
"""

from __future__ import annotations

import argparse
import builtins
import logging
import os
import re
import selectors
import socket
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pyarrow as pa

from sessionstore.checkpoint.request_server import peer_credentials
from sessionstore.engine.memory import DEFAULT_MEMORY_MAX_MB, memory_budget
from sessionstore.errors import StatefulProcessorError
from spark_integration.planning.backend import CONF_PREFIX
from spark_integration.planning.session import driver_conf
from spark_integration.planning.session import master as session_master

__all__ = [
    "SERVERS_CONF",
    "SERVERS_PER_SLOT",
    "StateServerLost",
    "ForeignStateServer",
    "REBUILT_ERRORS",
    "ServedTask",
    "served",
    "server_count",
    "main",
]

log = logging.getLogger(__name__)

#: Spark conf key: state servers per executor: ``auto`` (default,
#: :data:`SERVERS_PER_SLOT` per task slot), ``off`` (tasks hold state in their own
#: Python worker) or a number.
SERVERS_CONF = CONF_PREFIX + "stateServers"
#: Servers per task slot by default (see the module doc: fewer waits for a server).
SERVERS_PER_SLOT = 2
#: A server's RocksDB memory budget when ``memory.maxMB`` is not set, in MiB.
DEFAULT_SERVER_MEMORY_MB = DEFAULT_MEMORY_MAX_MB // SERVERS_PER_SLOT
#: A server with no task for this long closes its databases and exits.
IDLE_EXIT_S = 600.0
#: How long a task waits for a server it started to listen.
START_TIMEOUT_S = 60.0
#: A peer silent this long mid-exchange is gone (an input that arrives slowly from
#: the shuffle is not silence: each batch resets it).
IO_TIMEOUT_S = 600.0
#: How long a connected worker may take to send its request (it sends it at once).
REQUEST_TIMEOUT_S = 10.0
#: The largest operator task accepted (its closure: plan, options, initial state).
MAX_TASK_BYTES = 1 << 30
_MAGIC = b"SSV1"
_REQUEST = struct.Struct("<4sIQ")  # magic, info bytes, task bytes
_FRAME = struct.Struct("<cQ")  # kind, payload bytes
#: Frames a server sends: accepted (its pid), output (an Arrow IPC stream), the
#: task's metrics record, the end, an error.
_ACCEPTED, _OUTPUT, _METRICS, _END, _ERROR = b"A", b"B", b"M", b"E", b"X"
#: The largest frame of each kind a worker reads (checked before reading it): an
#: output Arrow stream, a metrics record, an error (traceback text included).
MAX_FRAME_BYTES = {
    _ACCEPTED: 32, _OUTPUT: 1 << 31, _METRICS: 1 << 20, _END: 0, _ERROR: 1 << 20,
}  # fmt: skip
#: The longest traceback text an error frame carries (its end is kept).
MAX_TRACEBACK_CHARS = 256 * 1024
#: Exception types an error frame is rebuilt as (by name; any other type arrives as
#: a RuntimeError carrying its name, message and traceback): built-in types whose
#: constructor takes one message, and sessionstore's processor error.
REBUILT_ERRORS: dict[str, Callable[[str], BaseException]] = {
    name: getattr(builtins, name)
    for name in (
        "ValueError", "TypeError", "KeyError", "IndexError", "LookupError",
        "RuntimeError", "NotImplementedError", "AssertionError", "AttributeError",
        "ArithmeticError", "ZeroDivisionError", "OverflowError", "MemoryError",
        "OSError", "FileNotFoundError", "FileExistsError", "PermissionError",
        "TimeoutError", "ConnectionError", "UnicodeError", "RecursionError",
    )
}  # fmt: skip


class StateServerLost(RuntimeError):
    """The state server running a task ended before the task did, or broke the
    protocol (a frame too large, of an unknown kind, or malformed)."""


class ForeignStateServer(OSError):
    """The socket of a state server is held by a process of another user: nothing
    was sent to it (the worker runs its task itself)."""


# ----------------------------------------------------------------- planning
def server_count(spark: Any) -> int | None:
    """State servers per executor for operators built now: 0 (off), a number, or
    None when each executor decides (:data:`SERVERS_PER_SLOT` per core it has)."""
    value = spark.conf.get(SERVERS_CONF, "auto")
    text = str(value).strip().lower()
    if text in ("auto", ""):
        slots = _executor_slots(spark)
        return None if slots is None else SERVERS_PER_SLOT * slots
    if text in ("off", "false", "no"):
        return 0
    count = int(text) if text.isdigit() else -1
    if count < 0:
        raise ValueError(
            f"{SERVERS_CONF} must be 'auto', 'off' or a number of servers per executor, "
            f"got {value!r}"
        )
    return count


def _executor_slots(spark: Any) -> int | None:
    """Task slots per executor: from a local master, else ``spark.executor.cores``
    over ``spark.task.cpus``; None if the driver cannot tell."""
    conf, master = driver_conf(spark), session_master(spark).replace(" ", "")
    local = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if local:
        given = local.group(1)
        return 1 if given is None else (os.cpu_count() or 1) if given == "*" else int(given)
    cluster = re.fullmatch(r"local-cluster\[\d+,(\d+),\d+\]", master)
    cores = cluster.group(1) if cluster else conf.get("spark.executor.cores", None)
    if cores is None:
        return None
    return max(1, int(cores) // max(1, int(conf.get("spark.task.cpus", "1"))))


def served(spark: Any, task: Callable[[Iterator[pa.RecordBatch]], Iterator[Any]]) -> Any:
    """``task`` (an operator's ``mapInArrow`` function) run in its partition's state
    server, or ``task`` itself when :data:`SERVERS_CONF` is off."""
    count = server_count(spark)
    return task if count == 0 else ServedTask(task, count)


# ------------------------------------------------------------------- worker
_warned_unavailable = False


@dataclass
class ServedTask:
    """A ``mapInArrow`` function that runs ``task`` in the state server of its
    partition (picklable: it ships to the executors like the task it wraps)."""

    task: Callable[[Iterator[pa.RecordBatch]], Iterator[Any]]
    #: servers per executor; None: :data:`SERVERS_PER_SLOT` per core of the executor
    count: int | None

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

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from spark_integration.execution.runtime import keep_task_metrics, task_info

        global _warned_unavailable
        info = task_info()
        count = self.count or SERVERS_PER_SLOT * (os.cpu_count() or 1)
        slot = info.partition % count
        conn = None
        if sys.platform.startswith("linux"):
            try:
                conn, pid = _accepted(slot, count, info, self._pickled())
            except OSError as error:
                if not _warned_unavailable:
                    _warned_unavailable = True
                    log.warning(
                        "sessionstore: no state server for slot %d of %d (%s); tasks of "
                        "this worker keep their state in the worker", slot, count, error,
                    )  # fmt: skip
        if conn is None:
            yield from self.task(batches)
            return
        with conn:
            where = f"state server {pid} (slot {slot} of {count})"
            yield from _exchange(conn, where, info, batches, keep_task_metrics)


def _parent() -> int:
    """The executor's Python daemon: this worker's parent, whose end ends the servers
    it starts (the JVM itself where Spark starts workers without a daemon)."""
    return os.getppid()


def _address(parent: int, count: int, slot: int) -> str:
    """The abstract socket name of a state server (see the module doc)."""
    return f"\0sessionstore-state-{os.geteuid()}-{parent}-{count}-{slot}"


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


def _accepted(slot: int, count: int, info: Any, body: bytes) -> tuple[socket.socket, int]:
    """A connection to the server of ``slot`` that has accepted the pickled task
    ``body``, starting the server if there is none: ``(connection, server pid)``."""
    payload = msgpack.packb(tuple(vars(info).values()))
    parent = _parent()
    address = _address(parent, count, slot)
    deadline = time.monotonic() + START_TIMEOUT_S
    started: subprocess.Popen | None = None
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(IO_TIMEOUT_S)
            conn.connect(address)
            _check_server(conn, address)
            conn.sendall(_REQUEST.pack(_MAGIC, len(payload), len(body)) + payload + body)
            kind, data = _read_frame(conn)
            if kind == _ACCEPTED and data.isdigit():
                return conn, int(data)
            raise StateServerLost(f"unexpected first frame {kind!r} from {address[1:]!r}")
        except (ConnectionRefusedError, FileNotFoundError, ConnectionResetError, EOFError):
            # no server (or one that was ending, idle, and never saw this task)
            conn.close()
        except BaseException:
            conn.close()
            raise
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"state server {address[1:]!r} did not start within {START_TIMEOUT_S:.0f} s"
            )
        if started is None:
            # start every missing server of the executor at once: the first
            # micro-batch's tasks then wait for one start-up (about 0.5 s), not one each
            for other in range(count):
                if other != slot and not _listening(_address(parent, count, other)):
                    _start(_address(parent, count, other), parent)
        if started is None or started.poll() == 0:  # 0: another had the name; it may end
            started = _start(address, parent)
        elif started.returncode is not None:
            raise OSError(f"state server exited with {started.returncode}")
        time.sleep(0.01)


def _listening(address: str) -> bool:
    """Whether a server listens at ``address`` (a connection it will not read)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(address)
            return True
        except OSError:
            return False


_ENTRY = "import sys; from spark_integration.execution.state_server import main; sys.exit(main())"


def _start(address: str, parent: int) -> subprocess.Popen:
    """Start the server for ``address``, ending with process ``parent``, with this
    worker's interpreter and imports."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.Popen(
        # not ``-m``: the package imports this module, which runpy would run twice
        [sys.executable, "-c", _ENTRY, address[1:], str(parent)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # a daemon worker's stdout is the JVM's channel
        start_new_session=True,  # not killed with the worker's process group
    )


def _exchange(
    conn: socket.socket,
    where: str,
    info: Any,
    batches: Iterator[pa.RecordBatch],
    keep_metrics: Callable[[Any], None],
) -> Iterator[pa.RecordBatch]:
    """Send the input, then yield the output the server sends back."""
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
            kind, data = _read_frame(conn)
        except (EOFError, ConnectionResetError) as error:
            raise StateServerLost(
                f"sessionstore: {where} ended while running {what}; Spark retries the "
                "task, and the retry loads the partition's committed state again"
            ) from error
        if kind == _OUTPUT:
            yield from pa.ipc.open_stream(data)
        elif kind == _METRICS:
            keep_metrics(_metrics_of(data, where))
        elif kind == _END:
            return
        elif kind == _ERROR:
            error, text = _error_of(data)
            error.add_note(f"(raised in sessionstore {where}, running {what})\n{text}")
            raise error
        else:
            raise StateServerLost(f"sessionstore: {where} sent an unknown frame {kind!r}")


def _read_exact(conn: socket.socket, n: int) -> bytes:
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        read = conn.recv_into(view[got:], n - got)
        if not read:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        got += read
    return bytes(buffer)


def _read_frame(conn: socket.socket) -> tuple[bytes, bytes]:
    """One frame from a server: ``(kind, payload)``; :class:`StateServerLost` for an
    unknown kind or a size over its kind's cap (nothing of it is read then)."""
    kind, size = _FRAME.unpack(_read_exact(conn, _FRAME.size))
    cap = MAX_FRAME_BYTES.get(kind)
    if cap is None or size > cap:
        raise StateServerLost(
            f"sessionstore: a state server sent a frame of kind {kind!r} claiming {size} "
            f"bytes (at most {cap} for this kind); refused without reading it"
        )
    return kind, _read_exact(conn, size)


# ------------------------------------------------------------------- server
class _SocketReader:
    """A file-like reader over a socket for Arrow's IPC reader (exact reads)."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            raise ValueError("unbounded read")
        try:
            return _read_exact(self._conn, n)
        except EOFError:
            return b""

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def _send(conn: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    conn.sendall(_FRAME.pack(kind, len(payload)) + payload)


def _send_output(conn: socket.socket, out: Any) -> None:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, out.schema) as writer:
        if isinstance(out, pa.Table):
            writer.write_table(out)
        else:
            writer.write_batch(out)
    _send(conn, _OUTPUT, sink.getvalue().to_pybytes())


_PROCESSOR_ERROR = f"{StatefulProcessorError.__module__}.{StatefulProcessorError.__qualname__}"


def _type_name(error: BaseException) -> str:
    """``ValueError`` for built-in types, ``module.Qualname`` for the others."""
    cls = type(error)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _error_payload(error: BaseException) -> bytes:
    """The error frame: msgpack ``[type name, message, traceback text]`` (data only,
    see the module doc), within :data:`MAX_FRAME_BYTES`."""
    text = "".join(traceback.format_exception(error))[-MAX_TRACEBACK_CHARS:]
    message = str(error)[-MAX_TRACEBACK_CHARS:]
    return msgpack.packb([_type_name(error), message, text])


def _error_of(payload: bytes) -> tuple[BaseException, str]:
    """The exception of an error frame and the server's traceback: a type of
    :data:`REBUILT_ERRORS` (or :class:`~sessionstore.errors.StatefulProcessorError`)
    with its message, any other as a RuntimeError ``"<type>: <message>"``."""
    try:
        name, message, text = msgpack.unpackb(payload, raw=False)
        if not (isinstance(name, str) and isinstance(message, str) and isinstance(text, str)):
            raise TypeError("not three strings")
    except Exception as exc:
        return StateServerLost(f"sessionstore: a state server sent a malformed error ({exc})"), ""
    if name == _PROCESSOR_ERROR and message.startswith("["):
        error_class, _, rest = message[1:].partition("] ")
        return StatefulProcessorError(error_class, rest), text
    factory = REBUILT_ERRORS.get(name)
    return (RuntimeError(f"{name}: {message}") if factory is None else factory(message)), text


def _metrics_of(payload: bytes, where: str) -> Any:
    """The task's metrics record of a metrics frame (msgpack: a map or nil)."""
    try:
        record = msgpack.unpackb(payload, raw=False)
    except Exception as exc:
        raise StateServerLost(
            f"sessionstore: {where} sent a malformed metrics record ({exc})"
        ) from None
    if record is not None and not isinstance(record, dict):
        raise StateServerLost(f"sessionstore: {where} sent a metrics record that is not a map")
    return record


def serve_one(conn: socket.socket) -> None:
    """Run one task for the worker at the other end of ``conn`` (see the module doc)."""
    from pyspark import cloudpickle

    from spark_integration.execution.runtime import TaskInfo, running_task, take_task_metrics

    credentials = peer_credentials(conn)
    if credentials is not None and credentials[1] != os.geteuid():
        log.warning("refused a task from pid %d of uid %d", *credentials)
        return
    conn.settimeout(REQUEST_TIMEOUT_S)  # a worker sends its request with the connect
    try:
        head = _read_exact(conn, _REQUEST.size)
    except EOFError:
        return  # a probe (another worker checking that we listen)
    magic, info_size, task_size = _REQUEST.unpack(head)
    if magic != _MAGIC or info_size > 1 << 16 or task_size > MAX_TASK_BYTES:
        log.warning("dropped a malformed request (%r, %d, %d bytes)", magic, info_size, task_size)
        return
    info_bytes = _read_exact(conn, info_size)
    task_bytes = _read_exact(conn, task_size)
    conn.settimeout(IO_TIMEOUT_S)
    _send(conn, _ACCEPTED, str(os.getpid()).encode())
    try:
        info = TaskInfo(*msgpack.unpackb(info_bytes, raw=False))
        task = cloudpickle.loads(task_bytes)
        inputs = list(pa.ipc.open_stream(_SocketReader(conn)))
    except Exception as error:
        _send(conn, _ERROR, _error_payload(error))
        return
    take_task_metrics()  # a record left by a task that failed after its commit
    with running_task(info):
        outputs = task(iter(inputs))
        try:
            for out in outputs:
                _send_output(conn, out)
        except (BrokenPipeError, ConnectionResetError):
            outputs.close()  # the worker is gone: Spark runs the task again
            raise
        except Exception as error:
            _send(conn, _ERROR, _error_payload(error))
            return
    _send(conn, _METRICS, msgpack.packb(take_task_metrics()))
    _send(conn, _END)


def _bind(address: str) -> socket.socket | None:
    """Listen on ``address``; None if another server has it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
    except OSError:
        listener.close()
        return None
    listener.listen(64)
    return listener


def serve(listener: socket.socket, watch_pid: int, idle_exit_s: float = IDLE_EXIT_S) -> None:
    """Serve tasks on ``listener`` one at a time until process ``watch_pid`` ends
    (the executor's Python daemon) or no task came for ``idle_exit_s``."""
    from sessionstore.checkpoint.store_service import StoreService

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
        last = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    """Entry point of a state server process (started by :class:`ServedTask`)."""
    parser = argparse.ArgumentParser(prog="spark_integration.execution.state_server")
    parser.add_argument("name", help="the abstract socket name, without its NUL")
    parser.add_argument("watch", type=int, help="pid whose end ends this server")
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format=f"sessionstore state server {os.getpid()}: %(levelname)s %(message)s",
    )
    listener = _bind("\0" + args.name)
    if listener is None:
        return 0  # another worker started it first
    # without memory.maxMB, an executor's servers share what its workers had: a
    # server gets the default over SERVERS_PER_SLOT (a given maxMB is per server)
    memory_budget(DEFAULT_SERVER_MEMORY_MB)
    from spark_integration.execution.runtime import outlive_tasks

    outlive_tasks()
    serve(listener, args.watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
