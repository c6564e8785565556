"""A bootstrapped version 0 (checkpoint/offline/bootstrap.py) without Spark: loaded
from its snapshot, never taken for the empty state, its event time read by batch
0; the refusals of a checkpoint with state and of a ``_metadata`` of another shape."""

from __future__ import annotations

import pytest

import sessionstore.checkpoint.offline.change as change_module
from sessionstore import StateStoreProvider
from sessionstore.checkpoint.offline.bootstrap import (
    check_metadata,
    commit_bootstrap,
    finish_pending,
    open_bootstrap,
    version_zero,
)
from sessionstore.checkpoint.offline.change import (
    ChangeError,
    CheckpointBusyError,
    begin_change,
    stage_database,
)
from sessionstore.checkpoint.partition.identity import CheckpointMismatchError
from sessionstore.checkpoint.partition.load import VersionNotFoundError
from sessionstore.checkpoint.records.layout import (
    BOOTSTRAP_FIELD,
    CHANGES_DIR,
    FILES_DIR,
    METADATA,
    LocalPartition,
    PartitionFiles,
    manifest_name,
    read_metadata,
    write_metadata,
)
from sessionstore.checkpoint.records.snapshot import CorruptSnapshotError
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.stores.spec import StoreSpec

SPECS = [StoreSpec("counts", "kv", 0)]
ROWS = {0: {"a": 1, "b": 2}, 1: {"c": 3}}
EVENT_TIME = 12_345


def _stage(target, change_id, p, rows, scratch, key_types=None):
    """Stage partition ``p`` of ``target`` holding ``rows``, its state built as
    batch 0 of a scratch checkpoint (as the Spark job builds it, of keys of Spark
    types ``key_types``); ``(commit, the scratch's _metadata)``."""
    provider = StateStoreProvider(
        f"file://{scratch}/ck", "op", p, SPECS, str(scratch / "local"), num_partitions=2,
        key_types=key_types,
    )  # fmt: skip
    handle = provider.get_store(0)
    for key, value in rows.items():
        handle["counts"].put(key, value)
    handle.commit()
    provider.close()
    metadata = read_metadata(open_filesystem(f"file://{scratch}/ck").child("op"))
    db = LocalPartition(str(scratch / "local"), "op", p).db
    snapshot, commit = version_zero(db, str(scratch / "out"))
    return stage_database(target, p, snapshot, commit, change_id), metadata


def _staged(uri, tmp_path, rows=ROWS, begun=None, key_types=None):
    """A bootstrap of operator "op" of 2 partitions with ``rows``, staged, not
    committed (``begun``: its target and change id, else opened and begun now):
    ``(target, change id, commits, metadata)``."""
    if begun is None:
        target = open_bootstrap(uri, "op", 2, quiet_s=0)
        begun = target, begin_change(target)
    target, change_id = begun
    commits, metadata = [], None
    for p, kept in rows.items():
        scratch = tmp_path / f"scratch-{p}"
        commit, metadata = _stage(target, change_id, p, kept, scratch, key_types)
        commits.append(commit)
    return target, change_id, commits, check_metadata(target, metadata)


def _bootstrap(uri, tmp_path, rows=ROWS):
    """Bootstrap operator "op" of 2 partitions with ``rows``."""
    target, change_id, commits, metadata = _staged(uri, tmp_path, rows)
    return commit_bootstrap(target, change_id, commits, metadata, EVENT_TIME, {"events": 3})


def _rows(uri, tmp_path, p, version=0):
    provider = StateStoreProvider(uri, "op", p, SPECS, str(tmp_path / "q"), num_partitions=2)
    try:
        handle = provider.get_store(version)
        return {k: handle["counts"].get(k) for k in "abc" if handle["counts"].get(k)}, provider
    finally:
        provider.close()


def test_version_0_loads_the_bootstrapped_state_and_batch_0_its_event_time(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    record = _bootstrap(uri, tmp_path)
    assert (record["version"], record["audit"]["kind"]) == (0, "bootstrap")
    for p, rows in ROWS.items():
        got, provider = _rows(uri, tmp_path, p)
        assert got == rows
        assert provider.initial_event_time == EVENT_TIME
    # a query's next commits continue it: version 1 replays onto the snapshot
    provider = StateStoreProvider(uri, "op", 0, SPECS, str(tmp_path / "q2"), num_partitions=2)
    handle = provider.get_store(0)
    handle["counts"].put("d", 4)
    assert handle.commit() == 1
    provider.close()
    assert _rows(uri, tmp_path / "fresh", 0, version=1)[0] == {"a": 1, "b": 2}  # "d" not in "abc"


def test_a_bootstrapped_version_0_whose_snapshot_is_gone_is_not_the_empty_state(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    _bootstrap(uri, tmp_path)
    open_filesystem(uri).child("op").child("0").delete(manifest_name(0))
    with pytest.raises(VersionNotFoundError, match="version 0 was bootstrapped and its snapshot"):
        _rows(uri, tmp_path, 0)


def test_a_checkpoint_with_state_is_refused(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    _bootstrap(uri, tmp_path)
    with pytest.raises(ChangeError, match="already holds committed state \\(partition 0 is at"):
        open_bootstrap(uri, "op", 2, quiet_s=0)
    # a query's recent commit: it seems to hold the checkpoint
    provider = StateStoreProvider(uri, "op", 0, SPECS, str(tmp_path / "q"), num_partitions=2)
    provider.get_store(0).commit()
    provider.close()
    provider = StateStoreProvider(uri, "op", 1, SPECS, str(tmp_path / "q"), num_partitions=2)
    provider.get_store(0).commit()
    provider.close()
    with pytest.raises(CheckpointBusyError, match="a query seems to hold the checkpoint"):
        open_bootstrap(uri, "op", 2)


def test_a_metadata_of_another_shape_is_refused_naming_the_field(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    storage = open_filesystem(uri).child("op")
    write_metadata(storage, {"format": 1, "operator_id": "op", "num_partitions": 3})
    target = open_bootstrap(uri, "op", 2, quiet_s=0)
    with pytest.raises(ChangeError, match="records num_partitions 3, but the bootstrapped"):
        check_metadata(target, {"format": 1, "operator_id": "op", "num_partitions": 2})


def _nothing_committed(uri):
    operator = open_filesystem(uri).child("op")
    assert [PartitionFiles(operator.child(str(p))).snapshots() for p in (0, 1)] == [set()] * 2
    if operator.exists(METADATA):
        assert read_metadata(operator).get(BOOTSTRAP_FIELD) is None
    assert not operator.list_dirs(CHANGES_DIR)


def test_a_snapshot_0_left_at_a_location_not_bootstrapped_is_not_its_version_0(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    _bootstrap(uri, tmp_path)
    # the location deleted but for partition 0's snapshot (a delete of the prefix that
    # was interrupted), then a query started there: a new checkpoint, not bootstrapped
    operator = open_filesystem(uri).child("op")
    operator.delete(METADATA)
    operator.delete_dir("1")
    got, provider = _rows(uri, tmp_path / "new", 0)
    assert (got, provider.initial_event_time) == ({}, None)


def test_a_foreign_snapshot_0_is_refused_naming_the_bootstrapped_commit(tmp_path):
    uri, other = f"file://{tmp_path}/ckpt", f"file://{tmp_path}/other"
    _bootstrap(uri, tmp_path / "mine")
    _bootstrap(other, tmp_path / "theirs", {0: {"a": 7}, 1: {"c": 8}})
    # another bootstrapped checkpoint's partition 0 copied over this one's
    mine = open_filesystem(uri).child("op").child("0")
    theirs = open_filesystem(other).child("op").child("0")
    for name in theirs.list(FILES_DIR):
        mine.write_atomic(f"{FILES_DIR}/{name}", theirs.read(f"{FILES_DIR}/{name}"))
    mine.write_atomic(manifest_name(0), theirs.read(manifest_name(0)))
    with pytest.raises(Exception, match="but version 0 was bootstrapped as commit"):
        _rows(uri, tmp_path, 0)
    assert _rows(uri, tmp_path, 1)[0] == {"c": 3}  # the other partition is its own


def test_a_query_started_while_the_bootstrap_ran_stops_its_commit(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    target, change_id, commits, metadata = _staged(uri, tmp_path)
    # the query's partitions open the new location (writing its _metadata) and load
    # version 0 as the empty state; their first commit is still to come
    StateStoreProvider(uri, "op", 0, SPECS, str(tmp_path / "q"), num_partitions=2).close()
    with pytest.raises(CheckpointBusyError, match="while the change ran .* was written by"):
        commit_bootstrap(target, change_id, commits, metadata, EVENT_TIME, {"events": 3})
    _nothing_committed(uri)


def test_a_partition_staged_by_another_attempt_than_the_one_used_is_not_committed(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    target, change_id, commits, metadata = _staged(uri, tmp_path)
    # another attempt of partition 0's task (speculative, or a zombie) stages after
    # the attempt whose output Spark used
    _stage(target, change_id, 0, {"z": 9}, tmp_path / "zombie")
    with pytest.raises(ChangeError, match="partition 0 was staged by another attempt"):
        commit_bootstrap(target, change_id, commits, metadata, EVENT_TIME, {"events": 3})
    _nothing_committed(uri)


def _killed_after_commit_point(monkeypatch, target, change_id, commits, metadata):
    """Commit the staged bootstrap as a run killed right after its commit point."""

    def killed(storage, record):
        raise KeyboardInterrupt("killed")

    with monkeypatch.context() as patch:
        patch.setattr(change_module, "finish_change", killed)
        with pytest.raises(KeyboardInterrupt):
            commit_bootstrap(target, change_id, commits, metadata, EVENT_TIME, {"events": 3})


def test_two_bootstraps_at_once_commit_one(tmp_path, monkeypatch):
    uri = f"file://{tmp_path}/ckpt"
    targets = [open_bootstrap(uri, "op", 2, quiet_s=0) for _ in range(2)]
    begun = [(t, begin_change(t)) for t in targets]  # both checked and begun, then staged
    first = _staged(uri, tmp_path / "first", begun=begun[0])
    second = _staged(uri, tmp_path / "second", {0: {"a": 7}, 1: {"c": 8}}, begun[1])
    _killed_after_commit_point(monkeypatch, *first)  # committed, its apply still to come
    with pytest.raises(CheckpointBusyError, match="while the change ran .* committed change"):
        commit_bootstrap(*second, EVENT_TIME, {"events": 3})
    assert finish_pending(uri, "op")["id"] == first[1]
    assert [_rows(uri, tmp_path, p)[0] for p in (0, 1)] == [ROWS[0], ROWS[1]]


def test_a_change_begun_after_another_committed_keeps_its_staging(tmp_path, monkeypatch):
    uri = f"file://{tmp_path}/ckpt"
    first = _staged(uri, tmp_path / "first")
    second = open_bootstrap(uri, "op", 2, quiet_s=0)  # checked before the first commits
    _killed_after_commit_point(monkeypatch, *first)
    with pytest.raises(CheckpointBusyError, match=f"change {first[1]} is committed"):
        begin_change(second)
    assert finish_pending(uri, "op")["id"] == first[1]  # its staging is still there
    assert [_rows(uri, tmp_path, p)[0] for p in (0, 1)] == [ROWS[0], ROWS[1]]


def test_a_query_whose_keys_spark_hashes_otherwise_is_refused(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    target, change_id, commits, metadata = _staged(uri, tmp_path, key_types=["integer"])
    commit_bootstrap(target, change_id, commits, metadata, EVENT_TIME, {"events": 3})
    # the stream's key column is a long: Spark routes its keys to other partitions
    # than the history's ints, where their bootstrapped state is not
    with pytest.raises(CheckpointMismatchError, match=r"\['integer'\].*\['long'\]"):
        StateStoreProvider(
            uri, "op", 0, SPECS, str(tmp_path / "q"), num_partitions=2, key_types=["long"]
        )
    same = StateStoreProvider(
        uri, "op", 0, SPECS, str(tmp_path / "q"), num_partitions=2, key_types=["integer"]
    )
    assert {k: same.get_store(0)["counts"].get(k) for k in "ab"} == ROWS[0]
    same.close()


def test_a_corrupt_bootstrapped_snapshot_is_refused_not_read_as_empty(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    _bootstrap(uri, tmp_path)
    part = open_filesystem(uri).child("op").child("0")
    for name in part.list(FILES_DIR):
        part.write_atomic(f"{FILES_DIR}/{name}", b"not what was committed")
    with pytest.raises(CorruptSnapshotError, match="does not match its sha256"):
        _rows(uri, tmp_path, 0)
