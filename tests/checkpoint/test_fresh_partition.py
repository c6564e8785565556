"""A partition's first load (version 0, no local copy) creates its database in
place, once, and what a crash or another process leaves at that place is handled
as any local copy is: a folder RocksDB never finished and an empty database
without the checkpoint's identity are replaced, a database another process holds
is refused, never removed under it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sessionstore import StateDBLockedError, StateStoreProvider, StoreSpec
from sessionstore.checkpoint.records.layout import IDENTITY_KEY, LocalPartition, is_database
from sessionstore.stores.state_db import StateDB

SPECS = [StoreSpec("values", "kv", 0)]
ROOT = Path(__file__).resolve().parents[2]


def _provider(tmp_path: Path) -> StateStoreProvider:
    return StateStoreProvider(f"file://{tmp_path}/remote", "op", 0, SPECS, str(tmp_path / "local"))


def _commit_two_versions(p: StateStoreProvider) -> list[str]:
    """Versions 1 and 2 (``k`` = 0, then 1); how each load got its state."""
    kinds = []
    for v in range(2):
        h = p.get_store(v)
        h["values"].put("k", v)
        assert h.commit() == v + 1
        kinds.append(p.last_metrics["load_kind"])
    return kinds


def _values_at_2(tmp_path: Path) -> list:
    """The committed state at version 2, as a new provider with its own local
    folder restores it."""
    p = StateStoreProvider(f"file://{tmp_path}/remote", "op", 0, SPECS, str(tmp_path / "other"))
    try:
        h = p.get_store(2)
        return list(h["values"].items())
    finally:
        p.close()


def test_a_new_partition_opens_one_database_in_place(tmp_path, monkeypatch):
    opened = []
    original = StateDB.open.__func__

    def counting_open(cls, path, *args, **kw):
        opened.append(path)
        return original(cls, path, *args, **kw)

    monkeypatch.setattr(StateDB, "open", classmethod(counting_open))
    p = _provider(tmp_path)
    assert _commit_two_versions(p) == ["restore", "warm"]
    local = LocalPartition(tmp_path / "local", "op", 0)
    # one database opened, in place: not a scratch one moved in and opened again
    assert opened == [local.db]
    assert [n for n in os.listdir(Path(local.root).parent) if ".restore-" in n] == []
    p.close()
    assert _values_at_2(tmp_path) == [("k", 1)]


def test_a_folder_rocksdb_never_finished_is_replaced(tmp_path):
    local = LocalPartition(tmp_path / "local", "op", 0)
    for folder in (local.base, Path(local.root).parent, local.root, local.db):
        os.makedirs(folder, mode=0o700, exist_ok=True)  # private, as a provider makes them
    Path(local.db, "MANIFEST-000001").write_bytes(b"torn")  # no CURRENT: not a database
    p = _provider(tmp_path)
    _commit_two_versions(p)
    p.close()
    assert is_database(local.db)
    assert _values_at_2(tmp_path) == [("k", 1)]


def test_a_crash_between_the_creation_and_the_identity_is_replaced_by_the_next_load(tmp_path):
    """A process killed (SIGKILL) right after it created the database, before the
    checkpoint's identity is in it: the next provider finds an empty database that
    is not this checkpoint's, restores over it, and commits on top."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        from sessionstore import StateStoreProvider, StoreSpec
        from sessionstore.checkpoint.records.layout import IDENTITY_KEY
        from sessionstore.stores.state_db import StateDB

        original = StateDB.put_meta

        def put_meta(self, key, value):
            if key == IDENTITY_KEY:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, key, value)

        StateDB.put_meta = put_meta
        p = StateStoreProvider(f"file://{sys.argv[1]}/remote", "op", 0,
                               [StoreSpec("values", "kv", 0)], sys.argv[1] + "/local")
        p.get_store(0)
        """
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == -9, out.stderr
    local = LocalPartition(tmp_path / "local", "op", 0)
    assert is_database(local.db)
    with StateDB.open(local.db) as left:  # what the crash left: empty, not owned
        assert left.get_meta(IDENTITY_KEY) is None
    p = _provider(tmp_path)
    assert _commit_two_versions(p) == ["restore", "warm"]
    p.close()
    with StateDB.open(local.db) as db:
        assert db.get_meta(IDENTITY_KEY) is not None
    assert _values_at_2(tmp_path) == [("k", 1)]


def test_a_database_another_holder_created_is_refused_not_removed(tmp_path):
    """Two providers of one partition and local folder (two worker processes
    without the store service between them): the second's first load meets the
    first's lock and fails, and the first's database and commits are untouched."""
    first = _provider(tmp_path)
    h = first.get_store(0)
    second = _provider(tmp_path)
    with pytest.raises(StateDBLockedError):
        second.get_store(0)
    h["values"].put("k", 0)
    assert h.commit() == 1
    h = first.get_store(1)
    h["values"].put("k", 1)
    assert h.commit() == 2
    first.close()
    second.close()
    assert _values_at_2(tmp_path) == [("k", 1)]
