"""Erasing keys (checkpoint/offline/erase.py, change.py) without Spark: every store kind,
the retained history scanned object by object, the restart, a busy checkpoint,
and kill -9 in the middle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from sessionstore import StateStoreProvider, erase
from sessionstore.checkpoint.offline.change import CheckpointBusyError
from sessionstore.checkpoint.partition.provider import CheckpointMismatchError
from sessionstore.checkpoint.records.changelog import decode_changelog
from sessionstore.checkpoint.records.layout import read_metadata
from sessionstore.checkpoint.records.snapshot import download_snapshot, read_manifest, referenced
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.encoding.keys import encode_key
from sessionstore.engine.db import META_CF
from sessionstore.stores import closing
from sessionstore.stores.registry import row_key_of, row_splitter_of
from sessionstore.stores.state_db import StateDB
from sessionstore.tools.reader import CheckpointSource, store_rows
from tests.checkpoint.test_repartition import SPECS, TYPES, write_source

ERASED = [("a", 7), ("é", -1), ("user-1", 2**33)]
VERSIONS = 20


def _rows_of(kinds, family, rows, erased, found, where):
    store, _, suffix = family.partition(".")
    kind = kinds[store]
    split, row_key = row_splitter_of(kind, suffix), row_key_of(kind)
    for key, value in rows:
        parts = [(key, value)] if split is None or value is None else split(key, value)
        for raw, _ in parts:
            if row_key(suffix, raw) in erased:
                found.append((where, family))


def rows_of_keys(uri, keys):
    """``(object, family)`` of every decoded row of ``keys`` in every object of
    operator "op" (changelogs, snapshots), and every object that holds a key's
    bytes, or is content no manifest uses."""
    erased = {encode_key(k) for k in keys}
    op = open_filesystem(uri).child("op")
    kinds = {s.name: s.kind for s in SPECS}
    found: list = []
    used: set = set()
    for rel in op.list_files():
        data = op.read(rel)
        parts = rel.split("/")
        if any(kb in data for kb in erased):
            found.append((rel, "bytes"))
        if rel.endswith(".changelog"):
            _, buf = decode_changelog(data, rel)
            for family, entries in buf.families.items():
                if family != META_CF:
                    _rows_of(kinds, family, entries.items(), erased, found, rel)
        elif rel.endswith(".manifest") and parts[1:2] == ["snapshot"]:
            part = op.child(parts[0])
            version = int(parts[2].split(".")[0])
            used |= {f"{parts[0]}/files/{n}" for n in referenced(read_manifest(part, version))}
            with tempfile.TemporaryDirectory() as tmp:
                download_snapshot(part, version, os.path.join(tmp, "db"))
                db = StateDB.open(os.path.join(tmp, "db"))
                try:
                    for family in db.column_families():
                        if family != META_CF:
                            _rows_of(kinds, family, db.scan(family), erased, found, rel)
                finally:
                    db.close()
    for rel in op.list_files():
        if rel.split("/")[1:2] == ["files"] and rel not in used:
            found.append((rel, "unreferenced content"))
    return found


def dumped(uri):
    """Every store's rows as the reader shows them (raw), the partition left out."""
    out = {}
    for spec in SPECS:
        found = store_rows(CheckpointSource(uri), "op", spec.name, raw=True)
        out[spec.name] = sorted(
            repr({k: v for k, v in r.items() if k != "partition"}) for r in found
        )
    return out


def without(rows, keys):
    return {s: [r for r in rs if not any(repr(k) in r for k in keys)] for s, rs in rows.items()}


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setattr(closing, "BLOCK_SESSIONS", 4)  # kept sessions span blocks
    uri = f"file://{tmp_path}/src"
    write_source(uri, str(tmp_path / "local"), versions=VERSIONS)
    return uri


@pytest.mark.slow
def test_no_object_holds_a_row_of_an_erased_key(source, tmp_path):
    before = dumped(source)
    found = rows_of_keys(source, ERASED)  # the scan finds them before
    assert {f for _, f in found} >= {"bytes", "sessions.closing", "proc.timers", "table.latest"}
    # stored rows of the keys in the latest version (every partition has a snapshot of it)
    latest = [f.split(".")[0] for rel, f in found if rel.endswith(f"/{VERSIONS}.manifest")]
    expected = {spec.name: latest.count(spec.name) for spec in SPECS}
    assert all(expected.values()), expected
    done = erase(source, "op", key=ERASED, quiet_s=0)
    assert rows_of_keys(source, ERASED) == []
    after = dumped(source)
    assert after == without(before, ERASED)
    assert done["rows"] == expected and done["version"] == VERSIONS
    assert done["keys"] == 3 and done["resumed"] is None
    op = open_filesystem(source).child("op")
    (audit_name,) = op.list("_audit")
    audit = json.loads(op.read(f"_audit/{audit_name}"))
    assert audit["keys"] == 3 and audit["keys_sha256"] == done["keys_sha256"]
    assert audit["operator"] == "op" and audit["rows"] == expected and audit["time"]
    # counts and a hash, no key (rows_of_keys checked its bytes for the encoded keys)
    fields = {"id", "time", "version", "change", "operator", "keys", "keys_sha256", "rows"}
    assert set(audit) == fields and audit["change"] == "erase"


@pytest.mark.slow
def test_the_restarted_partition_continues_from_the_erased_version(source, tmp_path):
    old_id = read_metadata(open_filesystem(source).child("op"))["checkpoint_id"]
    erase(source, "op", key=ERASED[:1], quiet_s=0)
    assert read_metadata(open_filesystem(source).child("op"))["checkpoint_id"] != old_id
    for p in range(4):
        # the local directory the checkpoint was written with: its databases hold
        # the erased rows at the same version, and must not be used
        provider = StateStoreProvider(
            source, "op", p, SPECS, str(tmp_path / "local"), num_partitions=4, key_types=TYPES
        )
        assert provider.list_versions() == [VERSIONS]
        h = provider.get_store(VERSIONS)
        assert h["counts"].get(ERASED[0]) is None
        h["counts"].put(ERASED[0], 99)
        assert h.commit() == VERSIONS + 1
        provider.close()
    counts = dumped(source)["counts"]  # the key's only rows: the new ones, one a partition
    new = repr({"key": ERASED[0], "value": 99})
    assert [r for r in counts if repr(ERASED[0]) in r] == [new] * 4


def test_a_checkpoint_committed_to_recently_is_refused(source):
    before = dumped(source)
    with pytest.raises(CheckpointBusyError, match="a query seems to hold the checkpoint"):
        erase(source, "op", key=ERASED)
    assert dumped(source) == before


@pytest.mark.slow
def test_a_commit_during_the_erase_stops_it_before_anything_is_visible(source, tmp_path):
    before = dumped(source)

    def commit_meanwhile(label, done, total):
        if done == 2:  # a query's partition 3 commits its next batch
            provider = StateStoreProvider(source, "op", 3, SPECS, str(tmp_path / "q"))
            h = provider.get_store(VERSIONS)
            h["counts"].put(("late", 1), 1)
            h.commit()
            provider.close()

    with pytest.raises(CheckpointBusyError, match="committed to while the change ran"):
        erase(source, "op", key=ERASED, quiet_s=0, progress=commit_meanwhile)
    after = dumped(source)
    assert after["counts"] == sorted(before["counts"] + [repr({"key": ("late", 1), "value": 1})])
    assert {s: r for s, r in after.items() if s != "counts"} == {
        s: r for s, r in before.items() if s != "counts"
    }
    assert not open_filesystem(source).child("op").list_dirs("_changes")


def test_bad_keys_are_refused_naming_them(source):
    with pytest.raises(ValueError, match="no key to erase"):
        erase(source, "op", key=[], quiet_s=0)
    with pytest.raises(ValueError, match="cannot be erased"):
        erase(source, "op", key=[1.5], quiet_s=0)
    with pytest.raises(ValueError, match="no operator 'nope'"):
        erase(source, "nope", key=["a"], quiet_s=0)


_KILLER = """
import os, signal, sys
import sessionstore.checkpoint.offline.change as change
from sessionstore import erase
step, at = sys.argv[2], int(sys.argv[3])
original = getattr(change, step)
calls = []
def dying(*args, **kw):
    calls.append(1)
    if len(calls) == at:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*args, **kw)
setattr(change, step, dying)
erase(sys.argv[1], "op", key=[("a", 7), ("é", -1), ("user-1", 2**33)], quiet_s=0)
"""


def _killed(uri, step, at):
    run = subprocess.run(
        [sys.executable, "-c", _KILLER, uri, step, str(at)],
        capture_output=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )  # fmt: skip
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()


@pytest.mark.slow
@pytest.mark.parametrize("step, at", [("_stage_partition", 3), ("_apply_partition", 2)])
def test_kill_9_leaves_the_old_or_the_new_state(source, tmp_path, step, at):
    before = dumped(source)
    _killed(source, step, at)
    if step == "_stage_partition":  # before the commit point: the old state, exactly
        assert dumped(source) == before
    else:  # after it: refused until finished
        with pytest.raises(CheckpointMismatchError, match="committed but not applied"):
            StateStoreProvider(source, "op", 0, SPECS, str(tmp_path / "q"))
    done = erase(source, "op", key=ERASED, quiet_s=0)  # the rerun
    assert (done["resumed"] is None) == (step == "_stage_partition")
    assert dumped(source) == without(before, ERASED)
    assert rows_of_keys(source, ERASED) == []
    assert not open_filesystem(source).child("op").list_dirs("_changes")


def test_a_warm_provider_of_the_old_state_restores_at_the_next_run(source, tmp_path):
    # a long-lived executor's provider: its database open at the version the
    # restarted query loads, holding the keys' rows
    provider = StateStoreProvider(source, "op", 0, SPECS, str(tmp_path / "warm"))
    h = provider.get_store(VERSIONS, run="run-1")
    held = {k for k in ERASED if h["counts"].get(k) is not None}
    assert held, "partition 0 holds none of the keys: pick others"
    h.abort()
    erase(source, "op", key=ERASED, quiet_s=0)
    # the same run: nothing read
    h = provider.get_store(VERSIONS, run="run-1")
    assert h["counts"].get(next(iter(held))) is not None
    h.abort()
    h = provider.get_store(VERSIONS, run="run-2")  # the query restarted: the erased state
    assert all(h["counts"].get(k) is None for k in ERASED)
    assert h.commit() == VERSIONS + 1
    provider.close()


@pytest.mark.slow
def test_a_change_whose_staging_another_change_deleted_commits_nothing(source):
    """Two changes at once: the second's start deletes the first's staging; the first
    must not write a commit point naming manifests that are gone (every later load
    and change would then be refused)."""
    from sessionstore.checkpoint.offline.change import CHANGE_FIELD, ChangeError

    before = dumped(source)
    operator = open_filesystem(source).child("op")

    def another_change_starts(label, done, total):
        if done == total:  # every partition staged
            for staging in operator.list_dirs("_changes"):
                operator.delete_dir(f"_changes/{staging}")

    with pytest.raises(ChangeError, match=r"lost its staged partitions \[0, 1, 2, 3\]"):
        erase(source, "op", key=ERASED, quiet_s=0, progress=another_change_starts)
    assert CHANGE_FIELD not in read_metadata(operator)
    assert dumped(source) == before
    erase(source, "op", key=ERASED, quiet_s=0)  # and the checkpoint still takes a change
    assert dumped(source) == without(before, ERASED)
