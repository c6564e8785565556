"""Flush groups (sessionstore/checkpoint/storage/flush_group.py): the local commits
of a block are visible at once and reach the disk together at its end, also when
the block fails; outside a block, and in other threads, each write is flushed as
it is made."""

from __future__ import annotations

import os
import threading

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.storage import flush_group as fg
from sessionstore.checkpoint.storage.filesystem import open_filesystem

SPECS = [StoreSpec("sessions", "session", 10**9)]


class Disk:
    """Records every ``fsync`` (the path of its descriptor) and ``syncfs`` (the
    path it was given), in order, and performs them."""

    def __init__(self, monkeypatch, syncfs: bool = True, fail_syncfs: bool = False):
        self.events: list[tuple[str, str]] = []
        real_fsync = os.fsync

        def fsync(fd):
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            real_fsync(fd)

        def fake_syncfs(fd):
            self.events.append(("syncfs", os.readlink(f"/proc/self/fd/{fd}")))
            return -1 if fail_syncfs else 0

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(fg, "_syncfs", (lambda: fake_syncfs) if syncfs else (lambda: None))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


def commit(tmp_path, partition: int, value: int = 1) -> StateStoreProvider:
    provider = StateStoreProvider(
        f"file://{tmp_path}/remote", "op", partition, SPECS, str(tmp_path / f"local-{partition}")
    )
    handle = provider.get_store(0)
    handle["sessions"].put(f"k{partition}", 0, 10, {"n": value})
    handle.commit()
    return provider


def changelog(tmp_path, partition: int, version: int = 1) -> str:
    return f"{tmp_path}/remote/op/{partition}/changelog/0/{version}.changelog"


def test_commits_in_a_group_are_visible_at_once_and_flushed_by_one_syncfs_at_its_end(
    tmp_path, monkeypatch
):
    disk = Disk(monkeypatch)
    providers = []
    with fg.flush_group():
        for partition in range(6):
            providers.append(commit(tmp_path, partition))
            assert os.path.exists(changelog(tmp_path, partition))
        # published: a second attempt's exclusive create of the name is refused
        storage = open_filesystem(f"file://{tmp_path}/remote/op/0")
        assert storage.write_exclusive("changelog/0/1.changelog", b"other attempt") is False
        assert "fsync" not in disk.kinds() and "syncfs" not in disk.kinds()
    assert disk.kinds() == ["syncfs"]
    assert disk.events[0][1].startswith(str(tmp_path))
    for partition, provider in enumerate(providers):
        assert provider.get_store(1)["sessions"].fetch_session(f"k{partition}", 0, 10) == {"n": 1}
        provider.close()


def test_outside_a_group_each_commit_flushes_its_changelog_before_it_returns(
    tmp_path, monkeypatch
):
    disk = Disk(monkeypatch)
    commit(tmp_path, 0).close()
    flushed = [path for kind, path in disk.events if kind == "fsync"]
    assert changelog(tmp_path, 0).rsplit("/", 1)[0] in flushed
    assert "syncfs" not in disk.kinds()


def test_a_small_group_flushes_path_by_path_at_its_end(tmp_path, monkeypatch):
    storage = open_filesystem(f"file://{tmp_path}/remote")
    storage.write_atomic("a/first", b"1")  # the folder exists: one file and one folder
    disk = Disk(monkeypatch)
    with fg.flush_group():
        storage.write_atomic("a/second", b"2")
        assert disk.events == []
    assert sorted(disk.events) == [
        ("fsync", f"{tmp_path}/remote/a"), ("fsync", f"{tmp_path}/remote/a/second"),
    ]  # fmt: skip


def test_a_failing_block_is_flushed_too_and_its_error_raised(tmp_path, monkeypatch):
    disk = Disk(monkeypatch)
    with pytest.raises(RuntimeError, match="the task failed"):
        with fg.flush_group():
            for partition in range(3):
                commit(tmp_path, partition).close()
            raise RuntimeError("the task failed")
    assert disk.kinds() == ["syncfs"]


def test_a_failed_flush_fails_the_group_and_loses_nothing_committed(tmp_path, monkeypatch):
    Disk(monkeypatch, fail_syncfs=True)
    with pytest.raises(OSError, match="syncfs failed"):
        with fg.flush_group():
            for partition in range(3):
                commit(tmp_path, partition).close()
    monkeypatch.undo()
    fresh = StateStoreProvider(f"file://{tmp_path}/remote", "op", 2, SPECS, str(tmp_path / "new"))
    assert fresh.get_store(1)["sessions"].fetch_session("k2", 0, 10) == {"n": 1}
    fresh.close()


def test_a_nested_group_is_flushed_by_the_outer_one_only(tmp_path, monkeypatch):
    disk = Disk(monkeypatch)
    with fg.flush_group():
        with fg.flush_group():
            for partition in range(3):
                commit(tmp_path, partition).close()
        assert disk.events == []
        commit(tmp_path, 3).close()
    assert disk.kinds() == ["syncfs"]


def test_another_threads_writes_are_not_deferred_by_a_group(tmp_path, monkeypatch):
    disk = Disk(monkeypatch)
    storage = open_filesystem(f"file://{tmp_path}/remote")
    storage.write_atomic("b/x", b"0")
    disk.events.clear()
    with fg.flush_group():
        worker = threading.Thread(target=storage.write_atomic, args=("b/y", b"1"))
        worker.start()
        worker.join()
        # flushed before it was published (under its temporary name), then its folder
        assert [kind for kind, _ in disk.events] == ["fsync", "fsync"]
        assert disk.events[0][1].startswith(f"{tmp_path}/remote/b/.y.")
        assert disk.events[1] == ("fsync", f"{tmp_path}/remote/b")
    assert len(disk.events) == 2


def test_without_syncfs_a_group_fsyncs_every_path_at_its_end(tmp_path, monkeypatch):
    disk = Disk(monkeypatch, syncfs=False)
    with fg.flush_group():
        for partition in range(3):
            commit(tmp_path, partition).close()
        assert disk.events == []
    flushed = {path for _, path in disk.events}
    for partition in range(3):
        assert changelog(tmp_path, partition) in flushed
        assert changelog(tmp_path, partition).rsplit("/", 1)[0] in flushed
    assert set(disk.kinds()) == {"fsync"}


def test_what_waits_for_the_flush_runs_after_it_and_never_after_a_failed_one(
    tmp_path, monkeypatch
):
    """A Spark task reports its committed event time to the driver through
    ``after_flush``: never before the changelog that records it is durable."""
    disk = Disk(monkeypatch)
    said: list[str] = []
    fg.after_flush(lambda: said.append("outside"))  # no group: at once
    assert said == ["outside"]
    with fg.flush_group():
        for partition in range(3):
            commit(tmp_path, partition).close()
            fg.after_flush(lambda p=partition: said.append(f"{p} after {disk.kinds()}"))
        assert said == ["outside"]
    assert said == ["outside"] + [f"{p} after ['syncfs']" for p in range(3)]

    Disk(monkeypatch, fail_syncfs=True)
    said.clear()
    with pytest.raises(OSError, match="syncfs failed"):
        with fg.flush_group():
            for partition in range(3, 6):
                commit(tmp_path, partition).close()
                fg.after_flush(lambda: said.append("reported"))
    assert said == []


def test_what_waits_for_the_flush_together_goes_in_one_call_per_key(tmp_path, monkeypatch):
    """A Spark task that commits many partitions reports them to the driver in one
    request: ``after_flush_together`` hands one call every item of its key, after
    the flush, in order; another key gets its own call; outside a group, at once;
    after a failed flush, never."""
    disk = Disk(monkeypatch)
    calls: list[tuple[str, list[int], list[str]]] = []

    def sender(name):
        return lambda items: calls.append((name, list(items), disk.kinds()))

    fg.after_flush_together("a", 0, sender("alone"))
    assert calls == [("alone", [0], [])]
    calls.clear()
    with fg.flush_group():
        for partition in range(5):
            commit(tmp_path, partition).close()
            key = "a" if partition != 3 else "b"
            fg.after_flush_together(key, partition, sender(f"{key}{partition}"))
        assert calls == []
    assert calls == [("a0", [0, 1, 2, 4], ["syncfs"]), ("b3", [3], ["syncfs"])]

    Disk(monkeypatch, fail_syncfs=True)
    calls.clear()
    with pytest.raises(OSError, match="syncfs failed"):
        with fg.flush_group():
            for partition in range(5, 8):
                commit(tmp_path, partition).close()
                fg.after_flush_together("a", partition, sender("a"))
    assert calls == []


def test_a_group_closed_from_another_thread_leaves_neither_thread_in_a_stale_group(
    tmp_path, monkeypatch
):
    """A task's generator holds its group across its yields; the garbage
    collector may close an abandoned one from any thread. The closing thread's own
    group must keep deferring its calls until its writes are flushed, and the
    thread that ran the generator must not stay in the dead group (its later
    writes never flushed, its reports never sent)."""
    disk = Disk(monkeypatch)
    said: list[str] = []

    def task():
        with fg.flush_group():
            yield

    abandoned = task()
    next(abandoned)  # this thread is now inside the task's group

    def other_thread() -> None:
        with fg.flush_group():
            commit(tmp_path, 0).close()
            abandoned.close()  # as a garbage collection in this thread would
            fg.after_flush(lambda: said.append(f"other after {disk.kinds()}"))
            said.append("other's block ended")

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert said == ["other's block ended", "other after ['syncfs']"]

    fg.after_flush(lambda: said.append("here"))  # no group here any more: at once
    assert said[-1] == "here"
    disk.events.clear()
    with fg.flush_group():  # a group of its own again, flushed at its end
        commit(tmp_path, 1).close()
        fg.after_flush(lambda: said.append(f"mine after {disk.kinds()}"))
        assert disk.events == []
    assert said[-1] == "mine after ['syncfs']"


def test_an_attempt_that_finds_its_name_taken_flushes_the_winners_file_before_it_adopts_it(
    tmp_path, monkeypatch
):
    """The winner of a version may publish its changelog inside its flush group,
    durable only at the group's end; the loser reads and adopts that changelog,
    and its task's output then counts. So the loser makes the file and its name
    durable itself: at once outside a group, else before its group's end."""
    storage = open_filesystem(f"file://{tmp_path}/remote")
    disk = Disk(monkeypatch)
    with fg.flush_group():  # the winner's group, not ended yet
        assert storage.write_exclusive("op/0/1.changelog", b"winner")
        taken = {path for _, path in disk.events}
        assert str(tmp_path / "remote/op/0/1.changelog") not in taken

        def loser() -> None:  # another attempt, outside any group
            assert not storage.write_exclusive("op/0/1.changelog", b"loser")

        thread = threading.Thread(target=loser)
        thread.start()
        thread.join()
        flushed = [path for kind, path in disk.events if kind == "fsync"]
        assert str(tmp_path / "remote/op/0/1.changelog") in flushed
        assert str(tmp_path / "remote/op/0") in flushed
    assert (tmp_path / "remote/op/0/1.changelog").read_bytes() == b"winner"

    disk.events.clear()
    with fg.flush_group():  # a loser inside its own group: flushed at its end
        assert not storage.write_exclusive("op/0/1.changelog", b"loser")
        assert disk.events == []
    flushed = [path for _, path in disk.events]
    assert str(tmp_path / "remote/op/0/1.changelog") in flushed
    assert str(tmp_path / "remote/op/0") in flushed


@pytest.mark.parametrize("files", [1, 6])  # path by path, and by syncfs
def test_a_path_removed_before_the_groups_end_has_nothing_to_flush(tmp_path, monkeypatch, files):
    """A name another writer published and this group adopted may be removed
    before the group ends (its lineage abandoned, the checkpoint reset): gone, it
    has nothing to make durable, and the other paths are still flushed."""
    storage = open_filesystem(f"file://{tmp_path}/remote")
    for i in range(files):
        storage.write_atomic(f"op/{i}/x", b"old")  # the folders exist
    disk = Disk(monkeypatch)
    with fg.flush_group():
        for i in range(files):
            storage.write_atomic(f"op/{i}/x", b"data")
        os.unlink(tmp_path / "remote/op/0/x")
    if files == 1:  # the file is gone; its folder is still flushed
        assert disk.events == [("fsync", str(tmp_path / "remote/op/0"))]
    else:
        assert disk.kinds() == ["syncfs"]


def test_a_failing_call_after_the_flush_neither_drops_the_others_nor_hides_the_blocks_error(
    tmp_path, monkeypatch
):
    """After a flush the group runs every partition's snapshot and report: one
    that raises (a snapshot upload refused) must not drop the other partitions'
    reports, and a block's own error stays the one raised."""
    Disk(monkeypatch)
    said: list[str] = []

    def refused() -> None:
        raise OSError("snapshot upload refused")

    with pytest.raises(OSError, match="snapshot upload refused"):
        with fg.flush_group():
            commit(tmp_path, 0).close()
            fg.after_flush(refused)
            fg.after_flush(lambda: said.append("reported 0"))
    assert said == ["reported 0"]

    with pytest.raises(KeyError, match="the task's own error"):
        with fg.flush_group():
            commit(tmp_path, 1).close()
            fg.after_flush(refused)
            fg.after_flush(lambda: said.append("reported 1"))
            raise KeyError("the task's own error")
    assert said == ["reported 0", "reported 1"]
