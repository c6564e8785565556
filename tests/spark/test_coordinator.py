"""The driver's event-time coordinator: answers, fallbacks and hostile clients.
(No Spark needed: the coordinator is a plain TCP server.)"""

from __future__ import annotations

import socket
import struct
import threading
import time

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_integration.coordinator import client, protocol
from spark_integration.coordinator import server as coord
from spark_integration.coordinator.client import ask, report, report_many
from spark_integration.coordinator.protocol import CoordinatorAddress, CoordinatorReadError
from spark_integration.coordinator.server import Coordinator
from tests.checkpoint.test_event_time import commit_batches


@pytest.fixture
def coordinator():
    c = Coordinator("127.0.0.1", 0)
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def _reachable_again(monkeypatch):
    """Each test starts with no coordinator marked unreachable, and no answer kept."""
    monkeypatch.setattr(client, "_unreachable_until", {})
    monkeypatch.setattr(client, "_answers", client.OrderedDict())


def checkpoint(tmp_path, times_by_batch):
    uri = f"file://{tmp_path}/remote"
    commit_batches(uri, tmp_path / "local", times_by_batch)
    return uri


def test_it_answers_from_the_reports_of_every_partition(coordinator, tmp_path):
    uri = checkpoint(tmp_path, [[4, 9, None]])
    address = coordinator.register(uri, "op", 3)
    for partition, t in enumerate([4, 9, None]):
        assert report(address, "run-1", 0, partition, t, {"rows_total": partition})
    assert ask(address, "run-1", 0) == (True, 9)
    assert ask(address, "run-1", -1) == (True, None)  # before the first batch
    state = coordinator.operator(address)
    assert state.stats == {
        "reports": 3, "report_requests": 3, "answered_from_reports": 1, "durable_reads": 0,
    }  # fmt: skip
    # an answer is final: the partitions a task runs after the first do not ask again
    assert [ask(address, "run-1", 0) for _ in range(3)] == [(True, 9)] * 3
    assert state.stats["answered_from_reports"] == 1
    assert coordinator.batch_metrics("run-1", 0) == {
        "op": [{"rows_total": 0}, {"rows_total": 1}, {"rows_total": 2}]
    }


def test_missing_reports_are_answered_from_the_durable_records_once(coordinator, tmp_path):
    # partition 2, which never reports, holds the largest time: only the durable
    # records can know it
    uri = checkpoint(tmp_path, [[4, 9, 30]])
    address = coordinator.register(f"{uri}/", "op", 3)  # another spelling: same operator
    assert address == coordinator.register(uri, "op", 3)
    report(address, "run-1", 0, 0, 4)
    report(address, "run-1", 0, 1, 9)
    assert ask(address, "run-1", 0) == (True, 30)
    assert ask(address, "run-1", 0) == (True, 30)
    assert coordinator.operator(address).stats["durable_reads"] == 1  # cached
    # a new run of the query (a restart) never trusts the reports of another run
    for partition, t in enumerate([4, 9, 30]):
        report(address, "run-1", 0, partition, t)
    assert ask(address, "run-2", 0) == (True, 30)
    assert ask(address, "run-2", 0) == (True, 30)
    assert coordinator.operator(address).stats["durable_reads"] == 2  # once per run


def test_a_durable_read_that_fails_is_reported_and_tried_again(coordinator, tmp_path):
    uri = checkpoint(tmp_path, [[4, 9]])
    address = coordinator.register(uri, "op", 2)
    for _ in range(2):  # no changelog of version 6
        with pytest.raises(
            CoordinatorReadError, match="could not read the event time after batch 5"
        ):
            ask(address, None, 5)
    assert coordinator.operator(address).stats["durable_reads"] == 2


class _Throttled:
    """A storage whose reads fail as a throttling store's do, ``failures`` times:
    only reads under ``partition/`` (all reads if None) fail, so which read fails
    does not depend on the order of a look's parallel reads."""

    def __init__(self, storage, failures, partition=None):
        self._storage, self.failures, self.reads = storage, failures, 0
        self._prefix = None if partition is None else f"{partition}/"
        self._lock = threading.Lock()

    def read(self, rel, length=None):
        with self._lock:
            self.reads += 1
            fail = self.failures and (self._prefix is None or rel.startswith(self._prefix))
            if fail:
                self.failures -= 1
        if fail:
            raise OSError(f"cannot read {rel}: AWS Error SLOW_DOWN during GetObject operation")
        return self._storage.read(rel, length)

    def __getattr__(self, name):
        return getattr(self._storage, name)


class _NeverRead:
    """A task's operator storage that must not be read (only its retry policy is used)."""

    def __init__(self, retry):
        self.retry = retry

    def __getattr__(self, name):
        raise AssertionError(f"the task read the durable records itself ({name})")


def test_a_failed_durable_read_makes_tasks_ask_again_never_read_p_records(coordinator, tmp_path):
    from sessionstore.checkpoint.storage.retry import RetryPolicy

    uri = checkpoint(tmp_path, [[4, 9, 30]])
    address = coordinator.register(uri, "op", 3)
    state = coordinator.operator(address)
    # partition 0's read in the driver's first look fails: that look fails (and may
    # cancel its other reads not yet started)
    state.storage = _Throttled(state.storage, failures=1, partition=0)
    task = _NeverRead(RetryPolicy(max_attempts=5, jitter=lambda bound: 0.01))
    assert client.shared_event_time(address, task, "run-1", 0, 3) == 30
    # the task asked twice; each ask was one look on the driver: at most 3 reads
    # each, and the second look read all three
    assert state.stats["durable_reads"] == 2
    assert state.storage.failures == 0 and 4 <= state.storage.reads <= 6
    # the store keeps throttling: the task fails with the driver's error, still
    # without a read of its own
    state.storage = _Throttled(state.storage._storage, failures=10**6)
    task = _NeverRead(RetryPolicy(max_attempts=3, jitter=lambda bound: 0.01))
    with pytest.raises(CoordinatorReadError, match=r"SLOW_DOWN.*tried 3 times"):
        client.shared_event_time(address, task, "run-1", 1, 3)


def _raw(address, payload, read=True):
    with socket.create_connection((address.host, address.port), timeout=10) as conn:
        try:
            conn.sendall(payload)
            return conn.recv(1024) if read else b""
        except (BrokenPipeError, ConnectionResetError):
            return b""


def _frame(message):
    body = msgpack.packb(message)
    return struct.pack(">I", len(body)) + body


def test_a_request_without_the_token_is_dropped(coordinator, tmp_path):
    uri = checkpoint(tmp_path, [[4, 9]])
    address = coordinator.register(uri, "op", 2)
    forged = CoordinatorAddress(address.host, address.port, "0" * 32)
    assert not report(forged, None, 0, 0, 10**12)
    assert ask(forged, None, 0) == (False, None)
    message = {"op": "report", "run": None, "batch": 0, "partition": 1, "event_time": 10**12}
    assert _raw(address, _frame(message)) == b""  # no token at all
    assert coordinator.operator(address).stats["reports"] == 0
    assert "token" not in repr(address) and address.token not in repr(address)
    # the real token still works, and the forged reports changed nothing
    assert ask(address, None, 0) == (True, 9)


def test_oversized_slow_and_garbage_requests_are_dropped(coordinator, tmp_path):
    uri = checkpoint(tmp_path, [[4, 9]])
    address = coordinator.register(uri, "op", 2)
    t0 = time.monotonic()
    assert _raw(address, struct.pack(">I", 10 << 20)) == b""  # announces 10 MB
    assert _raw(address, b"\x00\x00\x00\x05" + b"x" * 200_000) == b""  # sends more
    assert _raw(address, struct.pack(">I", 3) + b"\xc1\xc1\xc1") == b""  # not msgpack
    assert _raw(address, _frame([1, 2, 3])) == b""  # not a map
    assert time.monotonic() - t0 < 2
    with socket.create_connection((address.host, address.port), timeout=10) as conn:
        conn.sendall(struct.pack(">I", 100) + b"\x81")  # part of a request, then silence
        t0 = time.monotonic()
        assert conn.recv(16) == b""
        assert coord.REQUEST_TIMEOUT_S - 0.5 < time.monotonic() - t0 < 10
    # a wrong partition or a non-integer time is refused, not stored
    assert not report(address, None, 0, 2, 5)
    assert not report(address, None, 0, 0, "late")
    assert coordinator.operator(address).stats["reports"] == 0
    assert ask(address, None, 0) == (True, 9)


def test_an_unreachable_coordinator_falls_back_to_the_durable_records(tmp_path):
    from sessionstore.checkpoint.storage.filesystem import open_filesystem

    uri = checkpoint(tmp_path, [[4, 9]])
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = CoordinatorAddress("127.0.0.1", port, "t")
    operator = open_filesystem(uri).child("op")
    assert client.shared_event_time(address, operator, None, 0, 2) == 9
    assert ("127.0.0.1", port) in client._unreachable_until  # not tried again for a while
    t0 = time.monotonic()
    assert client.shared_event_time(address, operator, None, 0, 2) == 9
    assert time.monotonic() - t0 < 0.5
    assert client.shared_event_time(None, operator, None, 0, 2) == 9  # turned off


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    times=st.lists(st.one_of(st.none(), st.integers(-(2**50), 2**50)), min_size=1, max_size=5),
    reported=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_every_answer_equals_the_durable_records(coordinator, tmp_path_factory, times, reported):
    """Whatever subset of partitions reported, the answer is what the changelogs say."""
    tmp = tmp_path_factory.mktemp("c")
    uri = checkpoint(tmp, [times])
    address = coordinator.register(uri, "op", len(times))
    for partition, t in enumerate(times):
        if reported[partition]:
            report(address, "r", 0, partition, t)
    known = [t for t in times if t is not None]
    assert ask(address, "r", 0) == (True, max(known) if known else None)


def test_a_bad_port_setting_is_named():
    with pytest.raises(ValueError, match=r"spark.sessionstore.coordinator.port .* got 'eighty'"):
        coord._port("eighty")
    with pytest.raises(ValueError, match=r"got '70000'"):
        coord._port("70000")
    assert coord._port(" 7077 ") == 7077


def test_batch_metrics_gives_each_operators_records_of_one_run_and_batch(coordinator, tmp_path):
    """What the metrics listener prints from: per operator, the records of one
    batch of one query run; operators and runs without reports are left out."""
    uri = f"file://{tmp_path}/remote"
    sessions = coordinator.register(uri, "sessions", 2)
    joins = coordinator.register(uri, "joins", 1)
    coordinator.register(uri, "idle", 1)
    report(sessions, "run-1", 3, 0, 10, {"rows_total": 5})
    report(sessions, "run-1", 3, 1, None, {"rows_total": 7})
    report(joins, "run-1", 3, 0, None, {"emitted": 2})
    report(joins, "run-2", 3, 0, None, {"emitted": 9})  # another run of a query
    report(sessions, "run-1", 4, 0, 11, {"rows_total": 6})
    found = coordinator.batch_metrics("run-1", 3)
    assert sorted(found) == ["joins", "sessions"]
    assert sorted(r["rows_total"] for r in found["sessions"]) == [5, 7]
    assert found["joins"] == [{"emitted": 2}]
    assert coordinator.batch_metrics("run-2", 3) == {"joins": [{"emitted": 9}]}
    assert coordinator.batch_metrics("run-1", 5) == {}


# ------------------------------------------------------------- trust (issue 28)
@pytest.fixture
def recorded(monkeypatch):
    """Every request a task sends to a coordinator, as the bytes on the wire."""
    sent: list[bytes] = []
    real = socket.create_connection

    class Recording:
        def __init__(self, conn):
            self._conn = conn

        def sendall(self, data):
            sent.append(bytes(data))
            return self._conn.sendall(data)

        def __getattr__(self, name):
            return getattr(self._conn, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._conn.close()

    monkeypatch.setattr(client.socket, "create_connection", lambda *a, **k: Recording(real(*a, **k)))
    return sent


def test_the_token_never_goes_on_the_wire_and_a_captured_request_cannot_be_replayed(
    coordinator, tmp_path, recorded
):
    uri = checkpoint(tmp_path, [[4, 9]])
    address = coordinator.register(uri, "op", 2)
    assert report(address, "run-1", 0, 0, 4)
    assert ask(address, "run-1", 0) == (True, 9)
    assert len(recorded) == 2
    for request in recorded:
        assert address.token.encode() not in request
        assert bytes.fromhex(address.token) not in request
    # someone who saw the report on the network sends it again
    assert _raw(address, recorded[0]) == b""
    assert coordinator.operator(address).stats["reports"] == 1
    assert coordinator.refused == {"replayed request": 1}


def test_a_request_with_a_wrong_mac_is_refused_and_changes_nothing(coordinator, tmp_path):
    uri = checkpoint(tmp_path, [[4, 9]])
    address = coordinator.register(uri, "op", 2)
    message = {"op": "report", "run": None, "batch": 0, "partition": 0, "event_time": 2**52}
    frame, _ = protocol.signed_request("0" * 32, message)  # a guessed key
    key, body, mac = msgpack.unpackb(frame[4:])
    forged = _frame([protocol.key_id(address.token), body, mac])  # under the real key's id
    assert _raw(address, forged) == b""
    tampered = _frame([protocol.key_id(address.token), body + b"\x00", mac])
    assert _raw(address, tampered) == b""
    assert coordinator.refused == {"wrong mac": 2}
    assert coordinator.operator(address).stats["reports"] == 0
    assert ask(address, None, 0) == (True, 9)  # what decides the output is unchanged


def test_a_request_with_a_stale_or_future_timestamp_is_refused(coordinator, tmp_path, monkeypatch):
    uri = checkpoint(tmp_path, [[4, 9]])
    address = coordinator.register(uri, "op", 2)
    now = time.time()
    for skew in (-coord.MAX_CLOCK_SKEW_S - 5, coord.MAX_CLOCK_SKEW_S + 5):
        monkeypatch.setattr(coord.time, "time", lambda skew=skew: now + skew)
        frame, _ = protocol.signed_request(address.token, {"op": "report", "run": None,
                                                        "batch": 0, "partition": 0,
                                                        "event_time": 2**52})  # fmt: skip
        monkeypatch.undo()
        assert _raw(address, frame) == b""
    assert coordinator.refused == {"stale timestamp": 2}
    assert coordinator.operator(address).stats["reports"] == 0
    assert ask(address, None, 0) == (True, 9)


@pytest.mark.parametrize(
    ("event_time", "metrics"),
    [
        (2**62, None),  # would close every session of the query
        (-(2**62), None),
        (5, {"rows_total": 1, "password": "x"}),  # an unknown field
        (5, {"rows_total": "x" * 5000}),  # too large
        (5, {"rows_total": [1] * 10}),  # not a number
        (5, [1, 2, 3]),  # not a map
    ],
)
def test_an_out_of_range_report_or_a_bad_metrics_record_is_refused(
    coordinator, tmp_path, caplog, event_time, metrics
):
    uri = checkpoint(tmp_path, [[4, 9]])
    address = coordinator.register(uri, "op", 2)
    with caplog.at_level("WARNING", logger=coord.__name__):
        assert not report(address, "r", 0, 0, event_time, metrics)
        assert not report(address, "r", 0, 0, event_time, metrics)
    assert coordinator.refused == {"invalid report": 2}
    assert len([r for r in caplog.records if "invalid report" in r.getMessage()]) == 1  # once
    assert coordinator.operator(address).stats["reports"] == 0
    assert coordinator.batch_metrics("r", 0) == {}
    report(address, "r", 0, 1, 9, {"rows_total": 3, "load_kind": "warm"})
    assert ask(address, "r", 0) == (True, 9)


def test_a_tasks_partitions_report_in_a_few_requests_not_one_each(
    coordinator, tmp_path, monkeypatch
):
    """A Spark task running 300 partitions tells the coordinator about all of them
    in requests bounded by size, not by partition count, and the answer is the
    same as from 300 single reports."""
    times = [(p * 7919) % 1000 for p in range(300)]
    uri = checkpoint(tmp_path, [times])
    address = coordinator.register(uri, "op", 300)
    sent = []
    real = client._request
    monkeypatch.setattr(client, "_request", lambda a, m: sent.append(m["op"]) or real(a, m))
    metrics = {  # a whole record, as a Spark task's commit gives it
        "format": 1, "rows_total": 10**9, "rows_updated": 12345, "rows_removed": 123,
        "late_dropped": 0, "emitted": 4567, "load_kind": "warm", "load_ms": 0.123,
        "uploaded_bytes": 123456, "snapshot_lag": 3, "memory_bytes": 123456789,
        "storage_retries": 0, "repaired": 0, "version": 1, "prepare_ms": 1.234,
        "upload_ms": 2.345, "apply_ms": 0.5, "commit_ms": 4.1, "batch": 0,
    }  # fmt: skip
    reports = [(p, t, {**metrics, "partition": p}) for p, t in enumerate(times)]
    assert report_many(address, "run-1", 0, reports) == 300
    # 300 reports of 303-309 bytes (92 KB): three requests of at most 32 KiB each
    assert client.REPORTS_BYTES == 32 * 1024
    assert sent == ["reports"] * 3
    assert ask(address, "run-1", 0) == (True, max(times))
    state = coordinator.operator(address)
    assert state.stats == {
        "reports": 300, "report_requests": 3, "answered_from_reports": 1, "durable_reads": 0,
    }  # fmt: skip
    assert [m["partition"] for m in coordinator.batch_metrics("run-1", 0)["op"]] == list(range(300))
    # a lone partition still sends the single report
    sent.clear()
    assert report_many(address, "run-1", 1, [(0, 5, None)]) == 1
    assert sent == ["report"]


def test_a_request_of_reports_holding_a_bad_one_is_refused_whole(coordinator, tmp_path):
    """One refused report refuses its request: none of its partitions count, and
    the coordinator answers from the durable records (never from a part)."""
    uri = checkpoint(tmp_path, [[4, 9, 30]])
    address = coordinator.register(uri, "op", 3)
    bad = [
        [(0, 4, None), (1, 9, None), (2, 2**62, None)],  # an event time out of range
        [(0, 4, None), (7, 9, None)],  # a partition the operator does not have
        [(0, 4, None), (1, 9, {"password": "x"})],  # an unknown metrics field
        [(p % 3, 4, None) for p in range(4)],  # more reports than partitions
    ]
    for reports in bad:
        assert report_many(address, "r", 0, reports) == 0
    assert coordinator.refused == {"invalid report": 4}
    assert coordinator.operator(address).stats["reports"] == 0
    for item in ([0, 4], "x", [0, 4, None, 1]):  # malformed items, sent by hand
        assert client._request(
            address, {"op": "reports", "run": "r", "batch": 0, "reports": [item, [1, 9, None]]}
        ) is None
    assert coordinator.operator(address).stats["reports"] == 0
    assert ask(address, "r", 0) == (True, 30)
    assert coordinator.operator(address).stats["durable_reads"] == 1


def test_a_reply_not_signed_by_the_coordinator_is_ignored(tmp_path):
    """A fake coordinator (it does not hold the token) answers an ask with an event
    time of 2^62: the task ignores it and reads the durable records."""
    import threading

    from sessionstore.checkpoint.storage.filesystem import open_filesystem

    uri = checkpoint(tmp_path, [[4, 9]])
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def fake():
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(_frame({"event_time": 2**62}))

    thread = threading.Thread(target=fake, daemon=True)
    thread.start()
    address = CoordinatorAddress("127.0.0.1", port, "ab" * 16)
    assert client.shared_event_time(address, open_filesystem(uri).child("op"), None, 0, 2) == 9
    thread.join(5)
def test_the_first_claim_of_a_version_wins(coordinator, tmp_path):
    """The arbiter between attempts of one batch (lineage.py): the first claim of
    (partition, version) wins and is named to later ones; a repeated claim is
    granted again; a claim on another parent, or one superseding the held winner,
    takes the version; a claim of another partition is independent; a malformed
    claim is dropped."""
    address = coordinator.register(f"file://{tmp_path}/r", "op", 2)
    a, b, c = "a" * 32, "b" * 32, "c" * 32
    assert client.claim(address, "run", 0, 5, a, "p") == a
    assert client.claim(address, "run", 0, 5, b, "p") == a
    assert client.claim(address, "run", 0, 5, a, "p") == a
    assert client.claim(address, "run", 1, 5, b, "p") == b
    assert client.claim(address, "run", 0, 5, b, "p", supersede=a) == b
    assert client.claim(address, "run", 0, 5, c, "p", supersede=a) == b  # a no longer holds it
    assert client.claim(address, "run", 0, 5, c, "other parent") == c
    for bad in ({"partition": 2}, {"version": "5"}, {"commit": 7}, {"parent": 1}):
        message = {
            "op": "claim", "run": "run", "batch": 4, "partition": 0, "version": 5,
            "commit": a, "parent": None, "supersede": None, **bad,
        }  # fmt: skip
        frame, _ = protocol.signed_request(address.token, message)  # signed, but malformed
        assert _raw(address, frame) == b""
    assert coordinator.refused == {"invalid claim": 4}
    for version in range(6, 6 + coord.KEEP_CLAIMS):  # older claims are forgotten
        client.claim(address, "run", 0, version, a, "p")
    assert client.claim(address, "run", 0, 5, a, "p") == a
