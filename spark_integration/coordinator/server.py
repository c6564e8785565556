"""The coordinator: one small TCP server in the driver, like Flink's
OperatorCoordinator, so that tasks share their event time without object storage,
and their state metrics reach the driver with no request of their own (every
operator's tasks report after their commit; :meth:`Coordinator.batch_metrics`).

Each task of an event-time operator (``sessionize``, ``window_aggregate``) tells
the coordinator its partition's event time once its commit is durable
(:func:`report`; a task that commits many partitions reports them together,
:func:`report_many`, in one request per 32 KiB of reports), and each task of the
next micro-batch asks it for the largest one (:func:`ask`): a round trip or two to
the driver per task, no object-store request.
The durable record stays in the changelog headers
(:mod:`sessionstore.checkpoint.records.event_time`), and the coordinator's answer always
equals it:

* it answers from reports when it holds every partition's report of the batch,
  from the same query run (a report follows the durable commit, and a batch is
  deterministic, so a retried task reports the same time);
* otherwise (the driver restarted, a report was lost, a new run of the query) it
  reads the durable records once per batch (one ranged read per partition, on a
  thread of the driver, while its server keeps serving) and caches the answer;
* when that read fails (a throttling store, after the retries of
  sessionstore/checkpoint/storage/retry.py), it says so, and the task asks again under the
  same retry policy: each new ask starts one new read on the driver for all the
  tasks. A task never reads the P records itself then: P tasks reading P records
  each is P^2 requests, exactly when the store is throttling;
* a task that cannot reach it (Spark Connect, where the planning process is not
  the driver; a firewall) reads the durable records itself (the same answer, at
  the cost of P requests per task) and stops trying for :data:`RETRY_AFTER_S`.

The task side is :mod:`spark_integration.coordinator.client`, the signed wire
between them :mod:`spark_integration.coordinator.protocol`.

It is also the arbiter between attempts of one batch on an object store
(:func:`claim`, :mod:`sessionstore.checkpoint.partition.lineage`): before it uploads its
changelog, a task claims (partition, version) with its commit id; the first claim
wins, and a later attempt is told the winner and adopts its commit. No storage
request: object stores offer pyarrow no conditional write.

One coordinator per driver process serves every operator of every query. It binds
the driver's address (``spark.driver.bindAddress``, else ``spark.driver.host``;
127.0.0.1 in local mode) on ``spark.sessionstore.coordinator.port`` (default: any
free port). An operator is registered when it is planned and gets a random secret
token, which travels to its tasks inside the ``mapInArrow`` closure (with the rest
of the task, over Spark's own RPC) and never on the coordinator's wire. The server
is a :class:`~sessionstore.checkpoint.service.request_server.RequestServer`: one selector
thread, requests of at most :data:`MAX_REQUEST_BYTES`, short timeouts, at most
:data:`MAX_CLIENTS` connections.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import msgpack

from sessionstore.checkpoint.records.event_time import durable_event_time, max_event_time
from sessionstore.checkpoint.records.metrics import TASK_FIELDS
from sessionstore.checkpoint.service.request_server import NO_REPLY, RequestServer
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from sessionstore.process import this_process
from spark_integration.conf.spark_session import can_coordinate, conf_value
from spark_integration.coordinator.protocol import (
    ANSWER_TIMEOUT_S,
    MAX_REQUEST_BYTES,
    NONCE_BYTES,
    CoordinatorAddress,
    key_id,
    mac_of,
    parse_frame,
    signed_reply,
)

__all__ = ["Coordinator", "coordinator_for", "driver_coordinator", "ENABLED_CONF", "PORT_CONF"]

log = logging.getLogger(__name__)


#: Spark conf: ``false`` turns the coordinator off (every task then reads the
#: durable records itself, P reads per task).
ENABLED_CONF = "spark.sessionstore.coordinator.enabled"
#: Spark conf: the driver port the coordinator listens on (0, the default: any).
PORT_CONF = "spark.sessionstore.coordinator.port"
#: How long a connected client may take to send its request.
REQUEST_TIMEOUT_S = 2.0
#: Connections served at once (the tasks of a micro-batch ask at about the same
#: time; more wait in the listen backlog).
MAX_CLIENTS = 256
#: How often a waiting ask is tried again (a finished read also wakes the server).
RETRY_S = 0.05
#: Batches (per query run) whose reports, and batches whose durable answers, are
#: kept per operator; runs kept per operator.
KEEP_BATCHES = 4
KEEP_RUNS = 4
#: Versions whose winning claim is kept per partition (attempts of one batch
#: overlap; a version older than these is never claimed again by a live query).
KEEP_CLAIMS = 8
#: How far a request's timestamp may be from the coordinator's clock, in seconds
#: (executors' clocks differ a little; a captured request is refused after this).
MAX_CLOCK_SKEW_S = 60.0
#: Nonces remembered at most (a flood of valid requests cannot grow memory).
MAX_NONCES = 200_000
#: The largest metrics record a report may carry (msgpack bytes).
MAX_METRICS_BYTES = 2048
#: Reported event times and batch ids must lie within +-2^53 and [0, 2^53): an
#: event time far outside would close every session of the query.
MAX_INT = 2**53


def _metrics_problem(metrics: Any) -> str | None:
    """Why a report's metrics record is refused, or None if it is taken."""
    if metrics is None:
        return None
    if not isinstance(metrics, dict):
        return "a metrics record that is not a map"
    unknown = set(metrics) - TASK_FIELDS
    if unknown:
        return f"a metrics record with unknown fields {sorted(map(str, unknown))[:5]}"
    for value in metrics.values():
        if not (value is None or type(value) in (int, float, str)):
            return "a metrics record with a value that is not a number or a short text"
    if len(msgpack.packb(metrics)) > MAX_METRICS_BYTES:
        return f"a metrics record over {MAX_METRICS_BYTES} bytes"
    return None


def _reports_problem(reports: Any, num_partitions: int) -> str | None:
    """Why a request's reports are refused (one refused report refuses its whole
    request), or None if all of them are taken: a list of 1 to ``num_partitions``
    items ``[partition, event time, metrics]``, each partition of the operator,
    each event time within :data:`MAX_INT`, each metrics record taken by
    :func:`_metrics_problem`."""
    if not isinstance(reports, list) or not 0 < len(reports) <= num_partitions:
        return f"a list of reports that is not 1 to {num_partitions} reports"
    for item in reports:
        if not isinstance(item, list) or len(item) != 3:
            return f"a report {str(item)[:80]!r} that is not [partition, event time, metrics]"
        partition, event_time, metrics = item
        if type(partition) is not int or not 0 <= partition < num_partitions:
            return f"a report for partition {partition!r} of {num_partitions}"
        if not (
            event_time is None or (type(event_time) is int and -MAX_INT < event_time < MAX_INT)
        ):
            return f"a report of event time {event_time!r}"
        problem = _metrics_problem(metrics)
        if problem is not None:
            return problem
    return None


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
        self.stats = {
            "reports": 0, "report_requests": 0, "answered_from_reports": 0, "durable_reads": 0,
        }  # fmt: skip

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

    def add_reports(self, run: Any, batch: int, reports: list[list[Any]]) -> None:
        """Take one request's ``[partition, event time, metrics]`` reports of
        ``batch``: one lock and one pruning of old batches per request."""
        with self.lock:
            key = (run, batch)
            times = self.reports.setdefault(key, {})
            records = self.metrics.setdefault(key, {})
            for partition, event_time, metrics in reports:
                times[partition] = event_time
                records[partition] = metrics
            self.stats["reports"] += len(reports)
            self.stats["report_requests"] += 1
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
        #: key id -> (token, operator)
        self._by_key: dict[str, tuple[str, _Operator]] = {}
        #: nonces of accepted requests -> (arrival, request ts), oldest first; requests
        #: not newer than ``_floor_ms`` are refused (their nonces may be forgotten)
        self._nonces: OrderedDict[bytes, tuple[float, int]] = OrderedDict()
        self._floor_ms = -1
        #: kinds of refused requests logged already (each is logged once)
        self._logged: set[str] = set()
        #: refused requests, by reason (tests, logs)
        self.refused: dict[str, int] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="sessionstore-coordinator-read")
        self._server = RequestServer(
            listener,
            self._verified,
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
                self._by_key[key_id(token)] = (token, state)
            token = self._operators[key][0]
        return CoordinatorAddress(self.host, self.port, token)

    def operator(self, address: CoordinatorAddress) -> _Operator:
        """The state kept for the operator of ``address`` (tests, metrics)."""
        return self._by_token[address.token]

    def batch_metrics(self, run: Any, batch: int) -> dict[str, list[dict[str, Any]]]:
        """The task metrics records every operator's tasks reported for ``batch`` of
        query run ``run`` (a query's ``runId``), by operator name; operators with
        none are left out. What :class:`~spark_integration.execution.metrics.StateMetricsListener`
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

    def _refuse(self, reason: str, detail: str = "") -> None:
        """Count a refused request; log its kind the first time only (a flood must
        not fill the driver's log). Raises ValueError: the request is dropped."""
        self.refused[reason] = self.refused.get(reason, 0) + 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning(
                "sessionstore coordinator: dropped a request (%s%s); further ones of this "
                "kind are dropped silently", reason, f": {detail}" if detail else "",
            )  # fmt: skip
        raise ValueError(reason)

    def _verified(self, buffer: bytearray) -> Any:
        """The request in ``buffer`` once it has arrived whole and passed the checks
        of the module doc (mac, time, nonce), as ``(token, operator, nonce, body
        map)``; ``ValueError`` (dropped) otherwise. Runs once per request: a request
        whose answer waits is asked again without being verified again."""
        frame = parse_frame(buffer)
        if frame is None:
            return None
        if not (
            isinstance(frame, list) and len(frame) == 3 and isinstance(frame[0], str)
            and isinstance(frame[1], bytes) and isinstance(frame[2], bytes)
        ):  # fmt: skip
            self._refuse("malformed request")
        known = self._by_key.get(frame[0])
        if known is None:
            self._refuse("unknown key")
        token, state = known
        if not hmac.compare_digest(mac_of(token, frame[1]), frame[2]):
            self._refuse("wrong mac")
        try:
            body = msgpack.unpackb(frame[1], raw=False)
        except Exception:
            body = None
        if not isinstance(body, dict):
            self._refuse("malformed body")
        ts, nonce = body.get("ts"), body.get("nonce")
        if type(ts) is not int or not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
            self._refuse("malformed body")
        now = time.time()
        if abs(now * 1000 - ts) > MAX_CLOCK_SKEW_S * 1000 or ts <= self._floor_ms:
            self._refuse("stale timestamp", f"{(now * 1000 - ts) / 1000:.1f} s old")
        if nonce in self._nonces:
            self._refuse("replayed request")
        self._remember(nonce, now, ts)
        return token, state, nonce, body

    def _remember(self, nonce: bytes, now: float, ts: int) -> None:
        """Keep ``nonce`` while a request of its time can still be accepted (the
        server's thread only)."""
        nonces = self._nonces
        nonces[nonce] = (now, ts)
        # a request accepted at ``arrival`` had ts >= arrival - skew, so its nonce
        # matters until arrival + 2 * skew at most
        while nonces and next(iter(nonces.values()))[0] < now - 2 * MAX_CLOCK_SKEW_S:
            nonces.popitem(last=False)
        while len(nonces) > MAX_NONCES:
            _, (_, old_ts) = nonces.popitem(last=False)
            self._floor_ms = max(self._floor_ms, old_ts)

    def _answer(self, request: tuple[str, _Operator, bytes, dict[str, Any]]) -> bytes | None:
        token, state, nonce, body = request
        batch, run = body.get("batch"), body.get("run")
        try:
            if type(batch) is not int or not -1 <= batch < MAX_INT:  # -1: before the first
                self._refuse("malformed request", f"batch {batch!r}")
            if not (run is None or (isinstance(run, str) and len(run) <= 64)):
                self._refuse("malformed request", f"run {str(run)[:80]!r}")
            if body.get("op") in ("report", "reports"):
                reports = (
                    body.get("reports")
                    if body["op"] == "reports"
                    else [[body.get("partition"), body.get("event_time"), body.get("metrics")]]
                )
                problem = _reports_problem(reports, state.num_partitions)
                if problem is not None:
                    self._refuse("invalid report", problem)
                state.add_reports(run, batch, reports)
                return signed_reply(token, nonce, {"ok": True})
            if body.get("op") == "claim":
                problem = _claim_problem(body, state.num_partitions)
                if problem is not None:
                    self._refuse("invalid claim", problem)
                winner = state.claim(body["partition"], body["version"], body["commit"],
                                     body.get("parent"), body.get("supersede"))  # fmt: skip
                return signed_reply(token, nonce, {"winner": winner})
            if body.get("op") != "ask":
                self._refuse("malformed request", f"op {str(body.get('op'))[:20]!r}")
        except ValueError:
            return NO_REPLY
        try:
            answer = state.answer(run, batch, self._pool, self._server.wake)
        except Exception as exc:  # the task reads the records itself, and fails there
            return signed_reply(token, nonce, {"error": f"{type(exc).__name__}: {exc}"})
        return None if answer is None else signed_reply(token, nonce, {"event_time": answer[0]})


def _claim_problem(body: dict[str, Any], num_partitions: int) -> str | None:
    """Why a claim (lineage.py's arbiter) is refused, or None: a partition of the
    operator, a version in range, commit ids as short strings."""
    partition, version = body.get("partition"), body.get("version")
    if type(partition) is not int or not 0 <= partition < num_partitions:
        return f"partition {str(partition)[:20]!r}"
    if type(version) is not int or not 0 < version < MAX_INT:
        return f"version {str(version)[:20]!r}"
    for name in ("commit", "parent", "supersede"):
        value = body.get(name)
        if not (isinstance(value, str) and len(value) <= 64) and not (
            name != "commit" and value is None
        ):
            return f"{name} {str(value)[:80]!r}"
    return None


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
    if not can_coordinate(spark):
        return None
    def conf(key: str, default: str) -> str:
        return str(conf_value(spark, key, default))

    enabled = spark.conf.get(ENABLED_CONF, conf(ENABLED_CONF, "true"))
    if str(enabled).strip().lower() in ("false", "0", "no"):
        return None
    master = conf("spark.master", "")
    host = conf("spark.driver.host", "127.0.0.1")
    bind = conf("spark.driver.bindAddress", host)
    if master.startswith("local[") or master == "local":
        host = bind = "127.0.0.1"  # tasks run in this machine's processes
    port = spark.conf.get(PORT_CONF, conf(PORT_CONF, "0"))  # checked when started

    def start() -> Coordinator:
        return Coordinator(bind, _port(port), advertise=host)

    try:  # one per driver process, in its "coordinator" slot (sessionstore.process)
        coordinator = this_process().get_or_make("coordinator", start)
    except OSError as exc:
        log.warning(
            "sessionstore: no event-time coordinator on %s:%s (%s); every task "
            "reads the operator's event time from object storage", bind, port, exc,
        )  # fmt: skip
        return None
    return coordinator.register(checkpoint_uri, operator, num_partitions, storage_options)


def driver_coordinator() -> Coordinator | None:
    """This driver's coordinator, if one was started (tests, metrics)."""
    return this_process().get("coordinator")
