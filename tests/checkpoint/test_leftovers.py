"""What a crash leaves in a local folder is swept by the next provider, and never
what a live process is using (leftovers.py): writers killed with SIGKILL mid-restore
and mid-snapshot, a restore of a release that took no lock, and a live restore
paused in another process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sessionstore import StateStoreProvider, StoreSpec

SPECS = [StoreSpec("values", "kv", 0)]
ROOT = Path(__file__).resolve().parents[2]

#: ``mode`` (crash-restore, crash-snapshot, pause-restore) happens in this process
#: to partition 0 of ``uri`` under ``local``; it prints its value at version 2 (a
#: pause waits for the file ``go`` first)
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import sessionstore.checkpoint.partition.commit as commit
    import sessionstore.checkpoint.partition.load as load
    from sessionstore import StateStoreProvider, StoreSpec

    uri, local, mode, go = sys.argv[1:5]
    original = load.download_snapshot

    def download(*args, **kw):
        manifest = original(*args, **kw)
        if mode == "crash-restore":
            os.kill(os.getpid(), signal.SIGKILL)
        print("paused", flush=True)
        while not os.path.exists(go):
            time.sleep(0.02)
        return manifest

    def record(*args):
        os.kill(os.getpid(), signal.SIGKILL)

    load.download_snapshot = download
    commit.write_snapshot_record = record
    p = StateStoreProvider(uri, "op", 0, [StoreSpec("values", "kv", 0)], local,
                           snapshot_interval=2)
    if mode == "crash-snapshot":
        for v in range(2):
            h = p.get_store(v)
            h["values"].put("k", f"v{v + 1}")
            h.commit()
    h = p.get_store(2)
    print(h["values"].get("k"), flush=True)
    """
)


def start(uri, local, mode, go):
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, uri, str(local), mode, str(go)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


def checkpoint_with_snapshot_2(tmp_path):
    uri = f"file://{tmp_path}/remote"
    p = StateStoreProvider(uri, "op", 0, SPECS, str(tmp_path / "writer"), snapshot_interval=2)
    for v in range(2):
        h = p.get_store(v)
        h["values"].put("k", f"v{v + 1}")
        h.commit()
    assert p.do_maintenance()["snapshots"] == [2]
    p.close()
    return uri


def leftovers(local):
    return sorted(
        str(path.relative_to(local))
        for path in [*local.glob("op/0.restore-*"), *local.glob("op/0/snapshots/.*")]
    )


def value_at(uri, local, version):
    p = StateStoreProvider(uri, "op", 0, SPECS, str(local))
    h = p.get_store(version)
    try:
        return h["values"].get("k")
    finally:
        h.abort()
        p.close()


@pytest.mark.parametrize("mode", ["crash-restore", "crash-snapshot"])
def test_what_a_killed_restore_or_snapshot_left_is_swept_by_the_next_provider(tmp_path, mode):
    """A writer killed mid-restore leaves its scratch (and its lock); one killed
    while its snapshot was built leaves ``.2.staging``. The next provider on that
    folder sweeps them, with a scratch a release that took no lock left."""
    uri = checkpoint_with_snapshot_2(tmp_path)
    if mode == "crash-snapshot":
        uri = f"file://{tmp_path}/other"  # the writer commits versions 1-2 itself
    local = tmp_path / "local"
    run = start(uri, local, mode, "")
    _, err = run.communicate(timeout=120)
    assert run.returncode == -9, err
    left = leftovers(local)
    if mode == "crash-restore":
        (local / "op" / f"0.restore-{'0' * 32}" / "db").mkdir(parents=True)
        assert any(not name.endswith(".lock") for name in left), left
    else:
        assert left == ["op/0/snapshots/.2.staging"], left
        assert any((local / left[0]).iterdir())  # hard links to the database's files
    assert value_at(uri, local, 2) == "v2"
    assert leftovers(local) == []


def test_a_live_restore_in_another_process_is_never_swept(tmp_path):
    uri = checkpoint_with_snapshot_2(tmp_path)
    local, go = tmp_path / "local", tmp_path / "go"
    paused = start(uri, local, "pause-restore", go)
    try:
        assert paused.stdout.readline() == "paused\n"
        held = leftovers(local)
        assert len(held) == 2 and held[1] == held[0] + ".lock", held
        other = StateStoreProvider(uri, "op", 0, SPECS, str(local))
        other.open_local()  # sweeps what no live process holds
        other.close()
        assert leftovers(local) == held
        go.touch()
        out, err = paused.communicate(timeout=120)
    finally:
        if paused.poll() is None:
            paused.kill()
    assert paused.returncode == 0, err
    assert out == "v2\n"
    assert leftovers(local) == []


def test_a_lock_left_without_its_scratch_is_swept_once_its_owner_is_gone(tmp_path):
    """A process killed between removing its scratch and its lock leaves the lock."""
    local = tmp_path / "local"
    (local / "op" / "0").mkdir(parents=True, mode=0o700)
    for folder in (local, local / "op"):
        folder.chmod(0o700)  # a local dir only its owner can read (private_dir.py)
    lock = local / "op" / f"0.restore-{'1' * 32}.lock"
    lock.touch()  # held by nobody
    p = StateStoreProvider(f"file://{tmp_path}/remote", "op", 0, SPECS, str(local))
    p.open_local()
    p.close()
    assert not lock.exists()


def test_a_catch_ups_download_folder_is_locked_against_another_process_sweep(
    tmp_path, monkeypatch
):
    """A warm copy catching up downloads large changelogs into a scratch folder
    beside the partition: another process opening the partition meanwhile sweeps
    scratch folders whose lock is free, so the catch-up's must be held."""
    import sessionstore.checkpoint.partition.load as load
    from sessionstore.checkpoint.partition.leftovers import sweep_restores
    from sessionstore.checkpoint.records.layout import LocalPartition

    uri = f"file://{tmp_path}/remote"
    warm = StateStoreProvider(uri, "op", 0, SPECS, str(tmp_path / "warm"))
    h = warm.get_store(0)
    h["values"].put("k", "v1")
    h.commit()
    other = StateStoreProvider(uri, "op", 0, SPECS, str(tmp_path / "other"))
    h = other.get_store(1)
    h["values"].put("k", "v2")
    h.commit()
    other.close()
    seen, fetch = [], load.fetch_changelog

    def fetch_while_swept(storage, rel, where, version, spool_dir):
        # another process opening the partition
        sweep_restores(LocalPartition(tmp_path / "warm", "op", 0))
        seen.append(Path(spool_dir).is_dir())
        return fetch(storage, rel, where, version, spool_dir)

    monkeypatch.setattr(load, "fetch_changelog", fetch_while_swept)
    h = warm.get_store(2)
    assert h["values"].get("k") == "v2" and seen == [True], seen
    h.abort()
    warm.close()
