"""The task side of the coordinator (:mod:`spark_integration.coordinator.server`):
:func:`report` after a durable commit (:func:`report_many` for the partitions a
task committed together), :func:`ask` for the operator's event time
after a batch, :func:`claim` a version (:func:`commit_arbiter`), and
:func:`shared_event_time`, which falls back to the durable records when there is no
coordinator to ask. A worker that cannot reach the coordinator stops trying for
:data:`RETRY_AFTER_S`; answers are final and kept per process.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import OrderedDict
from typing import Any

import msgpack

from sessionstore.checkpoint.partition.lineage import CommitArbiter
from sessionstore.checkpoint.records.event_time import durable_event_time
from sessionstore.checkpoint.storage.filesystem import Storage
from spark_integration.coordinator.protocol import (
    ANSWER_TIMEOUT_S,
    LENGTH,
    MAX_REQUEST_BYTES,
    CoordinatorAddress,
    CoordinatorReadError,
    reply_of,
    signed_request,
)

__all__ = [
    "report",
    "report_many",
    "ask",
    "claim",
    "commit_arbiter",
    "shared_event_time",
    "CONNECT_TIMEOUT_S",
    "RETRY_AFTER_S",
]

log = logging.getLogger(__name__)


#: How long a task waits to connect to the coordinator before it reads the durable
#: records itself; after a failure its worker stops trying for RETRY_AFTER_S.
CONNECT_TIMEOUT_S = 2.0
RETRY_AFTER_S = 60.0
#: Workers' coordinators not tried again before the time given (monotonic).
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
            request, nonce = signed_request(address.token, message)
            conn.sendall(request)
            data = b""
            while len(data) < LENGTH.size or len(data) < LENGTH.size + LENGTH.unpack_from(data)[0]:
                chunk = conn.recv(65536)
                if not chunk:
                    return None  # dropped: a wrong token, or the coordinator is gone
                data += chunk
                if len(data) > MAX_REQUEST_BYTES:
                    return None  # not a reply of ours: replies are small
    except OSError as exc:
        _unreachable_until[where] = time.monotonic() + RETRY_AFTER_S
        log.warning(
            "sessionstore: the event-time coordinator at %s:%d is unreachable (%s); "
            "tasks of this worker read event time from object storage for %.0f s",
            address.host, address.port, exc, RETRY_AFTER_S,
        )  # fmt: skip
        return None
    return reply_of(address.token, nonce, data)


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


#: Reports sent in one request, at most by their packed size: a request must stay
#: under MAX_REQUEST_BYTES with its envelope (timestamp, nonce, key id, MAC).
REPORTS_BYTES = MAX_REQUEST_BYTES // 2

#: One partition's report in :func:`report_many`: ``(partition, event time, metrics)``.
Report = tuple[int, int | None, dict[str, Any] | None]


def report_many(
    address: CoordinatorAddress, run: str | None, batch: int, reports: list[Report]
) -> int:
    """:func:`report` of each of ``reports``, in as few requests as the request size
    allows (one per :data:`REPORTS_BYTES` of reports; a task committing hundreds of
    partitions sends a few, not one each). Returns how many the coordinator took.
    A request holding a report the coordinator refuses is refused whole: its
    partitions' event times are then read from the durable records, never guessed."""
    taken = 0
    chunk: list[list[Any]] = []
    size = 0
    for partition, event_time, metrics in reports:
        item = [partition, event_time, metrics]
        item_size = len(msgpack.packb(item, use_bin_type=True))
        if chunk and size + item_size > REPORTS_BYTES:
            taken += _send_reports(address, run, batch, chunk)
            chunk, size = [], 0
        chunk.append(item)
        size += item_size
    if chunk:
        taken += _send_reports(address, run, batch, chunk)
    return taken


def _send_reports(
    address: CoordinatorAddress, run: str | None, batch: int, items: list[list[Any]]
) -> int:
    if len(items) == 1:  # what a lone partition's task sends, as before batching
        partition, event_time, metrics = items[0]
        return int(report(address, run, batch, partition, event_time, metrics))
    reply = _request(address, {"op": "reports", "run": run, "batch": batch, "reports": items})
    return len(items) if reply and reply.get("ok") else 0


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
    """The :data:`~sessionstore.checkpoint.partition.lineage.CommitArbiter` of one task's
    partition: its claims go to the coordinator at ``address``."""

    def arbiter(version: int, commit: str, parent: str | None, supersede: str | None) -> str | None:
        return claim(address, run, partition, version, commit, parent, supersede)

    return arbiter


#: Answers this process was given, by (coordinator, run, batch): an answer is final
#: (the event time after a committed batch never changes), and a Spark task that
#: runs several partitions (spark_integration.planning.placement) asks once for all of them.
_answers: OrderedDict[tuple[Any, ...], int | None] = OrderedDict()
_ANSWERS_KEPT = 64


def ask(address: CoordinatorAddress, run: str | None, batch: int) -> tuple[bool, int | None]:
    """``(answered, event time)``: the operator's event time after ``batch``, or
    ``(False, None)`` when the coordinator did not answer. A coordinator whose read
    of the durable records failed answers so: :class:`CoordinatorReadError`."""
    key = (address.host, address.port, address.token, run, batch)
    if key in _answers:
        return True, _answers[key]
    reply = _request(address, {"op": "ask", "run": run, "batch": batch})
    if reply is not None and isinstance(reply.get("error"), str):
        raise CoordinatorReadError(
            f"the event-time coordinator at {address.host}:{address.port} could not read "
            f"the event time after batch {batch}: {reply['error']}"
        )
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
    durable records read by this task when there is no coordinator to ask (turned
    off, unreachable). When the coordinator's own read fails, the task asks it again
    under ``operator_storage``'s retry policy and, once that gives up, fails with
    the coordinator's error: it never reads the records itself then."""
    if batch < 0:
        return None
    if address is not None:
        answered, value = operator_storage.retry.call(lambda: ask(address, run, batch))
        if answered:
            return value
    return durable_event_time(operator_storage, batch, num_partitions)
