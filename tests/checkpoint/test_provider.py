"""StateStoreProvider against a local folder and real S3 and GCS endpoints (moto server,
fake-gcs-server), from the same tests (the ``checkpoint_location`` fixture)."""

from __future__ import annotations

import os

import msgpack
import pytest

from sessionstore import (
    CheckpointMismatchError,
    CorruptChangelogError,
    StateStoreProvider,
    StoreSpec,
    VersionNotFoundError,
)
from sessionstore.checkpoint.records.layout import changelog_name, manifest_name
from sessionstore.checkpoint.records.snapshot import CorruptSnapshotError, read_manifest, referenced
from sessionstore.checkpoint.storage.filesystem import UnknownSchemeError, open_filesystem

SPECS = [
    StoreSpec("sessions", "session", 10**9),
    StoreSpec("plans", "versioned", 10**9),
]


def provider(location, local, partition=0, **kw):
    uri, options = location
    return StateStoreProvider(uri, "op", partition, SPECS, local, storage_options=options, **kw)


def write_versions(p, n, start=0):
    """Version v puts session ("k", v, v) and plan version v."""
    for v in range(start, start + n):
        h = p.get_store(v)
        h["sessions"].put("k", v, v, v)
        h["plans"].put("k", f"plan{v}", v)
        assert h.commit() == v + 1


def state(p, version):
    h = p.get_store(version)
    out = (
        [(w.start, v) for w, v in h["sessions"].fetch("k")],
        h["plans"].get("k"),
        h["plans"].get_versions("k"),
    )
    h.abort()
    return out


def expected(version):
    if version == 0:
        return [], None, []
    plans = [(f"plan{v}", v) for v in range(version)]
    return (
        [(v, v) for v in range(version)],
        (plans[-1][0], plans[-1][1], None),
        [(name, ts, ts + 1 if ts < version - 1 else None) for name, ts in reversed(plans)],
    )


def test_commit_load_and_restore_on_a_new_executor(checkpoint_location, tmp_path):
    p = provider(checkpoint_location, tmp_path / "exec1", snapshot_interval=3)
    write_versions(p, 7)
    assert p.do_maintenance()["snapshots"] == [3, 6]
    assert p.latest_version() == 7
    assert p.list_versions() == [1, 2, 3, 4, 5, 6, 7]
    p.close()
    fresh = provider(checkpoint_location, tmp_path / "exec2")  # snapshot 6 + changelog 7
    for version in (7, 4, 0, 5):
        assert state(fresh, version) == expected(version)
    fresh.close()


def test_a_local_copy_at_the_version_loads_without_listing_the_checkpoint(tmp_path):
    """What another worker process of this machine committed last is committed state
    (it was uploaded before it was applied): a new provider opens it without listing
    the remote directory. A local copy behind the version still replays the tail."""
    location = (f"file://{tmp_path}/remote", None)
    p = provider(location, tmp_path / "local")
    write_versions(p, 3)
    p.close()
    fresh = provider(location, tmp_path / "local")

    def no_listing():
        raise AssertionError("the remote directory was listed")

    fresh._files.changelogs = fresh._files.snapshots = no_listing
    assert state(fresh, 3) == expected(3)
    fresh.close()
    writer = provider(location, tmp_path / "writer")  # moves the checkpoint to 5
    write_versions(writer, 2, start=3)
    writer.close()
    behind = provider(location, tmp_path / "local")
    assert state(behind, 5) == expected(5)
    behind.close()


def test_abort_drops_changes_and_a_retry_sees_the_previous_version(checkpoint_location, tmp_path):
    p = provider(checkpoint_location, tmp_path / "local")
    write_versions(p, 2)
    h = p.get_store(2)
    h["sessions"].put("k", 100, 100, "lost")
    h.abort()
    h = p.get_store(2)
    assert [w.start for w, _ in h["sessions"].fetch("k")] == [0, 1]
    h["sessions"].put("k", 2, 2, 2)
    assert h.commit() == 3
    # a replayed batch: load version 2 again although the local copy is at 3
    assert [w.start for w, _ in p.get_store(2)["sessions"].fetch("k")] == [0, 1]
    p.close()


def test_missing_version_is_a_clear_error(checkpoint_location, tmp_path):
    p = provider(checkpoint_location, tmp_path / "local")
    write_versions(p, 2)
    with pytest.raises(VersionNotFoundError, match="version 5 .* does not exist \\(latest is 2\\)"):
        p.get_store(5)
    p.close()


def test_corrupt_changelog_is_named_and_nothing_is_partly_restored(checkpoint_location, tmp_path):
    p = provider(checkpoint_location, tmp_path / "exec1")
    write_versions(p, 3)
    p.close()
    remote = open_filesystem(checkpoint_location[0], checkpoint_location[1]).child("op/0")
    data = remote.read(changelog_name(2))
    remote.write_atomic(changelog_name(2), data[:-5])
    fresh = provider(checkpoint_location, tmp_path / "exec2")
    with pytest.raises(CorruptChangelogError, match="2.changelog \\(version 2\\) is corrupt"):
        fresh.get_store(3)
    assert not os.path.exists(tmp_path / "exec2" / "op" / "0" / "db")
    assert state(fresh, 1)[0] == [(0, 0)]  # earlier versions still load
    fresh.close()


def test_store_spec_and_partition_count_changes_are_refused(checkpoint_location, tmp_path):
    uri, options = checkpoint_location
    StateStoreProvider(
        uri, "op", 0, SPECS, tmp_path / "a", storage_options=options, num_partitions=4
    )
    with pytest.raises(CheckpointMismatchError, match="written with 4 partitions"):
        StateStoreProvider(
            uri, "op", 0, SPECS, tmp_path / "b", storage_options=options, num_partitions=8
        )
    changed = [StoreSpec("sessions", "session", 5), SPECS[1]]
    with pytest.raises(CheckpointMismatchError, match="written with stores"):
        StateStoreProvider(uri, "op", 0, changed, tmp_path / "c", storage_options=options)


def test_a_checkpoint_from_before_operator_segment_intervals_keeps_its_own(
    checkpoint_location, tmp_path
):
    """Operators now give their stores an explicit segment interval; a checkpoint
    whose stores were created with the default one restarts with that one, a reader
    that names no interval takes the recorded one, and an explicit interval that
    differs from a recorded one is still refused."""
    uri, options = checkpoint_location
    old = [StoreSpec("sessions", "session", 120_001)]  # default interval: 60 s
    p = StateStoreProvider(uri, "op", 0, old, tmp_path / "a", storage_options=options)
    h = p.get_store(0)
    h["sessions"].put("k", 0, 10, "v")
    h.commit()
    p.close()
    new = [StoreSpec("sessions", "session", 120_001, 3_600_000)]
    # another executor: restored from the checkpoint, not from a local copy
    q = StateStoreProvider(uri, "op", 0, new, tmp_path / "b", storage_options=options)
    assert q.store_specs == old
    h = q.get_store(1)
    assert h["sessions"].segment_interval_ms == 60_000
    assert [v for _, v in h["sessions"].fetch("k")] == ["v"]
    h["sessions"].put("k", 20, 30, "w")
    assert h.commit() == 2
    q.close()
    fresh = StateStoreProvider(uri, "op2", 0, new, tmp_path / "c", storage_options=options)
    h = fresh.get_store(0)
    assert h["sessions"].segment_interval_ms == 3_600_000
    h.abort()
    fresh.close()
    # a reader that names no interval takes the recorded one
    reader = StateStoreProvider(uri, "op2", 0, old, tmp_path / "r", storage_options=options)
    assert reader.store_specs == new
    reader.close()
    other = [StoreSpec("sessions", "session", 120_001, 7_200_000)]
    with pytest.raises(CheckpointMismatchError, match="written with stores"):
        StateStoreProvider(uri, "op2", 0, other, tmp_path / "d", storage_options=options)
    with pytest.raises(CheckpointMismatchError, match="written with stores"):
        StateStoreProvider(
            uri, "op", 0, [StoreSpec("sessions", "session", 5, 3_600_000)], tmp_path / "e",
            storage_options=options,
        )  # fmt: skip


def test_maintenance_prunes_old_versions_and_orphaned_files(checkpoint_location, tmp_path):
    p = provider(
        checkpoint_location, tmp_path / "local", snapshot_interval=2, retain_versions=3,
        orphan_grace_s=0,
    )  # fmt: skip
    for _ in range(9):
        write_versions(p, 2, start=p.latest_version())
        p.do_maintenance()
    remote = open_filesystem(checkpoint_location[0], checkpoint_location[1]).child("op/0")
    marked = set(remote.list("files"))
    # an unreferenced file goes at the second sweep that finds it so (orphans.py)
    assert p.do_maintenance() == {
        "snapshots": [], "uploaded_bytes": 0, "foreign": [],
        "deleted": sorted(f"files/{n}" for n in marked - set(remote.list("files"))),
    }  # fmt: skip
    # latest 18, keep 16..18: snapshot 16 is the base; older snapshots go, and the
    # changelogs of whole groups at or below it (0-9; 10-15 wait for 16-19)
    assert p.list_versions() == [16, 17, 18]
    assert remote.list_files("changelog") == [f"1/{v}.changelog" for v in range(10, 19)]
    assert remote.list("snapshot") == ["16.manifest", "18.manifest"]
    used = set().union(*(referenced(read_manifest(remote, v)) for v in (16, 18)))
    assert set(remote.list("files")) == used
    p.close()
    fresh = provider(checkpoint_location, tmp_path / "fresh")
    assert [w.start for w, _ in fresh.get_store(17)["sessions"].fetch("k")] == list(range(17))
    fresh.close()


def test_two_writers_of_the_same_version_agree(checkpoint_location, tmp_path):
    # a speculative task: two attempts, separate local dirs, same input
    a = provider(checkpoint_location, tmp_path / "a")
    write_versions(a, 1)
    b = provider(checkpoint_location, tmp_path / "b")
    remote = open_filesystem(checkpoint_location[0], checkpoint_location[1]).child("op/0")
    for p in (a, b):
        h = p.get_store(1)
        h["sessions"].put("k", 5, 5, "same")
        assert h.commit() == 2
        first = remote.read(changelog_name(2))
    assert remote.read(changelog_name(2)) == first
    fresh = provider(checkpoint_location, tmp_path / "c")
    assert [w.start for w, _ in fresh.get_store(2)["sessions"].fetch("k")] == [0, 5]
    for p in (a, b, fresh):
        p.close()


def test_manifest_file_names_cannot_escape(tmp_path):
    uri = f"file://{tmp_path}/remote"
    p = StateStoreProvider(uri, "op", 0, SPECS, tmp_path / "l", snapshot_interval=1)
    write_versions(p, 1)
    p.do_maintenance()
    p.close()
    remote = open_filesystem(uri).child("op/0")
    remote.delete(changelog_name(1))  # else a restore repairs from version 0
    manifest = msgpack.unpackb(remote.read(manifest_name(1)))
    for bad in ("../evil", "/etc/passwd", "a/b", ".."):
        manifest["pack"]["files"][0]["name"] = bad
        remote.write_atomic(manifest_name(1), msgpack.packb(manifest))
        fresh = StateStoreProvider(uri, "op", 0, SPECS, tmp_path / "fresh")
        with pytest.raises(CorruptSnapshotError, match="not a plain file name"):
            fresh.get_store(1)
        fresh.close()
    assert not (tmp_path / "evil").exists()


def test_bad_arguments(tmp_path):
    with pytest.raises(UnknownSchemeError, match="unsupported storage URI scheme 'ftp'"):
        StateStoreProvider("ftp://x/y", "op", 0, SPECS, tmp_path)
    with pytest.raises(ValueError, match="partition_id must be a non-negative int"):
        StateStoreProvider(str(tmp_path), "op", -1, SPECS, tmp_path)
    with pytest.raises(ValueError, match="store_specs must be a non-empty list"):
        StateStoreProvider(str(tmp_path), "op", 0, [], tmp_path)
    with pytest.raises(ValueError, match="window_size_ms is required"):
        StoreSpec("w", "window", 10)


def test_credentials_are_not_shown(tmp_path):
    from sessionstore.checkpoint.storage.filesystem import redact

    shown = redact({"access_key": "AKIA", "secret_key": "s3cr3t", "region": "eu-west-1"})
    assert shown == {"access_key": "***", "secret_key": "***", "region": "eu-west-1"}
    # the provider keeps and shows only the redacted copy
    p = StateStoreProvider(
        str(tmp_path / "r"), "op", 0, SPECS, tmp_path / "l",
        storage_options={"secret_key": "s3cr3t", "session_token": "t0k3n"},
    )  # fmt: skip
    assert "s3cr3t" not in repr(p) and "t0k3n" not in repr(p)
    assert p.storage_options == {"secret_key": "***", "session_token": "***"}
    p.close()


def test_a_local_dir_shared_by_two_checkpoints_never_mixes_their_states(tmp_path):
    """Two queries with the same operator name and one local_dir: each load must see
    its own checkpoint's state, even when the local copy is at the same version."""
    specs = [StoreSpec("s", "session", 10**9)]
    local = tmp_path / "shared-local"
    for name in ("a", "b"):  # each checkpoint gets version 1, with its own content
        own = tmp_path / f"local-{name}"  # not the checkpoint's folder: that one is 0755
        p = StateStoreProvider(f"file://{tmp_path}/{name}", "op", 0, specs, own)
        h = p.get_store(0)
        h["s"].put(name, 1, 1, name)
        h.commit()
        p.close()
    for name in ("a", "b", "a"):
        p = StateStoreProvider(f"file://{tmp_path}/{name}", "op", 0, specs, local)
        h = p.get_store(1)
        assert [w.key for w, _ in h["s"].fetch_range(None, None)] == [name]
        h.abort()
        p.close()


def test_default_local_dirs_differ_per_checkpoint():
    from spark_integration.conf.backend import StateBackend

    a, b = StateBackend("s3://x/a"), StateBackend("s3://x/b")
    assert a.resolved_local_dir != b.resolved_local_dir
    assert a.resolved_local_dir == StateBackend("s3://x/a").resolved_local_dir
    assert StateBackend("s3://x/a", local_dir="/l").resolved_local_dir == "/l"


# ----------------------------------------------------------- checkpoint identity
def written_and_pruned(location, local):
    """Versions 1-16 with snapshots every 3, pruned to what versions 14-16 need:
    snapshot 12 and changelogs from 13 (and 10-11 of their group, which no version
    loadable reaches), so every restore must use a snapshot."""
    p = provider(location, local, snapshot_interval=3, retain_versions=3)
    write_versions(p, 16)
    p.do_maintenance()
    assert p.list_versions() == [12, 13, 14, 15, 16]
    p.close()


def restores_and_continues(location, local):
    """A fresh local dir restores the retained versions (12 from its snapshot),
    commits the next one, and another fresh local dir loads that."""
    fresh = provider(location, local)
    latest = fresh.latest_version()
    assert fresh.list_versions() == list(range(12, latest + 1)) and latest >= 16
    for version in (latest, 12):
        assert state(fresh, version) == expected(version)
    write_versions(fresh, 1, start=latest)
    fresh.close()
    again = provider(location, f"{local}-again")
    assert state(again, latest + 1) == expected(latest + 1)
    again.close()


def test_the_same_checkpoint_spelled_any_way_restores_from_its_snapshots(tmp_path, monkeypatch):
    """A relative path, an absolute path and a file:// URI, each with and without a
    trailing slash, are one checkpoint (it used to refuse its own snapshots:
    "snapshot 6 ... holds version -1")."""
    monkeypatch.chdir(tmp_path)
    written_and_pruned((f"file://{tmp_path}/remote", None), tmp_path / "writer")
    spellings = ["remote", "./remote/", f"{tmp_path}/remote", f"file://{tmp_path}/remote/"]
    for i, uri in enumerate(spellings):
        restores_and_continues((uri, None), tmp_path / f"exec{i}")


@pytest.mark.parametrize("scheme,alias", [("s3", "s3a"), ("gs", "gcs")])
def test_an_alias_scheme_and_a_trailing_slash_are_one_checkpoint(scheme, alias, request, tmp_path):
    """``s3://`` and ``s3a://``, ``gs://`` and ``gcs://``, with a trailing slash or not."""
    uri, options = request.getfixturevalue(f"{scheme}_bucket")
    written_and_pruned((uri, options), tmp_path / "writer")
    for i, spelling in enumerate([uri.replace(f"{scheme}://", f"{alias}://", 1), f"{uri}/"]):
        restores_and_continues((spelling, options), tmp_path / f"exec{i}")


def test_a_checkpoint_copied_to_another_folder_or_bucket_restores(s3_server, tmp_path):
    """Disaster recovery, or moving a job: a copy holds the same snapshots and
    changelogs, and they are its own."""
    import shutil

    import pyarrow.fs as pafs

    from tests.object_stores import new_bucket

    s3 = pafs.S3FileSystem(**s3_server)
    source = new_bucket(s3_server)
    written_and_pruned((f"s3://{source}/ckpt", s3_server), tmp_path / "writer")
    target = new_bucket(s3_server)
    pafs.copy_files(f"{source}/ckpt", f"{target}/moved/ckpt", s3, s3)
    restores_and_continues((f"s3://{target}/moved/ckpt", s3_server), tmp_path / "bucket")
    pafs.copy_files(f"{source}/ckpt", str(tmp_path / "folder"), s3, pafs.LocalFileSystem())
    shutil.copytree(tmp_path / "folder", tmp_path / "folder-copy")
    for i, folder in enumerate(["folder", "folder-copy"]):
        restores_and_continues((f"file://{tmp_path}/{folder}", None), tmp_path / f"exec{i}")


def put_value(location, local, version, value):
    """Commit ``version + 1`` with session ("k", 0, 0) = value."""
    p = provider(location, local)
    h = p.get_store(version)
    h["sessions"].put("k", 0, 0, value)
    h.commit()
    p.close()


def value_at(location, local, version):
    p = provider(location, local)
    h = p.get_store(version)
    found = [v for _, v in h["sessions"].fetch("k")]
    h.abort()
    p.close()
    return found


def test_a_checkpoint_created_again_at_the_same_uri_never_takes_the_old_local_copy(tmp_path):
    """The owner check's reason: a local copy of another checkpoint, at the version
    asked for, under the same local_dir and operator name. Here the other checkpoint
    lived at the same URI and was deleted (the URI used to be the owner)."""
    import shutil

    location, shared = (f"file://{tmp_path}/remote", None), tmp_path / "shared"
    put_value(location, shared, 0, "old")
    shutil.rmtree(tmp_path / "remote")
    put_value(location, tmp_path / "elsewhere", 0, "new")
    assert value_at(location, shared, 1) == ["new"]


def test_a_copy_that_went_its_own_way_never_takes_the_originals_local_copy(tmp_path):
    """A copy shares the original's id; after the copy both have their own version
    2. Sharing a local_dir, neither reads the other's."""
    import shutil

    original, copy = (f"file://{tmp_path}/a", None), (f"file://{tmp_path}/b", None)
    shared = tmp_path / "shared"
    put_value(original, shared, 0, "one")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    put_value(original, shared, 1, "original")
    put_value(copy, tmp_path / "elsewhere", 1, "copy")
    for _ in range(2):
        assert value_at(copy, shared, 2) == ["copy"]
        assert value_at(original, shared, 2) == ["original"]


def metadata_of(root):
    return msgpack.unpackb((root / "op" / "_metadata").read_bytes())


def test_a_checkpoint_without_an_id_loads_and_gets_one_with_its_first_commit(tmp_path):
    """Checkpoints written before ids existed: readers load them without writing,
    the first commit records an id, and the writer's local copy stays warm."""
    location, root = (f"file://{tmp_path}/remote", None), tmp_path / "remote"
    p = provider(location, tmp_path / "writer", snapshot_interval=2)
    # as an earlier release left it: the partition's URI, spelled otherwise, as the
    # owner in changelog 1 (and so in snapshot 2), and no id in _metadata
    h = p.get_store(0)
    h.db.put_meta(b"checkpoint_partition", f"{tmp_path}/remote/op/0".encode())
    h["sessions"].put("k", 0, 0, 0)
    h["plans"].put("k", "plan0", 0)
    h.commit()
    write_versions(p, 2, start=1)
    p.do_maintenance()
    p.close()
    old = {k: v for k, v in metadata_of(root).items() if k != "checkpoint_id"}
    (root / "op" / "_metadata").write_bytes(msgpack.packb(old))
    reader = provider(location, tmp_path / "reader")
    assert state(reader, 3) == expected(3)
    reader.close()
    assert "checkpoint_id" not in metadata_of(root)
    writer = provider(location, tmp_path / "writer2")
    write_versions(writer, 2, start=3)
    writer.close()
    recorded = metadata_of(root)["checkpoint_id"]
    assert len(recorded) == 32
    restores = []
    warm = provider(location, tmp_path / "writer2", progress=lambda *a: restores.append(a))
    assert state(warm, 5) == expected(5) and restores == []
    write_versions(warm, 1, start=5)
    warm.close()
    assert metadata_of(root)["checkpoint_id"] == recorded
    assert state(provider(location, tmp_path / "fresh"), 6) == expected(6)


def test_a_partition_that_believed_a_losing_id_converges_on_the_recorded_one(tmp_path):
    """Partitions creating a checkpoint together each write an id and the last write
    wins. One that kept a lost id has its local copy refused once, then agrees."""
    location, root = (f"file://{tmp_path}/remote", None), tmp_path / "remote"
    local, restores = tmp_path / "local", []
    p = provider(location, local, progress=lambda *a: restores.append(a))  # writes an id ...
    won = {**metadata_of(root), "checkpoint_id": "f" * 32}
    (root / "op" / "_metadata").write_bytes(msgpack.packb(won))  # ... another partition's wins
    write_versions(p, 1)
    p.close()
    restores.clear()
    q = provider(location, local, progress=lambda *a: restores.append(a))
    assert state(q, 1) == expected(1) and restores  # not trusted: restored
    q.close()
    restores.clear()
    assert state(p, 1) == expected(1) and restores == []  # p now knows the recorded id
    write_versions(p, 1, start=1)
    p.close()
    q = provider(location, local, progress=lambda *a: restores.append(a))
    assert state(q, 2) == expected(2) and restores == []
    q.close()


def test_partitions_kept_in_slabs_are_recorded_and_another_count_refused(tmp_path):
    """An operator of 12 partitions in 4 databases records both; a provider of
    another partition count, or of the 4 databases as 4 partitions, is refused by
    name; a ``_metadata`` whose counts cannot hold together is refused as such."""
    from sessionstore.checkpoint.partition.identity import layout_of, recorded_layout
    from sessionstore.checkpoint.records.layout import read_metadata, write_metadata

    uri = f"file://{tmp_path}/ck"

    def open_(local, **kw):
        StateStoreProvider(uri, "op", 1, SPECS, str(tmp_path / local), **kw).close()

    open_("a", num_partitions=4, key_groups=12)
    assert recorded_layout(uri, "op") == (4, 12)
    open_("b", num_partitions=4, key_groups=12)  # the same layout: accepted
    with pytest.raises(CheckpointMismatchError, match=r"written with 12 partitions \(in 4 slabs\), "
                       r"but this query has 24"):  # fmt: skip
        open_("c", num_partitions=4, key_groups=24)
    with pytest.raises(CheckpointMismatchError, match=r"written with 12 partitions \(in 4 slabs\), "
                       r"but this query has 4"):  # fmt: skip
        open_("d", num_partitions=4, key_groups=4)
    assert layout_of({"num_partitions": 4}) == (4, 4)  # a database per partition
    operator = open_filesystem(uri).child("op")
    write_metadata(operator, {**read_metadata(operator), "key_groups": 10})
    with pytest.raises(CheckpointMismatchError, match=r"records 10 partitions in 4 slabs: the "
                       "partition count must be a positive multiple"):  # fmt: skip
        recorded_layout(uri, "op")
