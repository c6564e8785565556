"""Restores in bounded memory (invariant 5): changelogs and snapshot packs of any size
are read a share at a time, still checked end to end, and a replay cut short is
never used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sessionstore import CorruptChangelogError, StateStoreProvider, StoreSpec
from sessionstore.checkpoint.records import changelog as changelog_module
from sessionstore.checkpoint.records import snapshot as snapshot_module
from sessionstore.checkpoint.records.layout import changelog_name, content_name
from sessionstore.checkpoint.records.snapshot import CorruptSnapshotError, read_manifest
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.engine.db import Database

SPECS = [StoreSpec("sessions", "session", 10**12)]


def provider(location, local, **kw):
    uri, options = location
    return StateStoreProvider(uri, "op", 0, SPECS, str(local), storage_options=options, **kw)


def rows(version, n, size=8):
    """Version ``version``'s sessions: ``n`` keys, values of ``size`` bytes."""
    return [(f"k{version}-{i:07d}", version, version + 1, b"%0*d" % (size, i)) for i in range(n)]


def commit(p, version, n, size=8):
    h = p.get_store(version)
    h["sessions"].put_many(rows(version + 1, n, size))
    assert h.commit() == version + 1


def sessions(p, version):
    h = p.get_store(version)
    out = sorted((w.key, w.start, v) for w, v in h["sessions"].fetch_range(None, None))
    h.abort()
    return out


def model(counts):
    """The sessions after committing ``counts[v]`` sessions at each version v+1."""
    return sorted(
        (k, s, v) for version, n in enumerate(counts, 1) for k, s, _, v in rows(version, n)
    )


def leftovers(local):
    """Files a restore or a catch-up left beside the partition's folder."""
    folder = os.path.join(local, "op")
    return sorted(n for n in os.listdir(folder) if ".restore-" in n)


def test_large_changelogs_restore_streamed_on_every_store(checkpoint_location, tmp_path):
    """Changelogs above INLINE_BYTES are read from a local file (in place on a
    local store, downloaded from S3 and GCS) and applied in several writes: the
    restored state is the model's, by a restore and by a catch-up, and no copy is
    left behind."""
    old = changelog_module.INLINE_BYTES, changelog_module.APPLY_BYTES
    changelog_module.INLINE_BYTES, changelog_module.APPLY_BYTES = 2048, 4096
    try:
        writer = provider(checkpoint_location, tmp_path / "w")
        for v, n in enumerate([300, 400, 5, 500]):
            commit(writer, v, n)
        behind = provider(checkpoint_location, tmp_path / "behind")
        assert sessions(behind, 1) == model([300])
        writer.close()
        fresh = provider(checkpoint_location, tmp_path / "fresh")
        assert sessions(fresh, 4) == model([300, 400, 5, 500])
        assert fresh._loader.kind == "restore"
        assert sessions(behind, 4) == model([300, 400, 5, 500])  # caught up
        assert behind._loader.kind == "replay"
        assert sessions(behind, 3) == model([300, 400, 5])  # its copy is whole and owned
        for p, local in ((fresh, tmp_path / "fresh"), (behind, tmp_path / "behind")):
            p.close()
            assert leftovers(local) == []
    finally:
        changelog_module.INLINE_BYTES, changelog_module.APPLY_BYTES = old


@pytest.mark.parametrize(
    "damage,reason",
    [
        (lambda d: d[: len(d) - 100], "no footer"),
        (lambda d: d[:3000] + bytes([d[3000] ^ 1]) + d[3001:], "checksum mismatch"),
    ],
)
def test_a_damaged_large_changelog_is_named_and_nothing_is_applied(
    checkpoint_location, tmp_path, damage, reason
):
    """A truncated or altered changelog read a share at a time is refused, naming
    the file and the version: a restore leaves no database and no copy, a catch-up
    leaves the local copy at its version, untouched."""
    old = changelog_module.INLINE_BYTES, changelog_module.APPLY_BYTES
    changelog_module.INLINE_BYTES, changelog_module.APPLY_BYTES = 2048, 4096
    try:
        writer = provider(checkpoint_location, tmp_path / "w")
        commit(writer, 0, 50)
        behind = provider(checkpoint_location, tmp_path / "behind")
        assert sessions(behind, 1) == model([50])
        commit(writer, 1, 400)
        writer.close()
        remote = open_filesystem(*checkpoint_location).child("op/0")
        data = remote.read(changelog_name(2))
        assert len(data) > 4 * changelog_module.INLINE_BYTES
        remote.write_atomic(changelog_name(2), damage(data))
        named = f"{changelog_name(2)} (version 2) is corrupt: {reason}"
        fresh = provider(checkpoint_location, tmp_path / "fresh")
        with pytest.raises(
            CorruptChangelogError, match=named.replace("(", r"\(").replace(")", r"\)")
        ):
            fresh.get_store(2)
        assert not os.path.exists(tmp_path / "fresh" / "op" / "0" / "db")
        with pytest.raises(CorruptChangelogError, match=reason):
            behind.get_store(2)
        assert sessions(behind, 1) == model([50])
        for p, local in ((fresh, tmp_path / "fresh"), (behind, tmp_path / "behind")):
            p.close()
            assert leftovers(local) == []
    finally:
        changelog_module.INLINE_BYTES, changelog_module.APPLY_BYTES = old


def test_a_catch_up_cut_short_inside_a_changelog_is_never_used(tmp_path, monkeypatch):
    """A changelog applied in several writes onto a local copy that then fails part
    way (here the second write; in life a crash) leaves a copy holding some of its
    writes and the previous version's number: it must not be used as that version,
    nor as the next. A later load restores instead."""
    location = (f"file://{tmp_path}/remote", None)
    monkeypatch.setattr(changelog_module, "APPLY_BYTES", 2000)
    writer = provider(location, tmp_path / "w")
    commit(writer, 0, 20)
    behind = provider(location, tmp_path / "behind")
    assert sessions(behind, 1) == model([20])
    behind.close()
    commit(writer, 1, 300)
    writer.close()
    applied, apply = [], Database.apply

    def fails_second(db, buf):
        applied.append(buf)
        if len(applied) == 2:
            raise OSError("disk gone")
        apply(db, buf)

    monkeypatch.setattr(Database, "apply", fails_second)
    behind = provider(location, tmp_path / "behind")
    with pytest.raises(OSError, match="disk gone"):
        behind.get_store(2)
    behind.close()
    monkeypatch.setattr(Database, "apply", apply)
    again = provider(location, tmp_path / "behind")
    assert sessions(again, 1) == model([20])
    assert sessions(again, 2) == model([20, 300])
    again.close()


def test_a_damaged_or_truncated_pack_is_named(tmp_path):
    """The pack is read to a local file and split there: a pack cut short or
    altered is refused, naming the snapshot, and the restore goes around it."""
    location = (f"file://{tmp_path}/remote", None)
    writer = provider(location, tmp_path / "w", snapshot_interval=1)
    commit(writer, 0, 30)
    writer.do_maintenance()
    commit(writer, 1, 30)
    writer.close()
    remote = open_filesystem(location[0]).child("op/0")
    pack = content_name(read_manifest(remote, 1)["pack"]["sha256"])
    good = remote.read(pack)
    for bad, reason in ((good[:-10], "the pack does not match"), (b"x" + good[1:], "the pack")):
        remote.write_atomic(pack, bad)
        with pytest.raises(CorruptSnapshotError, match=f"snapshot/1.manifest.*{reason}"):
            snapshot_module.download_snapshot(remote, 1, str(tmp_path / "t"))
        assert [n for n in os.listdir(tmp_path / "t") if n.startswith(".pack")] == []
        p = provider(location, tmp_path / f"r{len(bad)}")
        assert sessions(p, 2) == model([30, 30])  # from version 0 and the changelogs
        assert p.repairs
        p.close()


#: A child process restores and reports its peak RSS over its RSS before.
CHILD = textwrap.dedent(
    """
    import json, sys
    from sessionstore import StateStoreProvider, StoreSpec

    def status(field):
        with open("/proc/self/status") as f:
            return int(dict(line.split(":", 1) for line in f)[field].split()[0]) / 1024

    uri, local, version, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    before = status("VmRSS")
    p = StateStoreProvider(
        uri, "op", 0, [StoreSpec("sessions", "session", 10**12)], local, memory_max_mb=budget
    )
    h = p.get_store(version)
    n = sum(1 for _ in h["sessions"].fetch_range(None, None))
    h.abort()
    p.close()
    print(json.dumps({"growth": status("VmHWM") - before, "sessions": n}))
    """
)
BUDGET_MB = 16
#: The fixed overhead a restore may add to the budget, generously: buffers of a
#: few MiB each (a share of a changelog, a chunk per download thread).
FIXED_MB = 80


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["changelog", "pack"])
def test_restore_peak_rss_stays_within_budget_plus_fixed(tmp_path, monkeypatch, kind):
    """Invariant 5, measured: a child process restores a partition whose
    changelog (or snapshot pack) holds about 60 MiB, under a 16 MiB budget; its RSS
    grows by less than the budget plus a fixed 80 MiB. Reading either whole costs
    it twice that size at least."""
    location = (f"file://{tmp_path}/remote", None)
    if kind == "pack":  # every file of the snapshot in its pack
        monkeypatch.setattr(snapshot_module, "PACK_THRESHOLD", 1 << 40)
    interval = 1 if kind == "pack" else 10**6
    writer = provider(location, tmp_path / "w", snapshot_interval=interval, memory_max_mb=64)
    h = writer.get_store(0)
    h["sessions"].put_many(
        (f"k{i:07d}", i, i + 1, os.urandom(500)) for i in range(120_000)
    )  # incompressible
    h.commit()
    writer.do_maintenance()
    writer.close()
    remote = open_filesystem(location[0]).child("op/0")
    if kind == "pack":
        size = read_manifest(remote, 1)["pack"]["size"]
    else:
        size = len(remote.read(changelog_name(1)))
    assert size > 60 * 2**20
    out = subprocess.run(
        [sys.executable, "-c", CHILD, location[0], str(tmp_path / "r"), "1", str(BUDGET_MB)],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["sessions"] == 120_000
    assert got["growth"] < BUDGET_MB + FIXED_MB, got
