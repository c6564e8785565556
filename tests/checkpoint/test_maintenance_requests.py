"""Object-store requests of a partition's long life on S3, pruning included
(issue #16: at most 4 requests per task per micro-batch, snapshots included),
counted at a real S3 endpoint (moto), and the state a restore brings back."""

from __future__ import annotations

import random

import msgpack
import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.offline.verify import verify_checkpoint
from sessionstore.checkpoint.records.layout import PartitionFiles, content_name, manifest_name
from sessionstore.checkpoint.records.snapshot import CorruptSnapshotError, read_manifest, referenced
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from tests.object_stores import (
    moto_s3_server,
    new_bucket,
    reset_s3_request_counts,
    s3_request_counts,
)

SPECS = [StoreSpec("counts", "kv", 0), StoreSpec("sessions", "session", 10**9)]
VERSIONS = 150
SNAPSHOT_INTERVAL = 10
RETAIN = 20
#: The goal of issue #16, per task and micro-batch on average.
BUDGET = 4.0


def everything(handle):
    """The whole state a handle sees: every count, and the sessions of each key."""
    counts = dict(handle["counts"].items())
    sessions = {
        k: [(w.start, w.end, v) for w, v in handle["sessions"].fetch(k)] for k in sorted(counts)
    }
    return counts, sessions


def lone_attempt(version, commit, parent, supersede):
    """What the driver's coordinator answers an attempt no other one raced: its
    claim wins (no object-store request)."""
    return commit


#: Requests over the run, by kind, with the coordinator as the arbiter between
#: attempts and without one (then S3's conditional create is the fence: the same
#: PUT, no look before it). Exact: a change to the protocol's requests shows here.
#: Each of the 15 snapshot uploads reads its version's changelog header (a HEAD and
#: a ranged GET) right before its manifest (invariant 9); the loads of one run read
#: nothing.
EXPECTED = {
    "coordinator": {"GET": 89, "HEAD": 54, "PUT": 205, "POST": 13, "DELETE": 25},
    "none": {"GET": 89, "HEAD": 54, "PUT": 205, "POST": 13, "DELETE": 25},
}


@pytest.mark.parametrize("arbiter", ["coordinator", "none"])
def test_a_long_run_with_pruning_stays_within_four_requests_per_version(tmp_path, arbiter):
    """150 versions of one partition, a snapshot every 10 and maintenance after it
    (as a Spark task runs it), 20 versions retained, so pruning runs 13 times: every
    request the S3 server receives (PUT, GET, HEAD, DELETE, POST, listings) averages
    at most 4 per version. A new executor restoring the latest version from its
    snapshot alone gets exactly the live state."""
    rng = random.Random(16)
    with moto_s3_server(record=True) as options:
        uri = f"s3://{new_bucket(options)}/ck"
        live = StateStoreProvider(
            uri, "op", 0, SPECS, str(tmp_path / "live"), snapshot_interval=SNAPSHOT_INTERVAL,
            retain_versions=RETAIN, storage_options=options,
        )  # fmt: skip
        reset_s3_request_counts(options)
        pruned = 0
        for v in range(VERSIONS):
            h = live.get_store(v, run="run-1")  # one run of a query, as in Spark
            h.arbitrate(lone_attempt if arbiter == "coordinator" else None)
            for _ in range(20):
                key = f"k{rng.randrange(200)}"
                if rng.random() < 0.2:
                    h["counts"].delete(key)
                else:
                    h["counts"].put(key, rng.randrange(1000))
                    start = rng.randrange(10**6)
                    h["sessions"].put(key, start, start + 10, v)
            version = h.commit()
            if version % SNAPSHOT_INTERVAL == 0:
                report = live.do_maintenance()
                pruned += bool(report["deleted"])
        counts = s3_request_counts(options)
        per_version = sum(counts.values()) / VERSIONS
        print(f"requests per version: {per_version:.2f} {counts}")
        assert pruned >= 12, pruned  # pruning ran many times, not once at the end
        assert per_version <= BUDGET, counts
        assert {k: v for k, v in counts.items() if k != "LIST"} == EXPECTED[arbiter], counts

        files = PartitionFiles(live._remote)
        assert max(files.snapshots()) == VERSIONS
        assert files.loadable()[-RETAIN:] == list(range(VERSIONS - RETAIN + 1, VERSIONS + 1))
        h = live.get_store(VERSIONS)
        want = everything(h)
        h.abort()
        live.close()

        restores = []
        fresh = StateStoreProvider(
            uri, "op", 0, SPECS, str(tmp_path / "fresh"), storage_options=options,
            progress=lambda label, done, total: restores.append(label),
        )  # fmt: skip
        h = fresh.get_store(VERSIONS)
        assert everything(h) == want
        assert "download snapshot" in restores and fresh.last_metrics is None
        h.abort()
        fresh.close()
    assert len(want[0]) > 50


@pytest.mark.parametrize("value", [1, 2])
def test_fewer_than_three_retained_versions_are_refused(tmp_path, value):
    """An event-time operator reads the changelog of the version before the latest:
    a provider keeps at least 3 versions."""
    with pytest.raises(ValueError, match=f"retain_versions must be at least 3, got {value}"):
        StateStoreProvider(
            f"file://{tmp_path}/r", "op", 0, SPECS, str(tmp_path / "l"), retain_versions=value
        )


def without_pack(remote, version, fmt=2):
    """Rewrite the manifest of ``version`` with every file by content and no pack,
    in format ``fmt`` (another writer's manifest when 2; 1 is a format no release
    wrote)."""
    manifest = read_manifest(remote, version)
    blob = remote.read(content_name(manifest["pack"]["sha256"]))
    files = list(manifest["files"])
    for entry in manifest["pack"]["files"]:
        data = blob[entry["offset"] : entry["offset"] + entry["size"]]
        remote.write_atomic(content_name(entry["sha256"]), data)
        files.append({"name": entry["name"], "sha256": entry["sha256"], "size": entry["size"]})
    remote.delete(content_name(manifest["pack"]["sha256"]))
    rewritten = {"format": fmt, "version": version, "files": files, "pack": None}
    remote.write_atomic(manifest_name(version), msgpack.packb(rewritten))


def test_a_manifest_of_an_unknown_format_is_refused_naming_it_and_the_format(tmp_path):
    """Only the manifest format this release writes is read: the reader and
    ``verify`` name the manifest and the format, and the versions stay loadable
    from the changelogs."""
    uri = f"file://{tmp_path}/r"
    old = StateStoreProvider(uri, "op", 0, SPECS, str(tmp_path / "old"), snapshot_interval=5)
    for v in range(7):
        h = old.get_store(v)
        h["counts"].put(f"k{v}", v)
        h.commit()
    old.do_maintenance()
    old.close()
    remote = open_filesystem(uri).child("op/0")
    without_pack(remote, 5, fmt=1)
    where = f"file://{tmp_path}/r/op/0/snapshot/5.manifest"
    refusal = "unknown manifest format 1; this sessionstore reads format 2 only"
    with pytest.raises(CorruptSnapshotError) as err:
        read_manifest(remote, 5)
    assert str(err.value) == f"snapshot {where} (version 5) is unusable: {refusal}"
    assert [p for p in verify_checkpoint(uri).problems if refusal in p and where in p]


def test_a_manifest_rewritten_by_another_writer_keeps_its_files(tmp_path):
    """Another writer of the same version (a speculative task) may replace a
    manifest this provider has read: its sweep keeps the files of the manifest
    that is stored, not of the one it remembers."""
    uri = f"file://{tmp_path}/r"
    p = StateStoreProvider(
        uri, "op", 0, SPECS, str(tmp_path / "l"), snapshot_interval=5, orphan_grace_s=0
    )
    for v in range(7):
        h = p.get_store(v)
        h["counts"].put(f"k{v}", v)
        h.commit()
        if (v + 1) % 5 == 0:
            p.do_maintenance()
    p.do_maintenance()  # manifest 5 read and remembered
    remote = open_filesystem(uri).child("op/0")
    without_pack(remote, 5)  # other files, and no pack
    h = p.get_store(7)
    h["counts"].put("k7", 7)
    h.commit()
    p.do_maintenance()
    p.do_maintenance()  # orphans go at the second sweep that finds them (orphans.py)
    p.close()
    assert verify_checkpoint(uri).problems == []
    assert set(remote.list("files")) == referenced(read_manifest(remote, 5))


def test_a_backend_with_fewer_than_three_retained_versions_is_refused_on_the_driver():
    from spark_integration import StateBackend

    with pytest.raises(ValueError, match="retain_versions must be at least 3, got 2"):
        StateBackend("s3://b/ck", retain_versions=2)
