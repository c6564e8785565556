"""StoreService: warm providers, handover between processes, background snapshots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.store_service import StoreService

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
    from sessionstore.checkpoint.store_service import StoreService
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
    from sessionstore.checkpoint import store_service

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
    from sessionstore.checkpoint.store_service import StoreService
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
