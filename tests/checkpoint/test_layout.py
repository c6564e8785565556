"""checkpoint/records/layout.py names every file a provider writes, and the commit observer
sees each step of a commit (the extension point tests/faults.py plugs into)."""

from __future__ import annotations

import os

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.partition.provider import CommitStep
from sessionstore.checkpoint.records.layout import (
    IDENTITY_KEY,
    METADATA,
    LocalPartition,
    changelog_name,
    committed_version,
    content_name,
    manifest_name,
    newest_committed,
    read_metadata,
)
from sessionstore.checkpoint.records.snapshot import read_manifest, referenced
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.stores.state_db import StateDB

SPECS = [StoreSpec("sessions", "session", 10**9)]


def files_under(root):
    return {
        os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names
    }


def commit(provider, version):
    h = provider.get_store(version)
    h["sessions"].put("k", version, version, version)
    return h.commit()


def test_every_file_a_provider_writes_has_its_name_from_layout(tmp_path):
    uri, local = f"file://{tmp_path}/ck", tmp_path / "local"
    p = StateStoreProvider(uri, "op", 3, SPECS, local, snapshot_interval=2)
    for v in range(2):
        commit(p, v)
    p.do_maintenance()
    p.close()
    remote = open_filesystem(uri).child("op/3")
    shas = referenced(read_manifest(remote, 2))
    assert len(shas) == 1  # a small database: every file is in the pack
    assert files_under(tmp_path / "ck") == {
        f"op/{METADATA}",
        *(f"op/3/{changelog_name(v)}" for v in (1, 2)),
        f"op/3/{manifest_name(2)}",
        *(f"op/3/{content_name(sha)}" for sha in shas),
    }
    assert changelog_name(2) == "changelog/0/2.changelog"
    assert changelog_name(12) == "changelog/1/12.changelog"
    assert manifest_name(2) == "snapshot/2.manifest"
    assert read_metadata(open_filesystem(uri).child("op"))["checkpoint_id"]
    paths = LocalPartition(local, "op", 3)
    assert paths.db == os.path.join(local, "op", "3", "db")
    assert os.path.isfile(paths.maintenance_lock)
    assert os.listdir(paths.snapshots) == []  # uploaded, then removed
    db = StateDB.open(paths.db)
    try:
        assert committed_version(db) == 2
        assert db.get_meta(IDENTITY_KEY) is not None
    finally:
        db.close()


def test_the_observer_sees_every_step_of_every_commit(tmp_path):
    seen = []
    p = StateStoreProvider(
        f"file://{tmp_path}/ck", "op", 1, SPECS, tmp_path / "local", commit_observer=seen.append
    )
    commit(p, 0)
    commit(p, 1)
    p.close()
    assert seen == [
        CommitStep(step, "op", 1, v) for v in (1, 2) for step in ("prepared", "uploaded", "applied")
    ]


class Refuse(Exception):
    pass


@pytest.mark.parametrize("step,durable", [("prepared", 1), ("uploaded", 2), ("applied", 2)])
def test_an_observer_that_raises_fails_the_commit_at_its_step(tmp_path, step, durable):
    """Before the upload nothing of version 2 exists; from the upload on it is
    committed, whatever the local copy holds."""

    def refuse(event):
        if event.step == step and event.version == 2:
            raise Refuse(step)

    uri = f"file://{tmp_path}/ck"
    p = StateStoreProvider(uri, "op", 0, SPECS, tmp_path / "local", commit_observer=refuse)
    commit(p, 0)
    with pytest.raises(Refuse):
        commit(p, 1)
    p.close()
    for local in (tmp_path / "local", tmp_path / "fresh"):  # its own copy, and none
        again = StateStoreProvider(uri, "op", 0, SPECS, local)
        assert again.latest_version() == durable
        h = again.get_store(durable)
        assert [v for _, v in h["sessions"].fetch("k")] == list(range(durable))
        h.abort()
        again.close()


def test_newest_committed_is_the_newest_version_of_any_partition(tmp_path):
    uri, local = f"file://{tmp_path}/ck", tmp_path / "local"
    operator = open_filesystem(uri).child("op")
    assert newest_committed(operator, 3) == 0  # no checkpoint
    providers = [StateStoreProvider(uri, "op", p, SPECS, local) for p in (0, 1)]
    assert newest_committed(operator, 3) == 0  # _metadata, no commit yet
    for provider, versions in zip(providers, (1, 3), strict=True):
        for v in range(versions):
            commit(provider, v)
        provider.close()
    # partition 2 never committed (it has no folder)
    assert newest_committed(operator, 3) == 3
    assert newest_committed(operator, 3, enough=2) == 3
    # partition 0 has enough: the others are not listed
    assert newest_committed(operator, 3, enough=1) == 1
    assert newest_committed(operator, 1) == 1
