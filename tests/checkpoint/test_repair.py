"""A damaged snapshot is repaired from older data when that data is retained, and
the repair is visible (invariant 3 of DESIGN.md section 8): logged, counted in
the state metrics (``repaired``), shown by ``sessionstore verify`` and ``stats``."""

from __future__ import annotations

import json

import pytest

from sessionstore.checkpoint.offline.verify import verify_checkpoint
from sessionstore.checkpoint.records.layout import content_name, manifest_name
from sessionstore.checkpoint.records.snapshot import read_manifest, referenced
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from tests.checkpoint.test_gc import commit as commit_writes
from tests.checkpoint.test_gc import contents, provider
from tests.checkpoint.test_metrics import header
from tests.tools.test_cli import run


def commit(p, version):
    """Commit ``version + 1`` putting k<version> = version."""
    commit_writes(p, version, {f"k{version}": version})


def model(version):
    return {f"k{v}": v for v in range(version)}


def test_a_missing_file_and_a_corrupt_manifest_are_repaired_from_older_data(tmp_path):
    """Snapshots 3, 6 and 9 of versions 1-10. One content file of the newest
    snapshot is deleted and another snapshot's manifest corrupted: version 10
    restores from snapshot 3 and changelogs 4-10; the repair is logged, counted in
    the next commit's metrics, reported by verify and shown by stats."""
    uri = f"file://{tmp_path}/remote"
    p = provider(uri, tmp_path / "live", snapshot_interval=3)
    for v in range(10):
        commit(p, v)
        p.do_maintenance()
    p.close()
    remote = open_filesystem(uri).child("op/0")
    remote.delete(content_name(sorted(referenced(read_manifest(remote, 9)))[0]))
    remote.write_atomic(manifest_name(6), b"\x93not a manifest")

    fresh = provider(uri, tmp_path / "fresh")
    assert contents(fresh, 10) == model(10)
    assert len(fresh.repairs) == 1
    assert "version 10 restored from snapshot 3" in fresh.repairs[0]
    assert "snapshot 9: " in fresh.repairs[0] and "snapshot 6: " in fresh.repairs[0]
    commit(fresh, 10)
    commit(fresh, 11)
    assert [header(fresh, v)["metrics"]["repaired"] for v in (11, 12)] == [1, 0]
    fresh.close()

    result = verify_checkpoint(uri)
    assert len(result.problems) == 2  # snapshots 6 and 9, each named
    assert [r.split(": ", 1)[0] for r in result.repairs] == ["op/0"]
    assert "version 12 loads only by a repair" in result.repairs[0]
    out = run("verify", uri)
    assert out.returncode == 1, out.stderr
    assert "REPAIRED op/0: version 12 loads only by a repair" in out.stdout
    assert "2 problems, 1 versions load only by a repair" in out.stdout
    stats = run("stats", uri, "--format", "json")
    rows = [json.loads(line) for line in stats.stdout.splitlines()]
    assert [(r["batch"], r["repaired"]) for r in rows if r["batch"] >= 9] == [
        (9, 0),
        (10, 1),
        (11, 0),
    ]


def test_pruning_keeps_the_data_back_to_the_newest_whole_snapshot(tmp_path):
    """A content file of snapshot 9 is lost. Maintenance would take 9 as the base
    and delete what is older; it checks the base's files against its listing of
    ``files/`` (no extra request) and keeps snapshot 6 and its changelogs, so a
    restore of a later version still repairs around snapshot 9."""
    uri = f"file://{tmp_path}/remote"
    p = provider(uri, tmp_path / "live", snapshot_interval=3, retain_versions=3)
    for v in range(9):
        commit(p, v)
        p.do_maintenance()
    remote = open_filesystem(uri).child("op/0")
    remote.delete(content_name(sorted(referenced(read_manifest(remote, 9)))[0]))
    for v in range(9, 12):
        commit(p, v)
        p.do_maintenance()  # latest 12, keep 10-12: the base would be snapshot 9
    p.close()
    assert remote.list("snapshot") == ["12.manifest", "6.manifest", "9.manifest"]
    fresh = provider(uri, tmp_path / "fresh")
    assert contents(fresh, 11) == model(11)
    assert "version 11 restored from snapshot 6" in fresh.repairs[0]
    fresh.close()


#: Manifests that are valid msgpack but not a snapshot's list of files.
MALFORMED = {
    "files [1]": {"files": [1]},
    "no files": {},
    "files as text": {"files": "000009.sst"},
    "pack files not a list": {"files": [], "pack": {"sha256": "0" * 64, "size": 3, "files": 5}},
    "a size as text": {"files": [{"name": "000009.sst", "sha256": "0" * 64, "size": "12"}]},
}


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_a_malformed_manifest_is_repaired_around_and_maintenance_keeps_working(tmp_path, shape):
    """The newest snapshot's manifest (9) is rewritten as valid msgpack of another
    shape. Maintenance goes on (it never takes 9 as the base, so snapshot 6 and its
    changelogs stay), a fresh restore repairs around 9 from 6, and verify names it."""
    import msgpack

    uri = f"file://{tmp_path}/remote"
    p = provider(uri, tmp_path / "live", snapshot_interval=3, retain_versions=3)
    for v in range(9):
        commit(p, v)
        p.do_maintenance()
    remote = open_filesystem(uri).child("op/0")
    real = read_manifest(remote, 9)
    malformed = {"format": real["format"], "version": 9, "commit": real["commit"], "pack": None}
    remote.write_atomic(manifest_name(9), msgpack.packb({**malformed, **MALFORMED[shape]}))
    for v in range(9, 12):
        commit(p, v)
        p.do_maintenance()  # latest 12, keep 10-12: the base would be snapshot 9
    p.close()
    assert remote.list("snapshot") == ["12.manifest", "6.manifest", "9.manifest"]
    fresh = provider(uri, tmp_path / "fresh")
    assert contents(fresh, 11) == model(11)
    assert "version 11 restored from snapshot 6" in fresh.repairs[0]
    assert "snapshot 9: " in fresh.repairs[0]
    commit(fresh, 11)
    fresh.do_maintenance()
    fresh.close()
    problems = verify_checkpoint(uri).problems
    assert len(problems) == 1 and "9.manifest (version 9) is unusable" in problems[0], problems


@pytest.mark.parametrize("damage", ["truncated", "altered"])
def test_a_truncated_or_altered_base_is_never_chosen(s3_bucket, tmp_path, damage):
    """On the S3 endpoint, the pack of snapshot 9 is replaced by a truncated copy
    (the wrong size) or one with a byte changed (the right size, the wrong hash),
    and the partition moves to another executor. Its maintenance would take 9 as
    the base: it checks each file's size against the listing and its hash (a read,
    once), so it keeps snapshot 6 and the changelogs after it; a restore repairs
    around 9."""
    uri, options = s3_bucket
    p = provider(uri, tmp_path / "live", snapshot_interval=3, retain_versions=3,
                 storage_options=options)  # fmt: skip
    for v in range(9):
        commit(p, v)
        p.do_maintenance()
    p.close()
    remote = open_filesystem(uri, options).child("op/0")
    pack = content_name(read_manifest(remote, 9)["pack"]["sha256"])
    data = remote.read(pack)
    damaged = data[:-7] if damage == "truncated" else data[:-1] + bytes([data[-1] ^ 1])
    remote.write_atomic(pack, damaged)
    moved = provider(uri, tmp_path / "moved", snapshot_interval=3, retain_versions=3,
                     storage_options=options)  # fmt: skip
    for v in range(9, 12):
        commit(moved, v)
        moved.do_maintenance()  # latest 12, keep 10-12: the base would be snapshot 9
    moved.close()
    assert remote.list("snapshot") == ["12.manifest", "6.manifest", "9.manifest"]
    fresh = provider(uri, tmp_path / "fresh", storage_options=options)
    assert contents(fresh, 11) == model(11)
    assert "version 11 restored from snapshot 6" in fresh.repairs[0]
    fresh.close()
