"""Lineage and identity (invariant 1 of DESIGN.md section 8): a load returns a
committed state of this checkpoint, of the attempt whose output Spark used; never
a deleted checkpoint's, never a losing attempt's, never a mix. On a local folder
and on a real S3 endpoint (moto server)."""

from __future__ import annotations

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.partition import lineage
from sessionstore.checkpoint.partition.lineage import COMMIT_FIELD, PARENT_FIELD
from sessionstore.checkpoint.records.changelog import decode_changelog, encode_changelog
from sessionstore.checkpoint.records.layout import COMMIT_KEY, PartitionFiles, changelog_name
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.engine.db import META_CF
from spark_integration.coordinator.client import commit_arbiter
from spark_integration.coordinator.server import Coordinator

SPECS = [StoreSpec("sessions", "session", 10**9)]


@pytest.fixture(params=["file", "s3"])
def location(request, tmp_path):
    if request.param == "file":
        return f"file://{tmp_path}/remote", None
    return request.getfixturevalue("s3_bucket")


def provider(location, local, **kw):
    uri, options = location
    return StateStoreProvider(uri, "op", 0, SPECS, str(local), storage_options=options, **kw)


def commit(p, version, tag, arbiter=None):
    """Commit ``version + 1`` adding session ("k", version) = ``tag``, as a task of
    one run of a query (its load does not confirm the checkpoint's identity)."""
    h = p.get_store(version, run="run")
    h.arbitrate(arbiter)
    h["sessions"].put("k", version, version, tag)
    assert h.commit() == version + 1


def tags(p, version):
    h = p.get_store(version)
    out = [v for _, v in h["sessions"].fetch("k")]
    h.abort()
    return out


def delete_checkpoint(location):
    uri, options = location
    open_filesystem(uri, options).delete_dir("op")


def test_a_recreated_checkpoint_never_loads_the_deleted_ones_state(location, tmp_path):
    """Issue 27, item 1: versions 1-10 with a snapshot of 10 left pending (the
    provider ends before its maintenance, as a state server's executor does); the
    checkpoint is deleted; a new one at the same URI and local dir commits 1-7,
    maintains, and commits 8-12. Versions 10-12 restore the new state."""
    shared = tmp_path / "shared"
    old = provider(location, shared, snapshot_interval=10)
    for v in range(10):
        commit(old, v, f"old{v}")
    old.close()
    delete_checkpoint(location)
    new = provider(location, shared, snapshot_interval=10)
    for v in range(7):
        commit(new, v, f"new{v}")
    report = new.do_maintenance()
    assert report["snapshots"] == [] and report["foreign"] == [10]
    for v in range(7, 12):
        commit(new, v, f"new{v}")
    new.close()
    for version in (10, 11, 12):
        fresh = provider(location, tmp_path / f"fresh{version}")
        assert tags(fresh, version) == [f"new{v}" for v in range(version)]
        fresh.close()


def test_a_snapshot_left_pending_by_another_checkpoint_is_never_uploaded(tmp_path):
    """Two checkpoints share a local_dir and an operator name: each one's
    maintenance uploads only its own pending snapshots."""
    a, b = (f"file://{tmp_path}/a", None), (f"file://{tmp_path}/b", None)
    shared = tmp_path / "shared"
    pa = provider(a, shared, snapshot_interval=2)
    for v in range(2):
        commit(pa, v, f"a{v}")
    pa.close()
    pb = provider(b, shared, snapshot_interval=2)
    assert pb.do_maintenance()["foreign"] == [2]
    pb.close()
    assert PartitionFiles(open_filesystem(b[0]).child("op/0")).snapshots() == set()


@pytest.fixture
def coordinator():
    server = Coordinator()
    yield server
    server.stop()


def arbiters(kind, coordinator, uri, options):
    """Each attempt's arbiter: the driver's coordinator, or none (unreachable)."""
    if kind == "none":
        return None, None
    address = coordinator.register(uri, "op", 1, options)
    calls: list[int] = []

    def counted(arbiter):
        def claim(*args):
            calls.append(args[0])
            return arbiter(*args)

        claim.calls = calls
        return claim

    return counted(commit_arbiter(address, "run", 0)), counted(commit_arbiter(address, "run", 0))


@pytest.mark.parametrize("arbiter", ["coordinator", "none"])
def test_the_attempt_that_commits_last_loses(location, tmp_path, coordinator, arbiter):
    """Two attempts of one batch with different outputs (a speculative copy, a
    zombie): the first to commit wins. The loser, committing last, neither
    replaces it nor keeps its own state: the next batch loads the winner's
    state wherever it runs, the loser's executor included, and continues it."""
    uri, options = location
    first, second = provider(location, tmp_path / "a"), provider(location, tmp_path / "b")
    commit(first, 0, "base")
    arbiter_a, arbiter_b = arbiters(arbiter, coordinator, uri, options)
    winner, loser = first.get_store(1), second.get_store(1)
    winner.arbitrate(arbiter_a)
    loser.arbitrate(arbiter_b)
    winner["sessions"].put("k", 1, 1, "winner")
    loser["sessions"].put("k", 1, 1, "loser")
    assert winner.commit() == 2
    assert loser.commit() == 2  # adopts the winner's commit: no error, no retry loop
    if arbiter == "coordinator":
        # an object store asks the arbiter; a local folder decides by an exclusive link
        assert arbiter_a.calls == ([2, 2] if uri.startswith("s3://") else [])
    for p in (second, first):
        assert tags(p, 2) == ["base", "winner"]
    commit(second, 2, "next")  # the next batch on the loser's executor
    fresh = provider(location, tmp_path / "fresh")
    assert tags(fresh, 3) == ["base", "winner", "next"]
    header, _ = decode_changelog(
        open_filesystem(uri, options).child("op/0").read(changelog_name(2)), "2", 2
    )
    assert header[COMMIT_FIELD] and header[PARENT_FIELD]
    for p in (first, second, fresh):
        p.close()


def test_a_winner_that_never_uploads_is_superseded(s3_bucket, tmp_path, coordinator, monkeypatch):
    """An attempt that claimed the version at the coordinator and died before its
    upload: Spark's retry waits for it a while, then supersedes it and commits."""
    uri, options = s3_bucket
    monkeypatch.setattr(lineage, "CLAIM_WAIT_S", 0.3)
    p = provider(s3_bucket, tmp_path / "a")
    commit(p, 0, "base")
    address = coordinator.register(uri, "op", 1, options)
    parent = decode_changelog(
        open_filesystem(uri, options).child("op/0").read(changelog_name(1)), "1", 1
    )[0][COMMIT_FIELD]
    assert coordinator.operator(address).claim(0, 2, "dead" * 8, parent, None) == "dead" * 8
    commit(p, 1, "retry", commit_arbiter(address, "run", 0))
    fresh = provider(s3_bucket, tmp_path / "fresh")
    assert tags(fresh, 2) == ["base", "retry"]
    for q in (p, fresh):
        q.close()


def test_a_changelog_of_another_lineage_is_never_replayed_onto_a_local_copy(tmp_path):
    """Two attempts whose uploads overlapped on an object store without the
    coordinator both believe they won version 2, and the object of the later one
    stays. The other's executor, behind, never replays version 3 onto its own
    state: it restores the stored lineage."""
    location = (f"file://{tmp_path}/remote", None)
    a, b = provider(location, tmp_path / "a"), provider(location, tmp_path / "b")
    commit(a, 0, "base")
    assert tags(b, 1) == ["base"]  # b is warm at 1
    remote = open_filesystem(location[0]).child("op/0")
    commit(b, 1, "b")
    b_changelog = remote.read(changelog_name(2))
    remote.delete(changelog_name(2))
    commit(a, 1, "a")
    remote.write_atomic(changelog_name(2), b_changelog)  # b's upload landed last
    commit(b, 2, "b-next")  # continues b's lineage: changelog 3's parent is b's 2
    assert tags(a, 3) == ["base", "b", "b-next"]  # a's own 2 is never mixed in
    for p in (a, b):
        p.close()


def as_written_before_lineage(remote):
    """Rewrite every changelog of a partition as releases before lineage wrote it:
    no commit or parent in the header, no commit id among the meta writes."""
    for v, name in PartitionFiles(remote).changelog_files().items():
        header, buf = decode_changelog(remote.read(name), name, v)
        buf.families[META_CF].pop(COMMIT_KEY, None)
        fields = {k: header[k] for k in header if k not in (COMMIT_FIELD, PARENT_FIELD)}
        for k in ("operator", "partition", "version", "stats", "metrics"):
            fields.pop(k, None)
        data = encode_changelog(
            buf, header["operator"], header["partition"], v, header.get("stats"), None, fields
        )
        remote.write_atomic(name, data)


def test_a_checkpoint_written_before_lineage_loads_and_continues(location, tmp_path):
    uri, options = location
    p = provider(location, tmp_path / "old", snapshot_interval=100)
    for v in range(3):
        commit(p, v, f"v{v}")
    p.close()
    remote = open_filesystem(uri, options).child("op/0")
    as_written_before_lineage(remote)
    a, b = provider(location, tmp_path / "a"), provider(location, tmp_path / "b")
    assert tags(a, 3) == ["v0", "v1", "v2"]
    commit(a, 3, "a")  # its parent is unknown (None)
    commit(b, 3, "b")  # another attempt on the same unknown parent: adopts a's
    commit(b, 4, "next")
    fresh = provider(location, tmp_path / "fresh")
    assert tags(fresh, 5) == ["v0", "v1", "v2", "a", "next"]
    for q in (a, b, fresh):
        q.close()


def test_a_damaged_changelog_at_the_name_is_replaced(location, tmp_path):
    """Not another attempt's commit: the commit replaces it (it never adopts it, nor
    waits on it forever)."""
    uri, options = location
    p = provider(location, tmp_path / "a")
    commit(p, 0, "base")
    open_filesystem(uri, options).child("op/0").write_atomic(changelog_name(2), b"SSCL torn")
    commit(p, 1, "mine")
    fresh = provider(location, tmp_path / "fresh")
    assert tags(fresh, 2) == ["base", "mine"]
    for q in (p, fresh):
        q.close()
