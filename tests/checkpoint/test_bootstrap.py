"""A bootstrapped version 0 (checkpoint/offline/bootstrap.py) without Spark: loaded
from its snapshot, never taken for the empty state, its event time read by batch
0; the refusals of a checkpoint with state and of a ``_metadata`` of another shape."""

from __future__ import annotations

import pytest

from sessionstore import StateStoreProvider
from sessionstore.checkpoint.offline.bootstrap import (
    check_metadata,
    commit_bootstrap,
    open_bootstrap,
    version_zero,
)
from sessionstore.checkpoint.offline.change import (
    ChangeError,
    CheckpointBusyError,
    begin_change,
    stage_database,
)
from sessionstore.checkpoint.partition.load import VersionNotFoundError
from sessionstore.checkpoint.records.layout import (
    LocalPartition,
    manifest_name,
    read_metadata,
    write_metadata,
)
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.stores.spec import StoreSpec

SPECS = [StoreSpec("counts", "kv", 0)]
ROWS = {0: {"a": 1, "b": 2}, 1: {"c": 3}}
EVENT_TIME = 12_345


def _bootstrap(uri, tmp_path):
    """Bootstrap operator "op" of 2 partitions with ROWS, each partition's state
    built as batch 0 of a scratch checkpoint (as the Spark job builds it)."""
    target = open_bootstrap(uri, "op", 2, quiet_s=0)
    change_id = begin_change(target)
    commits, metadata = [], None
    for p, rows in ROWS.items():
        scratch = tmp_path / f"scratch-{p}"
        provider = StateStoreProvider(
            f"file://{scratch}/ck", "op", p, SPECS, str(scratch / "local"), num_partitions=2
        )
        handle = provider.get_store(0)
        for key, value in rows.items():
            handle["counts"].put(key, value)
        handle.commit()
        provider.close()
        metadata = read_metadata(open_filesystem(f"file://{scratch}/ck").child("op"))
        db = LocalPartition(str(scratch / "local"), "op", p).db
        snapshot, commit = version_zero(db, str(scratch / "out"))
        commits.append(stage_database(target, p, snapshot, commit, change_id))
    metadata = check_metadata(target, metadata)
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
