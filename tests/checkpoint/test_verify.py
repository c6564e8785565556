"""checkpoint/offline/verify.py: what a sound checkpoint and each kind of damage report."""

from __future__ import annotations

import os

from sessionstore import StateStoreProvider
from sessionstore.checkpoint.offline.verify import Verification, verify_checkpoint, verify_partition
from sessionstore.checkpoint.records.changelog import encode_changelog
from sessionstore.checkpoint.records.layout import changelog_name, content_name, manifest_name
from sessionstore.checkpoint.records.snapshot import read_manifest
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.engine.write_buffer import WriteBuffer
from tests.tools.test_cli import SPECS, write_checkpoint


def write(uri, local):
    """Operator "op", partitions 0 and 1 at version 3, with a snapshot of version 2."""
    write_checkpoint(uri, None, local)


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_sound_checkpoint_has_no_problems(tmp_path):
    uri = f"file://{tmp_path}/ck"
    write(uri, tmp_path / "local")
    other = StateStoreProvider(uri, "other", 0, SPECS, tmp_path / "local")
    other.get_store(0).commit()
    other.close()
    assert verify_checkpoint(uri) == Verification(["op", "other"], 3, [])
    assert verify_checkpoint(uri, ["other"]) == Verification(["other"], 1, [])


def test_each_damage_is_named_once(tmp_path):
    uri, root = f"file://{tmp_path}/ck", tmp_path / "ck"
    write(uri, tmp_path / "local")
    flip(root / "op/0" / changelog_name(3), 30)
    os.remove(root / "op/1" / changelog_name(1))
    storage = open_filesystem(uri).child("op/1")
    sha = read_manifest(storage, 2)["pack"]["sha256"]
    flip(root / "op/1" / content_name(sha), 0)
    assert verify_partition(uri, "op", 0) == [
        f"changelog op/0/{changelog_name(3)} (version 3) is corrupt: checksum mismatch: the content "
        "was altered; "
        "restore from an earlier snapshot or re-run the batch that wrote it"
    ]
    assert verify_partition(uri, "op", 1) == [
        f"snapshot {uri}/op/1/{manifest_name(2)} (version 2) is unusable: the pack does "
        f"not match its sha256 {sha}"
    ]
    # without the snapshot, versions 1-3 need changelog 1
    os.remove(root / "op/1" / manifest_name(2))
    assert verify_checkpoint(uri).problems == [
        f"changelog op/0/{changelog_name(3)} (version 3) is corrupt: checksum mismatch: the content "
        "was altered; "
        "restore from an earlier snapshot or re-run the batch that wrote it",
        "op/1: changelog of version 1 is missing (gap after 0)",
    ]


def test_a_replay_failure_is_reported(tmp_path):
    """Files that pass every check but do not load: a well-formed changelog 3 whose
    writes do not bring the state to version 3 (it records no committed version)."""
    uri = f"file://{tmp_path}/ck"
    write(uri, tmp_path / "local")
    empty = encode_changelog(WriteBuffer(), "op", 0, 3)
    open_filesystem(uri).child("op/0").write_atomic(changelog_name(3), empty)
    assert verify_partition(uri, "op", 0) == [
        f"op/0: replay to version 3 failed: {uri}/op/0/{changelog_name(3)} did not bring "
        "the state to version 3"
    ]
