"""A checkpoint deleted and created again at the same URI is another incarnation:
no provider, warm or not, loads, serves or uploads the old one's state into it
(DESIGN.md invariant 9), through the public provider API, on a local folder and
real S3 and GCS endpoints."""

from __future__ import annotations

import msgpack
import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from tests.faults import pause_before_write

SPECS = [StoreSpec("values", "kv", 0)]


def provider(location, local, **kw):
    uri, options = location
    return StateStoreProvider(uri, "op", 0, SPECS, str(local), storage_options=options, **kw)


def put(p, version, value, run=None):
    h = p.get_store(version, run=run)
    h["values"].put("k", value)
    assert h.commit() == version + 1


def value_at(p, version, run=None):
    h = p.get_store(version, run=run)
    found = h["values"].get("k")
    h.abort()
    return found


def delete_checkpoint(location):
    uri, options = location
    root = open_filesystem(uri, options)
    root.delete_dir("op")
    assert not root.exists("op/_metadata")


def values_of_a_fresh_executor(location, local, versions):
    fresh = provider(location, local)
    try:
        return [value_at(fresh, v) for v in versions]
    finally:
        fresh.close()


@pytest.mark.parametrize("run", [None, "run"], ids=["api", "per-run"])
def test_a_warm_provider_never_serves_the_state_of_a_deleted_checkpoint(
    checkpoint_location, tmp_path, run
):
    """E1 committed versions 1-2; the checkpoint is deleted and E2 writes the new
    one's versions 1-2; E1, still open, is asked for version 2 (by the provider API,
    or by the next run of a query): the new checkpoint's, and its next commit
    continues the new checkpoint, which a fresh executor restores."""
    e1 = provider(checkpoint_location, tmp_path / "e1")
    put(e1, 0, "OLD-1", run)
    put(e1, 1, "OLD-2", run)
    delete_checkpoint(checkpoint_location)
    e2 = provider(checkpoint_location, tmp_path / "e2")
    put(e2, 0, "NEW-1")
    put(e2, 1, "NEW-2")
    e2.close()
    next_run = None if run is None else "next-run"
    assert value_at(e1, 2, next_run) == "NEW-2"
    put(e1, 2, "NEW-3", next_run)
    e1.close()
    got = values_of_a_fresh_executor(checkpoint_location, tmp_path / "fresh", [1, 2, 3])
    assert got == ["NEW-1", "NEW-2", "NEW-3"]


def test_within_a_run_a_warm_load_reads_nothing_and_a_new_run_reads_the_metadata_once(
    tmp_path, monkeypatch
):
    """The steady state costs no request: the identity is confirmed at the first
    load of each run of a query (one read of ``_metadata``), not at every task."""
    location = (f"file://{tmp_path}/remote", None)
    p = provider(location, tmp_path / "local")
    reads: list[str] = []
    original = Storage.read

    def counting(storage, rel, length=None):
        reads.append(rel)
        return original(storage, rel, length)

    monkeypatch.setattr(Storage, "read", counting)
    for v in range(4):
        put(p, v, f"v{v}", run="run-1")
    assert reads == []  # built just now: its identity was read by its constructor
    for v in range(4, 8):
        put(p, v, f"v{v}", run="run-2")
    assert reads == ["_metadata"]
    assert value_at(p, 8) == "v7" and reads == ["_metadata"] * 2  # no run: every load
    p.close()


def test_a_pending_snapshot_of_a_deleted_checkpoint_is_never_uploaded_over_the_new_one(
    checkpoint_location, tmp_path
):
    """E1 has the snapshot of version 2 pending when the checkpoint is reset; E2
    writes the new one's versions 1-2 and uploads its own snapshot 2; E1's queued
    maintenance runs: it drops its snapshot (foreign), and a fresh executor loads
    the new checkpoint's version 2."""
    e1 = provider(checkpoint_location, tmp_path / "e1", snapshot_interval=2)
    put(e1, 0, "OLD-1")
    put(e1, 1, "OLD-2")  # snapshot 2 pending, its upload queued
    delete_checkpoint(checkpoint_location)
    e2 = provider(checkpoint_location, tmp_path / "e2", snapshot_interval=2)
    put(e2, 0, "NEW-1")
    put(e2, 1, "NEW-2")
    assert e2.do_maintenance()["snapshots"] == [2]
    e2.close()
    report = e1.do_maintenance()
    assert report["snapshots"] == [] and report["foreign"] == [2], report
    e1.close()
    got = values_of_a_fresh_executor(checkpoint_location, tmp_path / "fresh", [2])
    assert got == ["NEW-2"]


def test_a_checkpoint_reset_during_a_snapshot_upload_stops_it_before_its_manifest(
    checkpoint_location, tmp_path
):
    """The check is made right before the upload is published: E1's maintenance
    has read the checkpoint and started uploading its snapshot's files when the
    checkpoint is deleted and E2 writes the new one's versions 1-2 and snapshot 2.
    E1 writes no manifest, and a fresh executor loads the new version 2."""
    e1 = provider(checkpoint_location, tmp_path / "e1", snapshot_interval=2)
    put(e1, 0, "OLD-1")
    put(e1, 1, "OLD-2")

    def reset():
        delete_checkpoint(checkpoint_location)
        e2 = provider(checkpoint_location, tmp_path / "e2", snapshot_interval=2)
        put(e2, 0, "NEW-1")
        put(e2, 1, "NEW-2")
        e2.do_maintenance()
        e2.close()

    with pause_before_write("files/", reset) as paused:
        report = e1.do_maintenance()
    assert paused and report["snapshots"] == [] and report["foreign"] == [2], report
    e1.close()
    got = values_of_a_fresh_executor(checkpoint_location, tmp_path / "fresh", [2])
    assert got == ["NEW-2"]


def test_a_partition_that_believed_a_losing_id_at_the_birth_still_uploads_its_snapshots(tmp_path):
    """Partitions creating a checkpoint together each write an id, the last write
    wins: one that kept a lost id through a run still uploads its snapshots (they
    hold the checkpoint's commits), and a fresh executor restores from them."""
    location, metadata = (
        (f"file://{tmp_path}/remote", None),
        tmp_path / "remote" / "op" / "_metadata",
    )
    p = provider(location, tmp_path / "local", snapshot_interval=2)  # writes an id ...
    won = {**msgpack.unpackb(metadata.read_bytes()), "checkpoint_id": "f" * 32}
    metadata.write_bytes(msgpack.packb(won))  # ... another partition's wins
    put(p, 0, "one", run="run")
    put(p, 1, "two", run="run")
    report = p.do_maintenance()
    assert report["snapshots"] == [2] and report["foreign"] == [], report
    p.close()
    restores = []
    fresh = provider(location, tmp_path / "fresh", progress=lambda *a: restores.append(a[0]))
    assert value_at(fresh, 2) == "two" and "download snapshot" in restores
    fresh.close()


def test_a_manifest_landing_after_a_reset_is_never_restored(tmp_path):
    """E1's snapshot upload passed its pre-publish check, then its retried manifest
    PUT landed only after the checkpoint was deleted and E2 wrote the new one's
    versions 1-2 (its content files too, as a late upload would): a fresh executor
    restoring version 2 does not take that manifest (its commit is not the one the
    checkpoint's changelog of version 2 names) and loads the new version 2."""
    import shutil

    location = (f"file://{tmp_path}/remote", None)
    partition = tmp_path / "remote" / "op" / "0"
    e1 = provider(location, tmp_path / "e1", snapshot_interval=2)
    put(e1, 0, "OLD-1")
    put(e1, 1, "OLD-2")
    assert e1.do_maintenance()["snapshots"] == [2]
    e1.close()
    late = tmp_path / "late"
    for folder in ("snapshot", "files"):
        shutil.copytree(partition / folder, late / folder)
    delete_checkpoint(location)
    e2 = provider(location, tmp_path / "e2", snapshot_interval=100)
    put(e2, 0, "NEW-1")
    put(e2, 1, "NEW-2")
    e2.close()
    for folder in ("snapshot", "files"):  # the late upload lands
        shutil.copytree(late / folder, partition / folder, dirs_exist_ok=True)
    got = values_of_a_fresh_executor(location, tmp_path / "fresh", [2])
    assert got == ["NEW-2"]
