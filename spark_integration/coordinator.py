"""The coordinator: one small TCP server in the driver, like Flink's
OperatorCoordinator, so that tasks share their event time without object storage,
and their state metrics reach the driver with no request of their own (every
operator's tasks report after their commit; :meth:`Coordinator.batch_metrics`).

Each task of an event-time operator (``sessionize``, ``window_aggregate``) tells
the coordinator its partition's event time once its commit is durable
(:func:`report`), and each task of the next micro-batch asks it for the largest
one (:func:`ask`): one round trip to the driver each, no object-store request.
The durable record stays in the changelog headers
(:mod:`sessionstore.checkpoint.event_time`), and the coordinator's answer always
equals it:

* it answers from reports when it holds every partition's report of the batch,
  from the same query run (a report follows the durable commit, and a batch is
  deterministic, so a retried task reports the same time);
* otherwise (the driver restarted, a report was lost, a new run of the query) it
  reads the durable records once per batch (one ranged read per partition, on a
  thread of the driver, while its server keeps serving) and caches the answer;
* a task that cannot reach it (Spark Connect, where the planning process is not
  the driver; a firewall) reads the durable records itself, as before the
  coordinator existed, and stops trying for :data:`RETRY_AFTER_S`.

It is also the arbiter between attempts of one batch on an object store
(:func:`claim`, :mod:`sessionstore.checkpoint.lineage`): before it uploads its
changelog, a task claims (partition, version) with its commit id; the first claim
wins, and a later attempt is told the winner and adopts its commit. No storage
request: object stores offer pyarrow no conditional write.

One coordinator per driver process serves every operator of every query. It binds
the driver's address (``spark.driver.bindAddress``, else ``spark.driver.host``;
127.0.0.1 in local mode) on ``spark.sessionstore.coordinator.port`` (default: any
free port). An operator is registered when it is planned and gets a random secret
token, which travels to its tasks inside the ``mapInArrow`` closure; a request
without a registered token is dropped unanswered. The server is a
:class:`~sessionstore.checkpoint.request_server.RequestServer`: one selector
thread, requests of at most :data:`MAX_REQUEST_BYTES`, short timeouts, at most
:data:`MAX_CLIENTS` connections.

Wire format: a request is ``length u32 ‖ msgpack map``; so is a reply.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgpack

from sessionstore.checkpoint.event_time import durable_event_time, max_event_time
from sessionstore.checkpoint.filesystem import Storage, open_filesystem
from sessionstore.checkpoint.lineage import CommitArbiter
from sessionstore.checkpoint.request_server import NO_REPLY, RequestServer

__all__ = [
    "CoordinatorAddress",
    "Coordinator",
    "coordinator_for",
    "driver_coordinator",
    "report",
    "ask",
    "claim",
    "commit_arbiter",
    "shared_event_time",
    "ENABLED_CONF",
    "PORT_CONF",
]

log = logging.getLogger(__name__)

#: Spark conf: ``false`` turns the coordinator off (every task then reads the
#: durable records itself, P reads per task).
ENABLED_CONF = "spark.sessionstore.coordinator.enabled"
#: Spark conf: the driver port the coordinator listens on (0, the default: any).
PORT_CONF = "spark.sessionstore.coordinator.port"

#: The largest request: a token, a few numbers and a task's metrics record.
MAX_REQUEST_BYTES = 64 * 1024
#: How long a connected client may take to send its request.
REQUEST_TIMEOUT_S = 2.0
#: How long an ask may wait for the durable records (P ranged reads on the driver).
ANSWER_TIMEOUT_S = 120.0
#: Connections served at once (the tasks of a micro-batch ask at about the same
#: time; more wait in the listen backlog).
MAX_CLIENTS = 256
#: How often a waiting ask is tried again (a finished read also wakes the server).
RETRY_S = 0.05
#: How long a task waits to connect to the coordinator before it reads the durable
#: records itself; after a failure its worker stops trying for RETRY_AFTER_S.
CONNECT_TIMEOUT_S = 2.0
RETRY_AFTER_S = 60.0
#: Batches (per query run) whose reports, and batches whose durable answers, are
#: kept per operator; runs kept per operator.
KEEP_BATCHES = 4
KEEP_RUNS = 4
#: Versions whose winning claim is kept per partition (attempts of one batch
#: overlap; a version older than these is never claimed again by a live query).
KEEP_CLAIMS = 8

_LENGTH = struct.Struct(">I")


@dataclass(frozen=True)
class CoordinatorAddress:
    """Where a task reaches its operator's coordinator, and the operator's token
    (travels to the tasks pickled with them)."""

    host: str
    port: int
    token: str

    def __repr__(self) -> str:  # the token is a secret: never logged
        return f"CoordinatorAddress({self.host!r}, {self.port})"


def _frame(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


def _parse(buffer: bytearray) -> dict[str, Any] | None:
    """A whole request from ``buffer`` (None until it has arrived); ``ValueError``
    for bytes that are not one."""
    if len(buffer) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack_from(buffer)
    if length > MAX_REQUEST_BYTES - _LENGTH.size:
        raise ValueError(f"a request of {length} bytes")
    if len(buffer) < _LENGTH.size + length:
        return None
    if len(buffer) > _LENGTH.size + length:
        raise ValueError("bytes after the request")
    try:
        request = msgpack.unpackb(bytes(buffer[_LENGTH.size :]), raw=False)
    except Exception as exc:
        raise ValueError(f"not msgpack: {exc}") from None
    if not isinstance(request, dict):
        raise ValueError("not a map")
    return request


class _Operator:
    """What the coordinator knows of one operator: its reports and answers."""

    def __init__(self, storage: Storage, num_partitions: int) -> None:
        self.storage, self.num_partitions = storage, num_partitions
        self.lock = threading.Lock()
        #: (run, batch) -> {partition: event time}; and the tasks' metrics records
        self.reports: OrderedDict[tuple[Any, int], dict[int, int | None]] = OrderedDict()
        self.metrics: dict[tuple[Any, int], dict[int, Any]] = {}
        #: (run, batch) -> the durable answer, being read or read (per run too: a
        #: query restarted on a new Spark checkpoint rewrites the same versions)
        self.durable: OrderedDict[tuple[Any, int], Future] = OrderedDict()
        #: partition -> version -> (commit, parent) of the claim that won it
        self.claims: dict[int, OrderedDict[int, tuple[str, str | None]]] = {}
        #: where answers came from, for tests and logs
        self.stats = {"reports": 0, "answered_from_reports": 0, "durable_reads": 0}

    def claim(
        self, partition: int, version: int, commit: str, parent: str | None,
        supersede: str | None,
    ) -> str:  # fmt: skip
        """The commit that wins ``version`` of ``partition``: the first claim, unless
        the held one was built on another parent (a lineage abandoned since) or is
        the one the caller waited for in vain (``supersede``)."""
        with self.lock:
            held = self.claims.setdefault(partition, OrderedDict())
            winner = held.get(version)
            if winner is None or winner[1] != parent or winner[0] == supersede:
                held[version] = winner = (commit, parent)
                held.move_to_end(version)
                while len(held) > KEEP_CLAIMS:
                    held.popitem(last=False)
            return winner[0]

    def add_report(
        self, run: Any, batch: int, partition: int, event_time: int | None, metrics: Any
    ) -> None:
        with self.lock:
            key = (run, batch)
            self.reports.setdefault(key, {})[partition] = event_time
            self.metrics.setdefault(key, {})[partition] = metrics
            self.stats["reports"] += 1
            newest = max(b for r, b in self.reports if r == run)
            runs = list(dict.fromkeys(r for r, _ in self.reports))
            for old in list(self.reports):
                if (old[0] == run and old[1] < newest - KEEP_BATCHES) or (
                    old[0] in runs[:-KEEP_RUNS]
                ):
                    del self.reports[old]
                    self.metrics.pop(old, None)

    def answer(self, run: Any, batch: int, pool: ThreadPoolExecutor, wake: Any) -> Any:
        """``(event time,)`` after ``batch``, or None while the durable read runs."""
        if batch < 0:
            return (None,)
        with self.lock:
            reports = self.reports.get((run, batch))
            if reports is not None and len(reports) >= self.num_partitions:
                self.stats["answered_from_reports"] += 1
                return (max_event_time(reports.values()),)
            future = self.durable.get((run, batch))
            if future is None:
                self.stats["durable_reads"] += 1
                future = pool.submit(durable_event_time, self.storage, batch, self.num_partitions)
                future.add_done_callback(lambda _: wake())
                self.durable[(run, batch)] = future
                while len(self.durable) > KEEP_BATCHES * KEEP_RUNS:
                    self.durable.popitem(last=False)
        if not future.done():
            return None
        if future.exception() is not None:
            with self.lock:
                if self.durable.get((run, batch)) is future:
                    del self.durable[(run, batch)]  # the next ask tries again
            raise future.exception()
        return (future.result(),)


class Coordinator:
    """The coordinator of this driver process (see the module doc). Use
    :func:`coordinator_for`, or construct one directly (tests)."""

    def __init__(
        self, bind: str = "127.0.0.1", port: int = 0, advertise: str | None = None
    ) -> None:
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((bind, port))
            listener.listen(MAX_CLIENTS)
        except OSError:
            listener.close()
            raise
        self.host = advertise or bind
        self.port = listener.getsockname()[1]
        self._operators: dict[tuple[str, str], tuple[str, _Operator]] = {}
        self._by_token: dict[str, _Operator] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="sessionstore-coordinator-read")
        self._server = RequestServer(
            listener,
            _parse,
            self._answer,
            name="sessionstore-coordinator",
            max_request_bytes=MAX_REQUEST_BYTES,
            request_timeout_s=REQUEST_TIMEOUT_S,
            answer_timeout_s=ANSWER_TIMEOUT_S,
            max_clients=MAX_CLIENTS,
            retry_s=RETRY_S,
        )
        self._server.start()

    def register(
        self,
        checkpoint_uri: str,
        operator: str,
        num_partitions: int,
        storage_options: dict[str, Any] | None = None,
    ) -> CoordinatorAddress:
        """The address and token of ``operator`` of the checkpoint at
        ``checkpoint_uri``: the same for every spelling of the checkpoint's
        location, so that a query planned again shares what was reported."""
        storage = open_filesystem(checkpoint_uri, storage_options).child(operator)
        key = (storage.location, operator)
        with self._lock:
            known = self._operators.get(key)
            if known is None or known[1].num_partitions != num_partitions:
                token = known[0] if known else secrets.token_hex(16)
                state = _Operator(storage, num_partitions)
                self._operators[key] = (token, state)
                self._by_token[token] = state
            token = self._operators[key][0]
        return CoordinatorAddress(self.host, self.port, token)

    def operator(self, address: CoordinatorAddress) -> _Operator:
        """The state kept for the operator of ``address`` (tests, metrics)."""
        return self._by_token[address.token]

    def batch_metrics(self, run: Any, batch: int) -> dict[str, list[dict[str, Any]]]:
        """The task metrics records every operator's tasks reported for ``batch`` of
        query run ``run`` (a query's ``runId``), by operator name; operators with
        none are left out. What :class:`~spark_integration.metrics.StateMetricsListener`
        prints: the records reached the driver with the tasks' reports, so this
        costs no object-store request and no Spark job."""
        with self._lock:
            operators = [(key[1], state) for key, (_, state) in self._operators.items()]
        out: dict[str, list[dict[str, Any]]] = {}
        for name, state in operators:
            with state.lock:
                records = [r for r in state.metrics.get((run, batch), {}).values() if r]
            if records:
                out[name] = records
        return out

    def stop(self) -> None:
        """Stop serving (tests; a driver's coordinator lives as long as the driver)."""
        self._server.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _answer(self, request: dict[str, Any]) -> bytes | None:
        token = request.get("token")
        state = self._by_token.get(token) if isinstance(token, str) else None
        if state is None:
            return NO_REPLY  # not one of our operators' tasks
        batch, run = request.get("batch"), request.get("run")
        if type(batch) is not int or not isinstance(run, str | None):
            return NO_REPLY
        if request.get("op") == "report":
            partition, event_time = request.get("partition"), request.get("event_time")
            if (
                type(partition) is not int
                or not 0 <= partition < state.num_partitions
                or not (event_time is None or type(event_time) is int)
            ):
                return NO_REPLY
            state.add_report(run, batch, partition, event_time, request.get("metrics"))
            return _frame({"ok": True})
        if request.get("op") == "claim":
            partition, version = request.get("partition"), request.get("version")
            commit, parent, supersede = (
                request.get("commit"), request.get("parent"), request.get("supersede")
            )  # fmt: skip
            if (
                type(partition) is not int
                or not 0 <= partition < state.num_partitions
                or type(version) is not int
                or not isinstance(commit, str)
                or not isinstance(parent, str | None)
                or not isinstance(supersede, str | None)
            ):
                return NO_REPLY
            return _frame({"winner": state.claim(partition, version, commit, parent, supersede)})
        if request.get("op") == "ask":
            try:
                answer = state.answer(run, batch, self._pool, self._server.wake)
            except Exception as exc:  # the task reads the records itself, and fails there
                return _frame({"error": f"{type(exc).__name__}: {exc}"})
            return None if answer is None else _frame({"event_time": answer[0]})
        return NO_REPLY


_coordinator: tuple[int, Coordinator] | None = None
_coordinator_lock = threading.Lock()


def _port(value: Any) -> int:
    """:data:`PORT_CONF`'s value as a port number; ``ValueError`` naming it if not."""
    try:
        port = int(str(value).strip())
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ValueError(f"{PORT_CONF} must be a port number (0 for any), got {value!r}")
    return port


def coordinator_for(
    spark: Any, checkpoint_uri: str, operator: str, num_partitions: int,
    storage_options: dict[str, Any] | None = None,
) -> CoordinatorAddress | None:  # fmt: skip
    """Register ``operator`` with this driver's coordinator (started on first use)
    and return its address for the tasks; None when it is turned off
    (:data:`ENABLED_CONF`), cannot listen, or this process is not the driver (Spark
    Connect); then tasks read the durable records."""
    global _coordinator
    try:
        conf = spark.sparkContext.getConf()
    except Exception:  # Spark Connect: this process is not the driver
        return None
    enabled = spark.conf.get(ENABLED_CONF, conf.get(ENABLED_CONF, "true"))
    if str(enabled).strip().lower() in ("false", "0", "no"):
        return None
    with _coordinator_lock:
        if _coordinator is None or _coordinator[0] != os.getpid():
            master = conf.get("spark.master", "")
            host = conf.get("spark.driver.host", "127.0.0.1")
            bind = conf.get("spark.driver.bindAddress", host)
            if master.startswith("local[") or master == "local":
                host = bind = "127.0.0.1"  # tasks run in this machine's processes
            port = _port(spark.conf.get(PORT_CONF, conf.get(PORT_CONF, "0")))
            try:
                _coordinator = (os.getpid(), Coordinator(bind, port, advertise=host))
            except OSError as exc:
                log.warning(
                    "sessionstore: no event-time coordinator on %s:%d (%s); every task "
                    "reads the operator's event time from object storage", bind, port, exc,
                )  # fmt: skip
                return None
        coordinator = _coordinator[1]
    return coordinator.register(checkpoint_uri, operator, num_partitions, storage_options)


def driver_coordinator() -> Coordinator | None:
    """This driver's coordinator, if one was started (tests, metrics)."""
    return _coordinator[1] if _coordinator and _coordinator[0] == os.getpid() else None


# ------------------------------------------------------------------ task side
_unreachable_until: dict[tuple[str, int], float] = {}


def _request(address: CoordinatorAddress, message: dict[str, Any]) -> dict[str, Any] | None:
    """One request and its reply; None if the coordinator cannot be reached (then
    the worker stops trying for :data:`RETRY_AFTER_S`) or drops the request."""
    where = (address.host, address.port)
    if time.monotonic() < _unreachable_until.get(where, 0.0):
        return None
    try:
        with socket.create_connection(where, timeout=CONNECT_TIMEOUT_S) as conn:
            conn.settimeout(ANSWER_TIMEOUT_S)
            conn.sendall(_frame({**message, "token": address.token}))
            data = b""
            while (
                len(data) < _LENGTH.size or len(data) < _LENGTH.size + _LENGTH.unpack_from(data)[0]
            ):
                chunk = conn.recv(65536)
                if not chunk:
                    return None  # dropped: a wrong token, or the coordinator is gone
                data += chunk
    except OSError as exc:
        _unreachable_until[where] = time.monotonic() + RETRY_AFTER_S
        log.warning(
            "sessionstore: the event-time coordinator at %s:%d is unreachable (%s); "
            "tasks of this worker read event time from object storage for %.0f s",
            address.host, address.port, exc, RETRY_AFTER_S,
        )  # fmt: skip
        return None
    reply = msgpack.unpackb(data[_LENGTH.size :], raw=False)
    return reply if isinstance(reply, dict) else None


def report(
    address: CoordinatorAddress,
    run: str | None,
    batch: int,
    partition: int,
    event_time: int | None,
    metrics: dict[str, Any] | None = None,
) -> bool:
    """Tell the coordinator ``partition``'s event time after ``batch`` (call only
    once the commit that recorded it is durable), with the task's metrics record.
    True if it took the report."""
    message = {
        "op": "report", "run": run, "batch": batch, "partition": partition,
        "event_time": event_time, "metrics": metrics,
    }  # fmt: skip
    reply = _request(address, message)
    return bool(reply and reply.get("ok"))


def claim(
    address: CoordinatorAddress,
    run: str | None,
    partition: int,
    version: int,
    commit: str,
    parent: str | None,
    supersede: str | None = None,
) -> str | None:
    """Claim ``version`` of ``partition`` for commit ``commit`` (built on
    ``parent``): the winning commit's id, or None when the coordinator did not
    answer (the caller then looks before it writes)."""
    message = {
        "op": "claim", "run": run, "batch": version - 1, "partition": partition,
        "version": version, "commit": commit, "parent": parent, "supersede": supersede,
    }  # fmt: skip
    reply = _request(address, message)
    winner = reply.get("winner") if reply else None
    return winner if isinstance(winner, str) else None


def commit_arbiter(address: CoordinatorAddress, run: str | None, partition: int) -> CommitArbiter:
    """The :data:`~sessionstore.checkpoint.lineage.CommitArbiter` of one task's
    partition: its claims go to the coordinator at ``address``."""

    def arbiter(version: int, commit: str, parent: str | None, supersede: str | None) -> str | None:
        return claim(address, run, partition, version, commit, parent, supersede)

    return arbiter


#: Answers this process was given, by (coordinator, run, batch): an answer is final
#: (the event time after a committed batch never changes), and a Spark task that
#: runs several partitions (spark_integration.placement) asks once for all of them.
_answers: OrderedDict[tuple[Any, ...], int | None] = OrderedDict()
_ANSWERS_KEPT = 64


def ask(address: CoordinatorAddress, run: str | None, batch: int) -> tuple[bool, int | None]:
    """``(answered, event time)``: the operator's event time after ``batch``, or
    ``(False, None)`` when the coordinator did not answer."""
    key = (address.host, address.port, address.token, run, batch)
    if key in _answers:
        return True, _answers[key]
    reply = _request(address, {"op": "ask", "run": run, "batch": batch})
    if reply is None or "event_time" not in reply:
        return False, None
    _answers[key] = reply["event_time"]
    while len(_answers) > _ANSWERS_KEPT:
        _answers.popitem(last=False)
    return True, reply["event_time"]


def shared_event_time(
    address: CoordinatorAddress | None,
    operator_storage: Storage,
    run: str | None,
    batch: int,
    num_partitions: int,
) -> int | None:
    """The operator's event time after ``batch``: the coordinator's answer, or the
    durable records read by this task when there is no coordinator to ask."""
    if batch < 0:
        return None
    if address is not None:
        answered, value = ask(address, run, batch)
        if answered:
            return value
    return durable_event_time(operator_storage, batch, num_partitions)
