"""The wire protocol between a Python worker and its state server, on a local
stream socket.

A worker sends one request: :data:`REQUEST` (magic :data:`MAGIC`, the size of the
task's :class:`~spark_integration.execution.context.TaskInfo` as msgpack, the size
of the cloudpickled task), both bodies, then its input as one Arrow IPC stream.
The server answers with frames, :data:`FRAME` (a kind byte, the payload size)
followed by the payload: :data:`ACCEPTED` (its pid, before the input is read),
then :data:`OUTPUT` (an Arrow IPC stream) per output batch, :data:`METRICS` (the
task's metrics record, msgpack) and :data:`END`, or :data:`ERROR`.

Nothing a worker receives is unpickled (docs/security.md): the metrics record is
msgpack, an error is msgpack ``[type name, message, traceback text]`` rebuilt only
as a type of :data:`REBUILT_ERRORS` (else a ``RuntimeError`` carrying the text),
and every frame's size is checked against its kind's cap before a byte of it is
read (:data:`MAX_FRAME_BYTES`)."""

from __future__ import annotations

import builtins
import os
import socket
import struct
import traceback
from collections.abc import Callable
from typing import Any

import msgpack
import pyarrow as pa

from sessionstore.errors import StatefulProcessorError

__all__ = [
    "MAGIC",
    "REQUEST",
    "FRAME",
    "ACCEPTED",
    "OUTPUT",
    "METRICS",
    "END",
    "ERROR",
    "MAX_TASK_BYTES",
    "MAX_INFO_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_TRACEBACK_CHARS",
    "REBUILT_ERRORS",
    "StateServerLost",
    "server_address",
    "read_exact",
    "read_frame",
    "send_frame",
    "send_output",
    "SocketReader",
    "error_payload",
    "error_of",
    "metrics_of",
]

MAGIC = b"SSV1"
#: A request's head: magic, info bytes, task bytes.
REQUEST = struct.Struct("<4sIQ")
#: A frame's head: kind, payload bytes.
FRAME = struct.Struct("<cQ")
#: Frames a server sends: accepted (its pid), output (an Arrow IPC stream), the
#: task's metrics record, the end, an error.
ACCEPTED, OUTPUT, METRICS, END, ERROR = b"A", b"B", b"M", b"E", b"X"
#: The largest operator task accepted (its closure: plan, options, initial state).
MAX_TASK_BYTES = 1 << 30
#: The largest task info accepted.
MAX_INFO_BYTES = 1 << 16
#: The largest frame of each kind a worker reads (checked before reading it): an
#: output Arrow stream, a metrics record, an error (traceback text included).
MAX_FRAME_BYTES = {
    ACCEPTED: 32, OUTPUT: 1 << 31, METRICS: 1 << 20, END: 0, ERROR: 1 << 20,
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
_PROCESSOR_ERROR = f"{StatefulProcessorError.__module__}.{StatefulProcessorError.__qualname__}"


class StateServerLost(RuntimeError):
    """The state server running a task ended before the task did, or broke the
    protocol (a frame too large, of an unknown kind, or malformed)."""


def server_address(parent: int, count: int, slot: int) -> str:
    """The abstract socket name of the server of ``slot`` of ``count``, ending with
    process ``parent`` (the executor's Python daemon), of this OS user."""
    return f"\0sessionstore-state-{os.geteuid()}-{parent}-{count}-{slot}"


def bind(address: str) -> socket.socket | None:
    """A socket listening on ``address``; None if a process holds the name already
    (the name is the lock: the worker that binds it starts the server, handing it
    the socket, and every other worker connects to it)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
    except OSError:
        listener.close()
        return None
    listener.listen(64)
    return listener


def read_exact(conn: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``conn``; ``EOFError`` if it closes first."""
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        read = conn.recv_into(view[got:], n - got)
        if not read:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        got += read
    return bytes(buffer)


def read_frame(conn: socket.socket) -> tuple[bytes, bytes]:
    """One frame from a server: ``(kind, payload)``; :class:`StateServerLost` for an
    unknown kind or a size over its kind's cap (nothing of it is read then)."""
    kind, size = FRAME.unpack(read_exact(conn, FRAME.size))
    cap = MAX_FRAME_BYTES.get(kind)
    if cap is None or size > cap:
        raise StateServerLost(
            f"sessionstore: a state server sent a frame of kind {kind!r} claiming {size} "
            f"bytes (at most {cap} for this kind); refused without reading it"
        )
    return kind, read_exact(conn, size)


def send_frame(conn: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    """Send one frame of ``kind``."""
    conn.sendall(FRAME.pack(kind, len(payload)) + payload)


def send_output(conn: socket.socket, out: Any) -> None:
    """Send an output batch or table as an :data:`OUTPUT` frame."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, out.schema) as writer:
        if isinstance(out, pa.Table):
            writer.write_table(out)
        else:
            writer.write_batch(out)
    send_frame(conn, OUTPUT, sink.getvalue().to_pybytes())


class SocketReader:
    """A file-like reader over a socket for Arrow's IPC reader (exact reads)."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        """Exactly ``n`` bytes, or none at the end of the stream."""
        if n is None or n < 0:
            raise ValueError("unbounded read")
        try:
            return read_exact(self._conn, n)
        except EOFError:
            return b""

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def _type_name(error: BaseException) -> str:
    """``ValueError`` for built-in types, ``module.Qualname`` for the others."""
    cls = type(error)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def error_payload(error: BaseException) -> bytes:
    """The error frame: msgpack ``[type name, message, traceback text]`` (data only,
    see the module doc), within :data:`MAX_FRAME_BYTES`."""
    text = "".join(traceback.format_exception(error))[-MAX_TRACEBACK_CHARS:]
    message = str(error)[-MAX_TRACEBACK_CHARS:]
    return msgpack.packb([_type_name(error), message, text])


def error_of(payload: bytes) -> tuple[BaseException, str]:
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


def metrics_of(payload: bytes, where: str) -> Any:
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
