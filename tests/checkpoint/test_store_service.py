"""StoreService: warm providers, handover between processes, background snapshots."""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.service.store_service import StoreService

SPECS = [StoreSpec("sessions", "session", 10**12)]


def test_warm_reuse_and_background_snapshots(tmp_path):
    remote, local = f"file://{tmp_path}/remote", str(tmp_path / "local")
    service = StoreService()

    def make():
        return StateStoreProvider(remote, "op", 0, SPECS, local, snapshot_interval=3)

    for v in range(7):
        with service.provider("k", make) as provider:
            handle = provider.get_store(v)
            handle["sessions"].put("a", v, v, v)
            version = handle.commit()
        if version % 3 == 0:
            service.maintain_later("k")
    service.drain()
    assert service.stats == {
        "opened": 1, "reused": 6, "released": 0, "parked": 0, "maintenance": 2,
    }  # fmt: skip
    # serving handovers: a busy task must not delay the reply by 5 ms per GIL hand-off
    assert sys.getswitchinterval() <= 0.0005
    assert sorted(os.listdir(tmp_path / "remote" / "op" / "0" / "snapshot")) == [
        "3.manifest", "6.manifest",
    ]  # fmt: skip
    # a failing task closes and forgets its provider; the next use restores properly
    try:
        with service.provider("k", make) as provider:
            provider.get_store(7)["sessions"].put("a", 99, 99, 99)
            raise RuntimeError("task failed")
    except RuntimeError:
        pass
    with service.provider("k", make) as provider:
        handle = provider.get_store(7)
        assert [w.start for w, _ in handle["sessions"].fetch("a")] == list(range(7))
        handle.abort()
    assert service.stats["opened"] == 2
    service.close_all()


WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from sessionstore import StateStoreProvider, StoreSpec
    from sessionstore.checkpoint.service.store_service import StoreService
    remote, local, baton, me = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    specs = [StoreSpec("sessions", "session", 10**12)]
    service = StoreService.instance()
    make = lambda: StateStoreProvider(remote, "op", 0, specs, local)
    for v in range(me, 8, 2):
        while not os.path.exists(f"{baton}/turn-{v}"):
            time.sleep(0.01)
        with service.provider("op/0", make) as provider:
            h = provider.get_store(v)
            h["sessions"].put(f"k{v}", v, v, me)
            h.commit()
        open(f"{baton}/turn-{v + 1}", "w").close()
    while not os.path.exists(f"{baton}/turn-8"):  # stay alive to hand the database over
        time.sleep(0.01)
    service.drain()
    print(json.dumps(service.stats))
    """
)


def test_two_processes_hand_a_partition_back_and_forth(tmp_path):
    remote, local, baton = f"file://{tmp_path}/remote", str(tmp_path / "local"), tmp_path
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, remote, local, str(baton), str(me)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for me in (0, 1)
    ]
    (baton / "turn-0").touch()
    outs = [p.communicate(timeout=120) for p in procs[::-1]][::-1]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    stats = [json.loads(out) for out, _ in outs]
    # every batch opened the database the other process had used: the first one on
    # request, later ones on request or after the other process closed it when idle
    assert [s["opened"] for s in stats] == [4, 4]
    assert stats[0]["released"] >= 1
    assert [s["released"] + s["parked"] for s in stats] == [4, 4]
    p = StateStoreProvider(remote, "op", 0, SPECS, str(tmp_path / "check"))
    h = p.get_store(8)
    assert [(w.key, v) for w, v in h["sessions"].fetch_range(None, None)] == [
        (f"k{v}", v % 2) for v in range(8)
    ]
    p.close()


def test_without_a_handover_socket_databases_are_closed_after_each_use(tmp_path, monkeypatch):
    from sessionstore.checkpoint.service import store_service

    monkeypatch.setattr(store_service, "_addresses", lambda pid: [f"{tmp_path}/no/such/dir/s"])
    service = StoreService()

    def make():
        return StateStoreProvider(f"file://{tmp_path}/remote", "op", 0, SPECS, tmp_path / "l")

    for v in range(3):
        with service.provider("k", make) as provider:
            handle = provider.get_store(v)
            handle["sessions"].put("a", v, v, v)
            handle.commit()
        # closed, so another process could open it at once
        other = StateStoreProvider(f"file://{tmp_path}/remote", "op", 0, SPECS, tmp_path / "l")
        other.open_local()
        other.close()
    assert service.stats["opened"] == 3 and service.stats["reused"] == 0


def test_a_handover_while_a_task_waits_does_not_orphan_the_provider(tmp_path):
    service = StoreService()

    def make():
        return StateStoreProvider(f"file://{tmp_path}/remote", "op", 0, SPECS, tmp_path / "l")

    with service.provider("k", make) as provider:
        provider.get_store(0).commit()
    entry = service._entries["k"]
    real = entry.lock

    class HandoverFirst:  # another process takes the partition just before we lock it
        def __enter__(self):
            entry.lock = real
            service._forget("k", entry)
            return real.__enter__()

        def __exit__(self, *exc):
            return real.__exit__(*exc)

    entry.lock = HandoverFirst()
    with service.provider("k", make) as provider:
        assert provider.get_store(1).commit() == 2
    with service.provider("k", make) as provider:  # listed again, so warm: no second open
        assert provider.get_store(2).commit() == 3
    assert service.stats["opened"] == 2 and service.stats["reused"] == 1
    service.close_all()


HOLDER = textwrap.dedent(
    """
    import json, os, sys, time
    from sessionstore import StateStoreProvider, StoreSpec
    from sessionstore.checkpoint.service.store_service import StoreService
    remote, local, baton = sys.argv[1], sys.argv[2], sys.argv[3]
    specs = [StoreSpec("sessions", "session", 10**12)]
    service = StoreService.instance()

    def run(partition, version):
        make = lambda: StateStoreProvider(remote, "op", partition, specs, local)
        with service.provider(f"op/{partition}", make) as provider:
            provider.get_store(version).commit()

    def wait(name):
        while not os.path.exists(f"{baton}/{name}"):
            time.sleep(0.01)

    run(0, 0)
    run(1, 0)
    held = sorted(k for k, e in service._entries.items() if e.provider.local_open)
    open(f"{baton}/ready", "w").close()
    wait("go")  # meanwhile the other process took partition 0 from us
    run(1, 1)
    run(2, 0)
    service.drain()  # idle now: its databases are closed on a timer thread
    open(f"{baton}/done", "w").close()
    wait("exit")
    print(json.dumps({**service.stats, "held_before": held, "contended": service.contended}))
    """
)


def test_a_contended_process_closes_its_databases_when_idle(tmp_path):
    """Alone, a process keeps every partition warm. Once another process asked it
    for one, it closes its databases when idle, so the next process to want them
    opens them without waiting for a busy holder's reply."""
    remote, local, baton = f"file://{tmp_path}/remote", str(tmp_path / "local"), tmp_path
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, remote, local, str(baton)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    service = StoreService()

    def run(partition, version):
        def make():
            return StateStoreProvider(remote, "op", partition, SPECS, local)

        with service.provider(f"op/{partition}", make) as provider:
            assert provider.get_store(version).commit() == version + 1

    def wait(name):
        while not (baton / name).exists():
            assert holder.poll() is None, holder.communicate()[1]
            time.sleep(0.01)

    try:
        wait("ready")
        run(0, 1)  # held by the other process: asked for and handed over
        assert service.contended
        (baton / "go").touch()
        wait("done")
        run(1, 2)  # closed by the idle holder: opened without a request
    finally:
        (baton / "exit").touch()
        out, err = holder.communicate(timeout=120)
        service.close_all()
    assert holder.returncode == 0, err
    stats = json.loads(out)
    assert stats["held_before"] == ["op/0", "op/1"]
    assert stats["contended"] is True
    # partition 0 was handed over on request; 1 and 2 were closed once idle
    assert (stats["released"], stats["parked"]) == (1, 2)
    # partition 1 was still warm for the holder's second task; 2 was a new open
    assert (stats["opened"], stats["reused"]) == (3, 1)
    assert service.stats["opened"] == 2


# ------------------------------------------------------- the handover socket's guard
def _ask(address, payload, timeout=5.0):
    """Send ``payload`` to the handover socket at ``address``; its answer (b"" when
    the connection was closed unanswered)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(address)
        try:
            conn.sendall(payload)
            return conn.recv(16)
        except (BrokenPipeError, ConnectionResetError):  # closed before it all arrived
            return b""


@pytest.fixture
def service(monkeypatch):
    """A fresh service listening on an abstract socket of its own: (service, address)."""
    from sessionstore.checkpoint.service import store_service

    address = f"\0sessionstore-test-{os.getpid()}-{uuid.uuid4().hex}"
    monkeypatch.setattr(store_service, "_addresses", lambda pid: [address])
    service = StoreService()
    yield service, address
    service.close_all()


def _held(service, tmp_path, partitions=(0,)):
    """``service`` holding the databases of ``partitions`` open; their paths."""
    paths = []
    for partition in partitions:

        def make(partition=partition):
            return StateStoreProvider(
                f"file://{tmp_path}/remote", "op", partition, SPECS, tmp_path / "l"
            )

        with service.provider(f"op/{partition}", make) as provider:
            provider.get_store(0).commit()
            paths.append(provider.local_db_path)
    return paths


def _open(service, key):
    return service._entries[key].provider.local_open


def test_a_handover_request_from_another_user_is_refused(service, tmp_path, caplog):
    if os.geteuid() != 0:
        pytest.skip("running a client as another user needs root (os.setuid to nobody)")
    nobody = pwd.getpwnam("nobody")
    service, address = service
    (path,) = _held(service, tmp_path)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the client: another uid, same machine and network namespace
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            answer = _ask(address, path.encode() + b"\n")
            os.write(write, json.dumps(["answer", answer.decode(), os.getuid()]).encode())
        except BaseException as e:
            os.write(write, json.dumps(["error", repr(e), -1]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        kind, answer, uid = json.loads(f.read())
    os.waitpid(child, 0)
    assert (kind, answer, uid) == ("answer", "", nobody.pw_uid)  # closed unanswered
    assert _open(service, "op/0") and service.stats["released"] == 0
    assert service.contended is False  # nor does it make us park our databases
    refused = [r for r in caplog.records if "refused a handover" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelname == "WARNING"
    assert f"of uid {nobody.pw_uid}:" in refused[0].getMessage()
    assert refused[0].exc_info is None
    # the same request from our own user is served
    assert _ask(address, path.encode() + b"\n") == b"ok\n"
    assert not _open(service, "op/0") and service.stats["released"] == 1


def test_only_a_database_this_process_holds_is_released(service, tmp_path):
    service, address = service
    zero, one = _held(service, tmp_path, (0, 1))
    others = [
        zero + "/", zero + "x", os.path.dirname(zero), str(tmp_path / "l" / "op" / "2" / "db"),
        "", "relative/db", zero.replace("/0/", "/00/"),
    ]  # fmt: skip
    for other in others:
        assert _ask(address, other.encode() + b"\n") == b"no\n", other
    assert _open(service, "op/0") and _open(service, "op/1")
    assert service.stats["released"] == 0
    assert _ask(address, one.encode() + b"\n") == b"ok\n"
    assert _open(service, "op/0") and not _open(service, "op/1")
    assert service.stats["released"] == 1


def test_a_request_waiting_for_a_busy_task_holds_up_no_other_client(service, tmp_path):
    """A request for the database a task of ours is using is answered when the task
    ends; meanwhile other requests are answered at once, and a client that never
    finishes its request delays nobody."""
    service, address = service
    zero, one = _held(service, tmp_path, (0, 1))
    answers = {}

    def ask(name, payload):
        answers[name] = _ask(address, payload, timeout=10)

    def make():
        return StateStoreProvider(f"file://{tmp_path}/remote", "op", 0, SPECS, tmp_path / "l")

    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with service.provider("op/0", make):  # a task of ours uses partition 0
            stuck.connect(address)
            stuck.sendall(b"/no/newline/yet")
            waiter = threading.Thread(target=ask, args=("zero", zero.encode() + b"\n"))
            waiter.start()
            time.sleep(0.2)
            assert "zero" not in answers and _open(service, "op/0")
            t0 = time.monotonic()
            ask("one", one.encode() + b"\n")
            assert answers["one"] == b"ok\n" and time.monotonic() - t0 < 0.5
            assert "zero" not in answers
            t0 = time.monotonic()
        waiter.join(5)
        assert answers["zero"] == b"ok\n" and time.monotonic() - t0 < 0.5  # as the task ends
        assert not _open(service, "op/0") and service.stats["released"] == 2
        stuck.settimeout(5)
        assert stuck.recv(16) == b""  # dropped after its short timeout
    finally:
        stuck.close()


IDLE_HOLDER = textwrap.dedent(
    """
    import json, os, sys, time
    from sessionstore import StateStoreProvider, StoreSpec
    from sessionstore.checkpoint.service.store_service import StoreService
    remote, local, baton = sys.argv[1], sys.argv[2], sys.argv[3]
    specs = [StoreSpec("sessions", "session", 10**12)]
    service = StoreService.instance()
    make = lambda: StateStoreProvider(remote, "op", 0, specs, local)
    with service.provider("op/0", make) as provider:
        provider.get_store(0).commit()
        path = provider.local_db_path
    with open(f"{baton}/ready.tmp", "w") as f:
        f.write(path)
    os.rename(f"{baton}/ready.tmp", f"{baton}/ready")
    while not os.path.exists(f"{baton}/exit"):
        time.sleep(0.01)
    print(json.dumps(service.stats))
    """
)


def _status(pid):
    """(resident set size in kB, thread count, open file descriptors) of ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    rss_kb = int(fields["VmRSS"].split()[0])
    return rss_kb, int(fields["Threads"]), len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def idle_holder(tmp_path):
    """A worker process holding partition 0 open and otherwise idle: (pid, db path)."""
    remote, local = f"file://{tmp_path}/remote", str(tmp_path / "l")
    holder = subprocess.Popen(
        [sys.executable, "-c", IDLE_HOLDER, remote, local, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert holder.poll() is None, holder.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield holder, (tmp_path / "ready").read_text()
    finally:
        (tmp_path / "exit").touch()
        try:
            holder.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.communicate()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_an_oversized_or_slow_request_is_dropped_without_growing_memory(idle_holder):
    holder, _ = idle_holder
    rss_before, _, _ = _status(holder.pid)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(f"\0sessionstore-store-service-{holder.pid}")
        t0 = time.monotonic()
        try:
            conn.sendall(b"x" * (10 << 20))  # 10 MB, no newline
            dropped = conn.recv(16) == b""
        except (BrokenPipeError, ConnectionResetError):
            dropped = True
        assert dropped and time.monotonic() - t0 < 5
    rss_after, _, _ = _status(holder.pid)
    assert rss_after - rss_before < 4 * 1024, (rss_before, rss_after)
    # a client that connects and sends part of a request is dropped after a short wait
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(f"\0sessionstore-store-service-{holder.pid}")
        conn.sendall(b"/tmp/par")
        t0 = time.monotonic()
        assert conn.recv(16) == b""
        assert 0.5 < time.monotonic() - t0 < 5


def _connect(conn, address, timeout=10.0):
    """Connect, waiting while the listener's backlog is full (a socket with a timeout
    gets EAGAIN then, instead of blocking)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return conn.connect(address)
        except BlockingIOError:
            assert time.monotonic() < deadline, "the listener accepts nothing"
            time.sleep(0.001)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_a_connection_flood_starts_no_threads_and_a_handover_still_works(idle_holder, tmp_path):
    holder, path = idle_holder
    _, threads_before, fds_before = _status(holder.pid)
    flood, most_threads, most_fds = [], threads_before, fds_before
    try:
        for i in range(1000):  # connected at once, none of them sends a whole request
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            flood.append(conn)
            conn.settimeout(10)
            _connect(conn, f"\0sessionstore-store-service-{holder.pid}")
            if i % 2:
                conn.sendall(b"/partial/path")
            if i % 100 == 99:
                _, threads, fds = _status(holder.pid)
                most_threads, most_fds = max(most_threads, threads), max(most_fds, fds)
        assert most_threads == threads_before, (threads_before, most_threads)
        assert most_fds <= fds_before + 64 + 2, (fds_before, most_fds)
        # a real handover, with the flood still connected
        service = StoreService()
        t0 = time.monotonic()
        with service.provider(
            "op/0",
            lambda: StateStoreProvider(f"file://{tmp_path}/remote", "op", 0, SPECS, tmp_path / "l"),
        ) as provider:
            assert provider.local_db_path == path
            assert provider.get_store(1).commit() == 2
        assert time.monotonic() - t0 < 5
        service.close_all()
    finally:
        for conn in flood:
            conn.close()
    (tmp_path / "exit").touch()
    out, err = holder.communicate(timeout=30)
    assert holder.returncode == 0, err
    assert json.loads(out)["released"] == 1
