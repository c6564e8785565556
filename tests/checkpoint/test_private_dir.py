"""Local state directories are private (sessionstore.checkpoint.private_dir): made
with mode 0700, and one that another user owns or may write to is refused before
anything is read from or written to it (docs/security.md)."""

from __future__ import annotations

import os
import stat

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.private_dir import check_private_dir, private_dir
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
    assert f"owned by uid {NOBODY}, not by uid 0" in str(caught.value)
    assert (planted / "CURRENT").read_text() == "planted"  # neither opened nor replaced


@needs_root
def test_a_local_dir_owned_by_nobody_is_refused(tmp_path):
    local = tmp_path / "local"
    local.mkdir(mode=0o700)
    os.chown(local, NOBODY, NOBODY)
    with pytest.raises(UnsafeLocalDirError, match=f"owned by uid {NOBODY}"):
        _provider(tmp_path, local).get_store(0)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o1777])
def test_a_dir_others_may_write_to_is_refused_naming_its_mode(tmp_path, mode):
    local = tmp_path / "local"
    local.mkdir()
    os.chmod(local, mode)
    with pytest.raises(UnsafeLocalDirError, match=f"mode {mode:04o} lets other users write"):
        _provider(tmp_path, local).get_store(0)


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
    from spark_integration.planning.backend import StateBackend

    path = StateBackend("file:///ck").resolved_local_dir
    assert f"sessionstore-local-{os.geteuid()}" in path.split(os.sep)
