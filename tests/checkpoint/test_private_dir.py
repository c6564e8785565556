"""Local state directories are private (sessionstore.checkpoint.storage.private_dir): made
with mode 0700, and one that another user owns or may access at all is refused
before anything is read from or written to it, each time a database is opened, a
restore or a snapshot is put in place or maintenance runs (docs/security.md)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.storage.private_dir import check_private_dir, private_dir
from sessionstore.errors import UnsafeLocalDirError
from tests.foreign_user import NOBODY, needs_root

SPECS = [StoreSpec("sessions", "session", 10**9)]


def _provider(tmp_path, local):
    return StateStoreProvider(f"file://{tmp_path}/remote", "op", 3, SPECS, str(local))


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_every_level_a_provider_creates_is_mode_0700_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        p = _provider(tmp_path, tmp_path / "local" / "deeper")
        h = p.get_store(0)
        h["sessions"].put("k", 1, 2, "v")
        assert h.commit() == 1
        p.close()
    finally:
        os.umask(old)
    for level in ("local/deeper", "local/deeper/op", "local/deeper/op/3"):
        assert _mode(tmp_path / level) == 0o700, level


@needs_root
def test_a_pre_created_partition_dir_owned_by_nobody_is_refused_and_left_alone(tmp_path):
    local = tmp_path / "local"
    planted = local / "op" / "3" / "db"
    planted.mkdir(parents=True, mode=0o700)
    (planted / "CURRENT").write_text("planted")
    os.chmod(local, 0o700)
    os.chmod(local / "op", 0o700)
    os.chown(local / "op" / "3", NOBODY, NOBODY)
    p = _provider(tmp_path, local)
    with pytest.raises(UnsafeLocalDirError) as caught:
        p.get_store(0)
    assert str(caught.value).startswith(f"refusing local state directory '{local}/op/3': ")
    assert f"owned by uid {NOBODY} ('nobody'), not by uid 0 ('root')" in str(caught.value)
    assert (planted / "CURRENT").read_text() == "planted"  # neither opened nor replaced


@needs_root
def test_a_local_dir_owned_by_nobody_is_refused(tmp_path):
    local = tmp_path / "local"
    local.mkdir(mode=0o700)
    os.chown(local, NOBODY, NOBODY)
    with pytest.raises(UnsafeLocalDirError, match=f"owned by uid {NOBODY} "):
        _provider(tmp_path, local).get_store(0)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o1777, 0o740, 0o704, 0o710, 0o755])
def test_a_dir_others_may_access_at_all_is_refused_naming_its_mode(tmp_path, mode):
    local = tmp_path / "local"
    local.mkdir()
    os.chmod(local, mode)
    with pytest.raises(UnsafeLocalDirError) as caught:
        _provider(tmp_path, local).get_store(0)
    assert str(caught.value) == (
        f"refusing local state directory '{local}': its mode {mode:04o} gives other users "
        "access (read shows the state, write plants it); chmod go-rwx it; use a directory "
        "of your own that only you can access (mode 0700), or remove this one"
    )


def test_a_symlink_in_place_of_a_partition_dir_is_refused(tmp_path):
    local = tmp_path / "local"
    (local / "op").mkdir(parents=True, mode=0o700)
    os.chmod(local, 0o700)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", local / "op" / "3")
    with pytest.raises(UnsafeLocalDirError, match="symbolic link"):
        _provider(tmp_path, local).get_store(0)


def test_private_dir_checks_only_from_its_base_down(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp: above the base, not ours to judge
    made = private_dir(str(shared / "mine" / "a"), base=str(shared / "mine"))
    assert _mode(made) == 0o700 and _mode(shared / "mine") == 0o700
    with pytest.raises(UnsafeLocalDirError, match="does not exist"):
        check_private_dir(str(tmp_path / "missing"))


def test_the_default_local_dir_is_per_user():
    from spark_integration.conf.backend import StateBackend

    path = StateBackend("file:///ck").resolved_local_dir
    assert f"sessionstore-local-{os.geteuid()}" in path.split(os.sep)


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """The system's temporary directory moved to ``tmp_path/tmp`` (mode 1777, as
    ``/tmp``), so the per-user folder lands there."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def _default_provider(tmp_path):
    from spark_integration.conf.backend import StateBackend

    backend = StateBackend(f"file://{tmp_path}/remote")
    return _provider(tmp_path, backend.resolved_local_dir), backend.resolved_local_dir


def test_the_per_user_folder_is_made_0700_and_checked(own_tmp, tmp_path):
    old = os.umask(0o022)
    try:
        p, local = _default_provider(tmp_path)
        h = p.get_store(0)
        h["sessions"].put("k", 1, 2, "v")
        assert h.commit() == 1
        p.close()
    finally:
        os.umask(old)
    root = own_tmp / f"sessionstore-local-{os.geteuid()}"
    assert os.path.dirname(local) == str(root)
    assert _mode(root) == 0o700
    os.chmod(root, 0o750)  # group may read: the state would show
    with pytest.raises(UnsafeLocalDirError, match=f"'{root}': its mode 0750 gives other"):
        _default_provider(tmp_path)[0].get_store(1)


@needs_root
def test_a_per_user_folder_another_user_made_first_is_refused_naming_owner_and_remedy(
    own_tmp, tmp_path
):
    root = own_tmp / f"sessionstore-local-{os.geteuid()}"
    root.mkdir()
    os.chmod(root, 0o777)
    os.chown(root, NOBODY, NOBODY)
    p, local = _default_provider(tmp_path)
    with pytest.raises(UnsafeLocalDirError) as caught:
        p.get_store(0)
    assert str(caught.value) == (
        f"refusing local state directory '{root}': it is owned by uid {NOBODY} ('nobody'), "
        "not by uid 0 ('root') (another user made it first, and could swap what is below "
        "it); its owner or root must remove it, or set local_dir (spark.sessionstore.localDir) "
        "to a directory of yours; use a directory of your own that only you can access "
        "(mode 0700), or remove this one"
    )
    assert os.listdir(root) == []  # nothing made below it


def test_a_partition_dir_swapped_for_a_symlink_after_the_first_check_is_refused(tmp_path):
    local = tmp_path / "local"
    p = _provider(tmp_path, local)
    h = p.get_store(0)
    h["sessions"].put("k", 1, 2, "v")
    assert h.commit() == 1
    p.close()  # parked, as between micro-batches: the next task opens the database again
    moved = tmp_path / "elsewhere"
    shutil.move(local / "op" / "3", moved)
    os.symlink(moved, local / "op" / "3")
    with pytest.raises(UnsafeLocalDirError, match="it is a symbolic link"):
        p.get_store(1)


def test_maintenance_checks_the_partition_dir_it_makes(tmp_path):
    local = tmp_path / "local"
    p = _provider(tmp_path, local)  # nothing local yet
    (local / "op").mkdir(parents=True)
    os.chmod(local, 0o700)
    os.chmod(local / "op", 0o777)
    with pytest.raises(UnsafeLocalDirError, match=f"'{local}/op': its mode 0777"):
        p.do_maintenance()
    assert not (local / "op" / "3").exists()
