"""Garbage collection never deletes a file that a manifest may still reference
(invariant 2 of DESIGN.md section 8), including a manifest another executor is
about to write: partitions move between executors routinely, and the maintenance
lock is local to one machine."""

from __future__ import annotations

import random
import threading
import time

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.partition.orphans import OrphanSweep
from sessionstore.checkpoint.records import snapshot
from sessionstore.checkpoint.records.layout import PartitionFiles
from sessionstore.checkpoint.records.snapshot import read_manifest, referenced
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from tests.faults import InjectedFailure, pause_before_write, slow_writes

SPECS = [StoreSpec("counts", "kv", 0)]
#: Longer than any upload here (a maintenance took up to 0.53 s on the loaded test
#: machine: the grace must exceed the longest upload, orphans.py).
GRACE_S = 2.0


def provider(uri, local, **kw):
    return StateStoreProvider(uri, "op", 0, SPECS, str(local), **kw)


def commit(p, version, writes):
    h = p.get_store(version)
    for key, value in writes.items():
        if value is None:
            h["counts"].delete(key)
        else:
            h["counts"].put(key, value)
    assert h.commit() == version + 1


def contents(p, version):
    h = p.get_store(version)
    out = dict(h["counts"].items())
    h.abort()
    return out


def fail():
    raise InjectedFailure("the executor died before the manifest write")


def test_a_file_another_executor_is_about_to_reference_is_not_deleted(tmp_path):
    """Issue 27, item 2, in a fixed order. Executor X's first upload of snapshot 10
    dies after its content, before its manifest: the content is stored and nothing
    references it. X tries again: it lists ``files/``, sees that content, and is
    paused before its manifest write while executor C's maintenance sweeps twice.
    Then X writes the manifest. Snapshot 10 restores whole (not by a repair)."""
    uri = f"file://{tmp_path}/remote"
    x = provider(uri, tmp_path / "x", snapshot_interval=10)
    for v in range(10):
        commit(x, v, {f"k{v}": v})
    with pause_before_write("snapshot/", fail), pytest.raises(InjectedFailure):
        x.do_maintenance()
    stored = open_filesystem(uri).child("op/0").list("files")
    assert stored  # content without a manifest

    c = provider(uri, tmp_path / "c", snapshot_interval=10)

    def sweeps_of_another_executor():
        c.do_maintenance()
        c.do_maintenance()

    with pause_before_write("snapshot/", sweeps_of_another_executor) as paused:
        report = x.do_maintenance()
    assert report["snapshots"] == [10]
    # content that no listed manifest uses is uploaded again, never trusted from the
    # listing alone (a sweep past its grace may delete it before the manifest lands)
    assert report["uploaded_bytes"] > 0
    assert paused == ["snapshot/10.manifest"]
    fresh = provider(uri, tmp_path / "fresh")
    assert contents(fresh, 10) == {f"k{v}": v for v in range(10)}
    assert fresh.repairs == []  # from snapshot 10 itself
    for p in (x, c, fresh):
        p.close()


def test_an_orphan_goes_after_two_sweeps_at_least_the_grace_apart():
    sweep = OrphanSweep(grace_s=10)
    stored = {"a": (1, 100), "b": (1, 100), "c": (1, 100)}
    assert sweep.due(stored, {"a"}, now=0) == []
    assert sweep.marked == {"b", "c"}
    assert sweep.due(stored, {"a"}, now=9.9) == []  # not yet the grace apart
    renewed = {**stored, "c": (1, 101)}  # uploaded again: another stamp
    assert sweep.due(renewed, {"a"}, now=10) == ["b"]
    assert sweep.marked == {"c"}
    del renewed["b"]  # deleted
    assert sweep.due(renewed, {"a", "c"}, now=30) == []  # referenced again: unmarked
    assert sweep.marked == set()
    with pytest.raises(ValueError, match="orphan_grace_s must be a number of seconds >= 0"):
        OrphanSweep(-1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_ownership_moving_between_executors_keeps_every_retained_version(
    tmp_path, monkeypatch, seed
):
    """A partition moves between two local dirs every 1-4 versions, while the
    previous owner's maintenance (uploads, prune, orphan sweep) runs in the
    background, as a state server's does after its task. Every small file is its
    own content file, so snapshots share content, and a manifest write takes
    0.2 s (a slow store), so sweeps fall between another maintenance's listing and
    its manifest write. Afterwards every retained version restores on a fresh dir
    exactly as the model says, none by a repair. (Without the sweep's grace about
    one seed in four loses a file of a retained snapshot.)"""
    monkeypatch.setattr(snapshot, "PACK_THRESHOLD", 0)
    with slow_writes("snapshot/", 0.2):
        hand_off(tmp_path, seed)


def hand_off(tmp_path, seed):
    rng = random.Random(seed)
    uri = f"file://{tmp_path}/remote"
    owners = [
        provider(uri, tmp_path / name, snapshot_interval=2, retain_versions=4, orphan_grace_s=GRACE_S)
        for name in ("a", "b")
    ]  # fmt: skip
    model = {0: {}}
    owner, left, background = 0, rng.randint(1, 4), [None, None]
    for v in range(40):
        state = dict(model[v])
        writes = {}
        for _ in range(rng.randint(1, 6)):
            key = f"k{rng.randrange(12)}"
            writes[key] = None if rng.random() < 0.2 else rng.randrange(1000)
        for key, value in writes.items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        commit(owners[owner], v, writes)
        model[v + 1] = state
        left -= 1
        if left == 0:
            job = threading.Thread(target=owners[owner].do_maintenance)
            job.start()
            background[owner] = job
            owner, left = 1 - owner, rng.randint(1, 4)
            if background[owner] is not None:  # its own last maintenance, not the other's
                background[owner].join()
        elif (v + 1) % 2 == 0:
            owners[owner].do_maintenance()
    for job in background:
        if job is not None:
            job.join()
    # The last pruning: a background upload may land after the other owner's last
    # listing, so a final maintenance can still prune and mark what it leaves
    for p in owners:
        p.do_maintenance()
    time.sleep(GRACE_S)
    for p in owners:
        p.do_maintenance()  # every orphan seen twice, the grace apart: gone
    for p in owners:
        p.do_maintenance()  # nothing left to prune or sweep
        p.close()
    remote = open_filesystem(uri).child("op/0")
    manifests = PartitionFiles(remote).snapshots()
    assert set(remote.list("files")) == set().union(
        *(referenced(read_manifest(remote, v)) for v in manifests)
    )
    retained = provider(uri, tmp_path / "list").list_versions()
    assert retained[-1] == 40 and len(retained) >= 4
    for version in retained:
        fresh = provider(uri, tmp_path / f"fresh{version}")
        assert contents(fresh, version) == model[version], version
        assert fresh.repairs == []
        fresh.close()


def test_a_maintenance_while_a_snapshot_is_taken_leaves_it_for_the_next(tmp_path, monkeypatch):
    """A background maintenance can run while the task's commit takes a snapshot.
    Between the RocksDB checkpoint and its lineage record it must not see the
    snapshot (it would drop it as another checkpoint's); the next one uploads it."""
    from sessionstore.checkpoint.partition import commit as committing

    p = provider(f"file://{tmp_path}/remote", tmp_path / "local", snapshot_interval=2)
    real, during = committing.write_snapshot_record, []

    def racing(path, record):
        during.append(p.do_maintenance())  # the background thread's turn
        real(path, record)

    monkeypatch.setattr(committing, "write_snapshot_record", racing)
    commit(p, 0, {"a": 1})
    commit(p, 1, {"b": 2})
    assert [(r["snapshots"], r["foreign"]) for r in during] == [([], [])]
    report = p.do_maintenance()
    assert (report["snapshots"], report["foreign"]) == ([2], [])
    assert PartitionFiles(
        open_filesystem(f"file://{tmp_path}/remote").child("op/0")
    ).snapshots() == {2}
    p.close()
