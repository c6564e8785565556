"""State servers (spark_integration.execution.state_server) without Spark: the exchange
between a worker and its partition's server, placement, failures and lifetime.

A sleeping child process stands for the executor's Python daemon, so that the
servers the tests start end with it."""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pyarrow as pa
import pytest

from sessionstore.errors import StatefulProcessorError
from sessionstore.process import this_process
from spark_integration.conf.pyspark_archives import without_installed_archives
from spark_integration.execution import state_server as ss
from spark_integration.execution.context import TaskContext, TaskInfo
from spark_integration.execution.state_server import client, protocol, server
from tests import pids
from tests.foreign_user import AsNobody, needs_root
from tests.spark.fakes import fake_session


@dataclass
class EchoTask:
    """Yields its input doubled, then a table naming the process and the task it ran
    as; leaves a metrics record; raises ``fail`` if given."""

    fail: str | None = None
    wait_for: str | None = None  # a file whose existence lets the task go on

    def run(self, batches, context):
        info = context.info
        rows = 0
        for batch in batches:
            rows += batch.num_rows
            yield pa.record_batch([pa.compute.multiply(batch.column(0), 2)], names=["x2"])
        if self.wait_for:
            # written then renamed: the test polls for the name and must
            # never read a file whose text is not yet there
            temporary = Path(self.wait_for + ".started.tmp")
            temporary.write_text(str(os.getpid()))
            temporary.rename(self.wait_for + ".started")
            while not os.path.exists(self.wait_for):
                time.sleep(0.01)
        if self.fail:
            raise ValueError(self.fail)
        context.metrics = {"rows": rows, "partition": info.partition}
        yield pa.table(
            {"pid": [os.getpid()], "partition": [info.partition], "batch": [info.batch_id]}
        )


class KeywordError(Exception):
    """Pickles, but cannot be rebuilt from its args (like PySpark's own errors)."""

    def __init__(self, *, message: str) -> None:
        super().__init__(message)


@dataclass
class KeywordErrorTask:
    def run(self, batches, context):
        list(batches)
        raise KeywordError(message="[SOME_CONDITION] keyword-only")
        yield  # a generator, as every mapInArrow function


@dataclass
class BudgetTask:
    """Yields the RocksDB memory budget of the process it runs in."""

    def run(self, batches, context):
        from sessionstore.engine.memory import current_budget

        list(batches)
        budget = current_budget()
        yield pa.table({"max_mb": [None if budget is None else budget.max_mb]})


@pytest.fixture
def daemon(monkeypatch):
    """A stand-in for the executor's Python daemon; the servers started while it
    lives end with it (checked)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    monkeypatch.setattr(client, "daemon_pid", lambda: sleeper.pid)
    servers: set[int] = set()
    yield sleeper, servers
    sleeper.kill()
    sleeper.wait()
    deadline = time.monotonic() + 10
    while any(pids.running(pid) for pid in servers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in servers if pids.running(pid)], "state servers outlived their daemon"


def _run(task, partition: int, count: int, rows=(1, 2, 3), batch: int = 7, partitions=None):
    """Run ``task`` as partition ``partition`` (of ``partitions``, if given) through
    :class:`ServedTask`: its output tables, and the metrics record it sent back."""
    context = TaskContext(TaskInfo(partition, batch, 0, "run-1"))  # as in a Spark worker
    inputs = [pa.record_batch([pa.array(list(rows))], names=["x"])]
    out = list(ss.ServedTask(task, count, partitions).run(iter(inputs), context))
    return out, context.metrics


def _listening(address: str) -> bool:
    """Whether a server listens at ``address`` (a connection it will not read)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(address)
            return True
        except OSError:
            return False


def _pid_of(out) -> int:
    return pa.Table.from_batches([out[-1]]).column("pid")[0].as_py()


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


@pytest.mark.slow
def test_a_task_runs_in_its_partitions_server_and_its_output_and_metrics_come_back(daemon):
    _, servers = daemon
    out, metrics = _run(EchoTask(), partition=5, count=4, rows=(1, 2, 3))
    assert out[0].column(0).to_pylist() == [2, 4, 6]
    last = pa.Table.from_batches([out[-1]]).to_pylist()
    pid = last[0]["pid"]
    servers.add(pid)
    assert pid != os.getpid()
    assert last == [{"pid": pid, "partition": 5, "batch": 7}]  # TaskInfo travelled
    assert metrics == {"rows": 3, "partition": 5}
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert b"spark_integration.execution.state_server" in f.read()

    # placement: partition p always runs in server p mod count, and every slot's
    # server was started with the first
    same, _ = _run(EchoTask(), partition=1, count=4)
    assert _pid_of(same) == pid
    others = {_pid_of(_run(EchoTask(), partition=p, count=4)[0]) for p in (0, 2, 3)}
    servers.update(others)
    assert len(others) == 3 and pid not in others


def test_a_servers_default_memory_budget_is_the_workers_over_servers_per_slot(daemon):
    _, servers = daemon
    out, _ = _run(BudgetTask(), partition=0, count=1)
    assert out[0].column("max_mb").to_pylist() == [256 // ss.SERVERS_PER_SLOT]
    servers.add(_pid_of(_run(EchoTask(), partition=0, count=1)[0]))


def test_a_tasks_error_is_raised_in_the_worker_with_its_type_and_message(daemon):
    _, servers = daemon
    with pytest.raises(ValueError, match="bad value 42") as caught:
        _run(EchoTask(fail="bad value 42"), partition=0, count=1)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "sessionstore state server" in notes and "partition 0 of micro-batch 7" in notes
    assert "raise ValueError(self.fail)" in notes  # the server's traceback
    # the server keeps serving
    out, _ = _run(EchoTask(), partition=0, count=1)
    servers.add(_pid_of(out))


def test_an_error_that_cannot_be_rebuilt_arrives_as_its_type_and_message(daemon):
    _, servers = daemon
    with pytest.raises(RuntimeError, match=r"KeywordError: \[SOME_CONDITION\] keyword-only"):
        _run(KeywordErrorTask(), partition=0, count=1)
    servers.add(_pid_of(_run(EchoTask(), partition=0, count=1)[0]))


@pytest.mark.slow
def test_a_server_killed_mid_task_fails_the_task_and_the_next_one_starts_another(daemon, tmp_path):
    _, servers = daemon
    gate = str(tmp_path / "gate")
    caught: list[BaseException] = []

    def running():
        try:
            _run(EchoTask(wait_for=gate), partition=3, count=2, batch=9)
        except BaseException as error:
            caught.append(error)

    thread = threading.Thread(target=running)
    thread.start()
    started = Path(gate + ".started")
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    victim = int(started.read_text())
    os.kill(victim, signal.SIGKILL)
    thread.join(30)
    assert len(caught) == 1 and isinstance(caught[0], ss.StateServerLost)
    assert f"state server {victim} (slot 1 of 2)" in str(caught[0])
    assert "partition 3 of micro-batch 9 (attempt 0)" in str(caught[0])
    out, metrics = _run(EchoTask(), partition=3, count=2)
    pid = _pid_of(out)
    servers.add(pid)
    assert pid != victim and metrics == {"rows": 3, "partition": 3}


def test_an_operator_starts_only_the_servers_its_partitions_map_to(daemon):
    """Two partitions on an executor of four servers: the first task starts the
    servers of slots 0 and 1, not 2 and 3; an operator of more partitions starts
    slot 3's when its first task there needs it."""
    sleeper, servers = daemon
    first = _pid_of(_run(EchoTask(), partition=1, count=4, partitions=2)[0])
    servers.add(first)

    def listening():
        return [_listening(protocol.server_address(sleeper.pid, 4, s)) for s in range(4)]

    deadline = time.monotonic() + 30
    while listening() != [True, True, False, False] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listening() == [True, True, False, False]
    assert _pid_of(_run(EchoTask(), partition=0, count=4, partitions=2)[0]) != first
    later = _pid_of(_run(EchoTask(), partition=3, count=4, partitions=7)[0])
    servers.update(_pid_of(_run(EchoTask(), partition=p, count=4)[0]) for p in (0, 2))
    servers.add(later)
    assert listening() == [True, True, True, True] and later != first


def test_workers_that_find_no_server_at_once_start_one_process_per_slot(daemon, monkeypatch):
    """Four tasks of a fresh operator (four slots) start at the same moment, as an
    executor's first micro-batch does: the worker that binds a slot's name starts
    its server, every other waits in that server's backlog. Four processes in all,
    not one per task and slot (each costs an interpreter and its imports)."""
    _, servers = daemon
    real, starts = client.subprocess.Popen, []

    def counting(args, **kwargs):
        starts.append(args[3])  # the socket name
        return real(args, **kwargs)

    monkeypatch.setattr(client.subprocess, "Popen", counting)
    gate = threading.Barrier(4)
    server_pids: dict[int, int] = {}

    def task(partition):
        gate.wait()
        server_pids[partition] = _pid_of(_run(EchoTask(), partition=partition, count=4)[0])

    threads = [threading.Thread(target=task, args=(p,)) for p in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    servers.update(server_pids.values())
    assert sorted(server_pids) == [0, 1, 2, 3] and len(set(server_pids.values())) == 4
    assert sorted(starts) == sorted(
        protocol.server_address(client.daemon_pid(), 4, s)[1:] for s in range(4)
    )


def test_a_task_waiting_on_a_server_that_dies_while_starting_gets_another(daemon):
    """A task finds the slot's name bound (a worker started the server, which is
    still importing) and waits in its backlog; the server dies before it accepts:
    the name goes with it, and the task binds it, starts a server of its own and
    runs there."""
    sleeper, servers = daemon
    dying = protocol.bind(protocol.server_address(sleeper.pid, 1, 0))
    assert dying is not None
    ran: list = []
    thread = threading.Thread(target=lambda: ran.append(_run(EchoTask(), partition=0, count=1)))
    thread.start()
    readable, _, _ = select.select([dying], [], [], 30)  # the task is in the backlog
    assert readable == [dying]
    dying.close()
    thread.join(60)
    (out, metrics), = ran
    pid = _pid_of(out)
    servers.add(pid)
    assert pid != os.getpid() and metrics == {"rows": 3, "partition": 0}


def test_a_server_refuses_a_listening_socket_bound_to_another_name():
    other = protocol.bind(f"\0sessionstore-state-test-{os.getpid()}-other")
    with other, pytest.raises(SystemExit, match="is not a socket bound to 'wanted'"):
        server.main(["wanted", str(os.getpid()), "--listen-fd", str(os.dup(other.fileno()))])


def test_servers_end_with_their_daemon(daemon):
    sleeper, servers = daemon
    server_pids = {_pid_of(_run(EchoTask(), partition=p, count=2)[0]) for p in (0, 1)}
    assert len(server_pids) == 2
    servers.update(server_pids)
    sleeper.kill()  # the fixture checks that both servers end within 10 s


def test_a_malformed_request_is_dropped_and_the_server_serves_on(daemon):
    _, servers = daemon
    out, _ = _run(EchoTask(), partition=0, count=1)
    pid = _pid_of(out)
    servers.add(pid)
    address = protocol.server_address(client.daemon_pid(), 1, 0)
    for garbage in (b"", b"nonsense-nonsense-nonsense", protocol.REQUEST.pack(b"SSV1", 1, 1 << 40)):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(address)
            conn.sendall(garbage)
    again, _ = _run(EchoTask(), partition=0, count=1)
    assert _pid_of(again) == pid


class FrozenProbe:
    """Reports the server it runs in and how many objects that process has frozen
    out of its garbage collections (``gc.freeze``)."""

    def run(self, batches, context):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict(
            {"pid": [os.getpid()], "frozen": [gc.get_freeze_count()]}
        )


def test_a_server_freezes_what_its_first_task_imported_once_the_task_is_answered(daemon):
    """A server is a long-lived process: after the connection of a task that
    imported modules it freezes them out of later collections (long_lived), so the
    next task finds them frozen, and a task that imports nothing new freezes no more."""
    _, servers = daemon
    runs = [pa.Table.from_batches(_run(FrozenProbe(), partition=0, count=1)[0][-1:])
            for _ in range(3)]  # fmt: skip
    pids = {t.column("pid")[0].as_py() for t in runs}
    servers.update(pids)
    assert len(pids) == 1  # one warm server
    first, second, third = (t.column("frozen")[0].as_py() for t in runs)
    # the first task runs before the freeze that follows its answer (Python 3.12
    # starts with a few hundred objects frozen already); the next finds the
    # server's modules frozen (pyarrow, the store, the task's)
    assert second > first + 20_000
    assert third <= second  # nothing new imported: no second freeze


def test_an_idle_server_closes_its_listener_and_returns():
    address = f"\0sessionstore-state-test-{os.getpid()}-idle"
    listener = protocol.bind(address)
    assert listener is not None
    assert protocol.bind(address) is None  # the name is the lock
    thread = threading.Thread(target=server.serve, args=(listener, os.getpid(), 0.2))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        with pytest.raises(ConnectionRefusedError):
            conn.connect(address)


@pytest.mark.parametrize(
    ("master", "session", "context", "want"),
    [
        ("local[2]", {}, {}, 4),
        ("local[2,3]", {}, {}, 4),
        ("local", {}, {}, 2),
        ("local[*]", {}, {}, 2 * (os.cpu_count() or 1)),
        ("local-cluster[2, 3, 1024]", {}, {}, 6),
        ("spark://h:7077", {}, {"spark.executor.cores": "4", "spark.task.cpus": "2"}, 4),
        ("yarn", {}, {}, None),
        ("local[2]", {ss.SERVERS_CONF: "off"}, {}, 0),
        ("local[2]", {ss.SERVERS_CONF: "3"}, {}, 3),
        ("local[2]", {ss.SERVERS_CONF: " Auto "}, {}, 4),
    ],
)
def test_server_count(master, session, context, want):
    assert ss.server_count(fake_session(session, master=master, context_conf=context)) == want


@pytest.mark.parametrize("bad", ["-1", "many", "2.5"])
def test_a_bad_server_count_is_refused_naming_the_key_and_value(bad):
    with pytest.raises(ValueError, match=rf"spark.sessionstore.stateServers .*{bad!r}"):
        ss.server_count(fake_session({ss.SERVERS_CONF: bad}))


@pytest.mark.slow
def test_in_spark_partitions_stay_warm_in_their_servers_and_a_killed_server_loses_nothing(
    spark, tmp_path
):
    """sessionize over 5 micro-batches at 4 partitions: every task after the first
    batch finds its database open (in the partition's server, whichever Python
    worker Spark picked); all servers killed with SIGKILL between batches 2 and 3,
    the next tasks start new ones, which load the committed state, the batch after
    finds them warm again, and the output equals the offline model and the same
    query with servers off."""
    from sessionstore.tools.reader import CheckpointSource
    from spark_integration import StateBackend, sessionize
    from tests.models import offline_sessions
    from tests.spark.streams import json_source, run_stream, without_due_batches, write_json
    from tests.spark.test_sessionize import GAP_MS, SCHEMA, as_sessions, generated, rows_of

    # 3 batches of events and 2 that close every session: warm in batches 1, 2
    # and 4, new servers in batch 3
    batches = generated(seed=21, batches=3)
    killed: list[int] = []

    def kill_servers(local: Path) -> None:
        for owner in local.rglob("owner"):
            pid = int(owner.read_text())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert b"spark_integration.execution.state_server" in f.read()  # held by a server
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    def run(mode: str) -> tuple[list[dict], str]:
        spark.conf.set(ss.SERVERS_CONF, mode)
        try:
            uri, local = f"file://{tmp_path}/state-{mode}", tmp_path / f"local-{mode}"
            with without_due_batches(spark):  # a batch (and a load) per file
                out = sessionize(
                    json_source(spark, tmp_path / f"in-{mode}", SCHEMA), key="user",
                    timestamp="ts", gap=f"{GAP_MS} ms", aggregations={"n": "count"},
                    backend=StateBackend(uri, local_dir=str(local)), name="warm",
                    num_partitions=4,
                )  # fmt: skip
        finally:
            spark.conf.unset(ss.SERVERS_CONF)
        steps = []
        for i, rows in enumerate(batches):
            if mode == "auto" and i == 3:
                steps.append(lambda local=local: kill_servers(local))
            steps.append(
                lambda i=i, rows=rows, m=mode: write_json(tmp_path / f"in-{m}", i, rows_of(rows))
            )
        return run_stream(out, tmp_path / f"ck-{mode}", steps), uri

    served, uri = run("auto")
    # the servers started after the kill ran this query's tasks alone: none of them
    # imported pandas (sessionstore.arrow_pandas; an earlier test's tasks may have,
    # in the servers of this session's executor that ran them)
    after = {int(owner.read_text()) for owner in (tmp_path / "local-auto").rglob("owner")}
    assert after and not after & set(killed)
    for pid in after:
        with open(f"/proc/{pid}/maps") as f:
            assert "/pandas/_libs/" not in f.read(), f"state server {pid} imported pandas"
    events = [(u, None, ts) for rows in batches for u, ts, _ in rows if u != "zz-close"]
    got = [s for s in as_sessions(served) if s[0] != "zz-close"]
    assert got == offline_sessions(events, GAP_MS)
    in_worker, _ = run("off")
    assert sorted(map(sorted, (r.items() for r in served))) == sorted(
        map(sorted, (r.items() for r in in_worker))
    )
    assert len(set(killed)) >= 2  # at least two servers held the 4 partitions
    loads = [row["loads"] for row in CheckpointSource(uri, {}).batch_metrics("warm")]
    assert len(loads) == len(batches)
    for batch, kinds in enumerate(loads):
        if batch in (0, 3):  # the first batch, and the first after the kill: a new process
            assert kinds.get("warm", 0) == 0, (batch, kinds)
        else:
            assert kinds == {"warm": 4}, (batch, kinds)


def test_a_spark_task_running_several_partitions_sends_each_server_one_request(
    daemon, monkeypatch
):
    """fewer Spark tasks than partitions: the partitions of one server go to it in
    one request (a group: the operator task pickled once with it), each runs with
    its own rows and context there, and the pickle on the executor side does not
    carry that cache."""
    import pickle

    from pyspark import cloudpickle

    from spark_integration.conf.names import SHARD
    from spark_integration.execution.sharding import PartitionGroup, ShardedTask

    _, servers = daemon
    calls = []
    dumps = cloudpickle.dumps
    monkeypatch.setattr(cloudpickle, "dumps", lambda obj, *a, **k: calls.append(obj) or dumps(obj))
    sharded = ShardedTask(EchoTask(), 3, 1, servers=1)
    schema = pa.schema([("x", pa.int64()), (SHARD, pa.int32())])
    batch = pa.record_batch([[1, 2, 3], [0, 2, 2]], schema=schema)
    out = list(sharded.run(iter([batch]), TaskContext(TaskInfo(0, 4, 0, "run"))))
    tables = [pa.Table.from_batches([b]).to_pylist() for b in out]
    assert [t for t in tables if "x2" in t[0]] == [[{"x2": 2}], [{"x2": 4}, {"x2": 6}]]
    ran = [t[0] for t in tables if "pid" in t[0]]
    assert [(r["partition"], r["batch"]) for r in ran] == [(0, 4), (1, 4), (2, 4)]
    servers.update(r["pid"] for r in ran)
    assert len({r["pid"] for r in ran}) == 1
    assert [type(c) for c in calls] == [PartitionGroup]
    assert calls[0].partitions == [0, 1, 2]
    assert "_body" not in pickle.loads(pickle.dumps(sharded)).__dict__


def test_the_partitions_of_a_spark_task_go_to_their_servers_one_request_each(daemon):
    """Two servers: partitions 0 and 2 run in server 0, partition 1 in server 1,
    one request each, every row with its own partition."""
    from spark_integration.conf.names import SHARD
    from spark_integration.execution.sharding import ShardedTask

    _, servers = daemon
    schema = pa.schema([("x", pa.int64()), (SHARD, pa.int32())])
    batch = pa.record_batch([[1, 2, 3, 4], [2, 1, 0, 2]], schema=schema)
    out = list(ShardedTask(EchoTask(), 3, 1, servers=2).run(
        iter([batch]), TaskContext(TaskInfo(0, 7, 0, "run"))
    ))  # fmt: skip
    tables = [pa.Table.from_batches([b]).to_pylist() for b in out]
    assert [t for t in tables if "x2" in t[0]] == [[{"x2": 6}], [{"x2": 2}, {"x2": 8}], [{"x2": 4}]]
    ran = [t[0] for t in tables if "pid" in t[0]]
    assert [(r["partition"], r["batch"]) for r in ran] == [(0, 7), (2, 7), (1, 7)]
    servers.update(r["pid"] for r in ran)
    ran_in = [r["pid"] for r in ran]
    assert ran_in[0] == ran_in[1] != ran_in[2]


# ------------------------------------------------------------- trust (issue 28)
@needs_root
def test_a_server_of_another_user_that_holds_the_name_is_sent_nothing(daemon, caplog, monkeypatch):
    """A process of ``nobody`` binds the slot's name first: the worker checks its
    credentials after connecting, sends it no byte, says why in one line, and runs
    the task itself."""
    this_process().forget(client.UNAVAILABLE_WARNING)
    address = protocol.server_address(client.daemon_pid(), 1, 0)

    def fake_server(ready):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(8)
        listener.settimeout(30)
        ready()
        connections = received = 0
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                return connections, received
            listener.settimeout(2)  # the worker's connections come at once
            connections += 1
            conn.settimeout(2)
            try:
                while chunk := conn.recv(1 << 16):
                    received += len(chunk)
            except TimeoutError:
                pass
            conn.close()

    fake = AsNobody(fake_server)
    fake.wait_ready()
    with caplog.at_level("WARNING", logger=ss.__name__):
        out, metrics = _run(EchoTask(), partition=0, count=1)
    assert out[-1].column("pid").to_pylist() == [os.getpid()]  # ran in the worker
    assert metrics == {"rows": 3, "partition": 0}
    connections, received = fake.result()
    assert connections >= 1 and received == 0
    lines = [r.getMessage() for r in caplog.records if "uid 65534" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert f"held by pid {fake.pid} of uid 65534, not uid 0: nothing was sent" in lines[0]


class _Marker:
    """Unpickling this creates the file ``path`` (stands for any code a pickle runs)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _hostile_server(address: str, frames: list[bytes]) -> threading.Thread:
    """A server of our own user that accepts one task and answers with ``frames``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(1)

    def serve():
        with listener:
            conn, _ = listener.accept()
            with conn:
                _, info, task = protocol.REQUEST.unpack(
                    protocol.read_exact(conn, protocol.REQUEST.size)
                )
                protocol.read_exact(conn, info + task)
                protocol.send_frame(conn, protocol.ACCEPTED, b"4242")
                conn.sendall(b"".join(frames))
                time.sleep(0.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("kind", ["metrics", "error"])
def test_a_pickle_in_a_servers_frame_is_never_unpickled(daemon, tmp_path, kind):
    import pickle

    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Marker(str(marker)))
    if kind == "metrics":
        frame = protocol.FRAME.pack(protocol.METRICS, len(payload)) + payload
    else:  # text, then a pickled exception: the layout a worker used to unpickle
        text = b"Traceback: ValueError: boom"
        body = struct.pack("<Q", len(text)) + text + payload
        frame = protocol.FRAME.pack(protocol.ERROR, len(body)) + body
    thread = _hostile_server(protocol.server_address(client.daemon_pid(), 1, 0), [frame])
    with pytest.raises(
        ss.StateServerLost, match=f"malformed {'metrics' if kind == 'metrics' else 'error'}"
    ):
        _run(EchoTask(), partition=0, count=1)
    thread.join(5)
    assert not marker.exists()


def test_a_frame_claiming_two_to_the_40_bytes_is_refused_without_allocating_it(daemon):
    import tracemalloc

    frame = protocol.FRAME.pack(protocol.OUTPUT, 2**40)
    thread = _hostile_server(protocol.server_address(client.daemon_pid(), 1, 0), [frame])
    tracemalloc.start()
    try:
        with pytest.raises(ss.StateServerLost, match=f"claiming {2**40} bytes"):
            _run(EchoTask(), partition=0, count=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    thread.join(5)
    assert peak < 16 << 20


def test_an_error_of_a_type_outside_the_allow_list_arrives_as_a_runtime_error_with_its_text():
    payload = msgpack.packb(["os.system", "rm -rf /", "Traceback ...\nos.system: rm -rf /"])
    error, text = protocol.error_of(payload)
    assert type(error) is RuntimeError and str(error) == "os.system: rm -rf /"
    assert text.endswith("os.system: rm -rf /")
    error, _ = protocol.error_of(msgpack.packb(["KeyError", "'k'", "..."]))
    assert type(error) is KeyError
    error, _ = protocol.error_of(
        protocol.error_payload(StatefulProcessorError("SOME_CLASS", "what"))
    )
    assert type(error) is StatefulProcessorError and error.error_class == "SOME_CLASS"
    assert str(error) == "[SOME_CLASS] what"


def _connect_session(master):
    """A Spark Connect client session (by its class's module) whose server's master
    is ``master``: the client has no SparkContext."""
    conf = {"spark.master": master}
    conf_api = SimpleNamespace(get=lambda key, default=None: conf.get(key, default), getAll=conf)
    cls = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
    session = cls()
    session.conf = conf_api
    return session


@pytest.mark.parametrize(("master", "want"), [("local[*]", None), ("local[3]", 6), ("local", 2)])
def test_server_count_under_spark_connect_never_counts_the_client_cores(master, want):
    # local[*] is the server's cores, which the client cannot see: each executor
    # then counts its own
    assert ss.server_count(_connect_session(master)) == want


def _package(root: Path, name: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")


def test_a_server_imports_an_installed_pyspark_not_its_archive(tmp_path, monkeypatch):
    """Python keeps no bytecode for modules imported from an archive: a server
    importing pyspark from the pip package's own pyspark.zip (what Spark puts first
    for its workers in local mode) compiled about 190 modules at every start. The
    archives of the installed package go, and its spark-core jar (a directory of
    6,000 entries read at every start); a Spark distribution's elsewhere (a
    cluster's SPARK_HOME, maybe another release) stay, and all stay where the
    installed copy lacks py4j."""
    site = tmp_path / "site-packages"
    _package(site, "pyspark")
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    archives = [
        str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"),
        str(site / "pyspark" / "jars" / "spark-core_2.13-4.3.0.jar"),  # Spark adds it too
    ]  # fmt: skip
    home = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")
    home_jar = str(tmp_path / "spark-home" / "jars" / "spark-core_2.13-4.3.0.jar")
    # "" (the working folder, in sys.path) is an entry like any other
    assert without_installed_archives([*archives, "", "/tree", str(site)]) == [
        *archives, "", "/tree", str(site),
    ]  # fmt: skip
    _package(site, "py4j")
    assert without_installed_archives([*archives, "", "/tree", str(site)]) == [
        "", "/tree", str(site),
    ]  # fmt: skip
    assert without_installed_archives([home, *archives, home_jar, str(site)]) == [
        home, home_jar, str(site),
    ]  # fmt: skip
    # only Spark's spark-core jar goes: others beside it may be a user's, with
    # Python in them, and a folder whose name only ends in "pyspark" is not the
    # installed package's
    others = [
        str(site / "pyspark" / "jars" / "udfs.jar"),
        str(site / "pyspark" / "python" / "lib" / "extra.jar"),
        str(site / "mypyspark" / "jars" / "spark-core_2.13-4.3.0.jar"),
        str(site / "mypyspark" / "python" / "lib" / "pyspark.zip"),
    ]
    assert without_installed_archives([*others, str(site)]) == [*others, str(site)]
    assert without_installed_archives(archives) == archives  # the site is not on the path
    # what a server is started with
    started = []
    monkeypatch.setattr(client.subprocess, "Popen", lambda *a, **kw: started.append(kw["env"]))
    monkeypatch.setattr(client.sys, "path", [*archives, "", "/tree", str(site)])
    client._start("\0address", 1)
    assert started[0]["PYTHONPATH"] == os.pathsep.join(["/tree", str(site)])
