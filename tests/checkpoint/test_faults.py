"""Kill -9 a writer at each step of a commit: reloading gives exactly N-1 or N, on a
local folder, the S3 endpoint and the GCS endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.records.changelog import decode_changelog

SPECS = [StoreSpec("sessions", "session", 10**9), StoreSpec("plans", "versioned", 10**9)]
KEYS_PER_VERSION = 40

WRITER = textwrap.dedent(
    """
    import json, sys
    from sessionstore import StateStoreProvider, StoreSpec
    from tests.faults import KillAt

    uri, local, step, versions = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    options = json.loads(sys.argv[5])
    specs = [StoreSpec("sessions", "session", 10**9), StoreSpec("plans", "versioned", 10**9)]
    # the last commit dies at this step
    p = StateStoreProvider(
        uri, "op", 0, specs, local, snapshot_interval=2, storage_options=options,
        commit_observer=KillAt(step, versions),
    )
    for v in range(versions):
        h = p.get_store(v)
        for j in range(40):
            h["sessions"].put(f"u{j}", v, v, [v, j])
            h["plans"].put(f"u{j}", f"plan-{v}-{j}", v)
        h.commit()
        if v == 1:
            p.do_maintenance()  # snapshot 2 exists before the crash
    print("survived", flush=True)
    """
)


def check_state(provider, version):
    """Every key as the writer left it after ``version`` commits, nothing later."""
    h = provider.get_store(version)
    sessions, plans = h["sessions"], h["plans"]
    for j in range(KEYS_PER_VERSION):
        assert [(w.start, v) for w, v in sessions.fetch(f"u{j}")] == [
            (v, [v, j]) for v in range(version)
        ]
        latest = plans.get(f"u{j}")
        assert (latest.value, latest.timestamp) == (f"plan-{version - 1}-{j}", version - 1)
        assert len(plans.get_versions(f"u{j}")) == version
    h.abort()


@pytest.mark.slow
@pytest.mark.parametrize(
    "step,survivor",
    [("before_upload", 3), ("mid_upload", 3), ("after_upload", 4), ("after_apply", 4)],
)
def test_kill_during_commit(checkpoint_location, tmp_path, step, survivor):
    uri, options = checkpoint_location
    local = str(tmp_path / "writer")
    run = subprocess.run(
        [sys.executable, "-c", WRITER, uri, local, step, "4", json.dumps(options or {})],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],  # the writer imports tests.faults
    )
    assert run.returncode == -9, run.stderr  # killed, never reached "survived"
    assert "survived" not in run.stdout
    # the crashed writer's own directory (its RocksDB lock died with it) ...
    again = StateStoreProvider(uri, "op", 0, SPECS, local, storage_options=options)
    assert again.latest_version() == survivor
    check_state(again, survivor)
    check_state(again, survivor - 1)
    again.close()
    # ... and a new executor with nothing local
    fresh = StateStoreProvider(uri, "op", 0, SPECS, tmp_path / "fresh", storage_options=options)
    check_state(fresh, survivor)
    # the next batch commits normally on top
    h = fresh.get_store(survivor)
    h["sessions"].put("after", 1, 1, 1)
    assert h.commit() == survivor + 1
    fresh.close()


KILLED_BEFORE_COMMIT = textwrap.dedent(
    """
    import os, signal, sys
    from sessionstore import StateStoreProvider, StoreSpec

    uri, local = sys.argv[1], sys.argv[2]
    specs = [StoreSpec("sessions", "session", 3_600_000, segment_interval_ms=60_000)]
    p = StateStoreProvider(uri, "op", 0, specs, local)
    h = p.get_store(1)
    # a session in a new segment: RocksDB creates its family at once, in no batch
    h["sessions"].put("u", 10_000_000, 10_000_100, "second")
    assert "sessions.166" in h.db.column_families()
    os.kill(os.getpid(), signal.SIGKILL)  # before the commit
    """
)


def test_a_family_created_by_an_attempt_killed_before_its_commit_restores_anywhere(tmp_path):
    """A killed attempt leaves the family it created in its local copy; the retry
    that commits from that copy finds it there, so its changelog records no
    creation. A restore anywhere else must still build the committed state (it
    failed with "column name `sessions.166` does not exist")."""
    uri, local = f"file://{tmp_path}/remote", str(tmp_path / "writer")
    specs = [StoreSpec("sessions", "session", 3_600_000, segment_interval_ms=60_000)]
    first = StateStoreProvider(uri, "op", 0, specs, local)
    h = first.get_store(0)
    h["sessions"].put("u", 1_000, 2_000, "first")
    assert h.commit() == 1
    first.close()
    run = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_COMMIT, uri, local],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == -9, run.stderr
    retry = StateStoreProvider(uri, "op", 0, specs, local)  # the same executor's copy
    h = retry.get_store(1)
    assert "sessions.166" in h.db.column_families()  # the killed attempt's
    h["sessions"].put("u", 10_000_000, 10_000_100, "second")
    assert h.commit() == 2
    retry.close()
    header, writes = decode_changelog(
        (tmp_path / "remote" / "op" / "0" / "changelog" / "0" / "2.changelog").read_bytes(), "2"
    )
    assert "sessions.166" in writes.families and "sessions.166" not in writes.created
    for where in ("fresh", "fresh-again"):  # another executor, with nothing local
        fresh = StateStoreProvider(uri, "op", 0, specs, str(tmp_path / where))
        h = fresh.get_store(2)
        assert [(w.start, w.end, v) for w, v in h["sessions"].fetch("u")] == [
            (10_000_000, 10_000_100, "second")  # the first expired: retention 1 h
        ]
        h.abort()
        fresh.close()


NEW_SEGMENT = [StoreSpec("sessions", "session", 3_600_000_000, segment_interval_ms=60_000)]


def _committed_once(uri: str, local: str) -> None:
    first = StateStoreProvider(uri, "op", 0, NEW_SEGMENT, local)
    h = first.get_store(0)
    h["sessions"].put("u", 1_000, 2_000, "first")
    assert h.commit() == 1
    first.close()


def _aborted_in_a_new_segment(uri: str, local: str) -> None:
    """An attempt that created segment 166's family, then failed: a state server
    closes the provider of a task that raised, and the record of the families it
    created goes with it."""
    p = StateStoreProvider(uri, "op", 0, NEW_SEGMENT, local)
    h = p.get_store(1)
    h["sessions"].put("v", 10_000_000, 10_000_100, "attempt")
    h.abort()
    p.close()


def test_a_family_created_by_a_failed_attempt_restores_after_a_handover(tmp_path):
    """No crash: the failed attempt's provider is closed (a handover), and the
    retry that reopens the same local copy writes into the family it finds."""
    uri, local = f"file://{tmp_path}/remote", str(tmp_path / "writer")
    _committed_once(uri, local)
    _aborted_in_a_new_segment(uri, local)
    retry = StateStoreProvider(uri, "op", 0, NEW_SEGMENT, local)
    h = retry.get_store(1)
    h["sessions"].put("v", 10_000_000, 10_000_100, "retry")
    assert h.commit() == 2
    retry.close()
    fresh = StateStoreProvider(uri, "op", 0, NEW_SEGMENT, str(tmp_path / "fresh"))
    h = fresh.get_store(2)
    assert [(w.start, v) for k in "uv" for w, v in h["sessions"].fetch(k)] == [
        (1_000, "first"), (10_000_000, "retry")
    ]  # fmt: skip
    h.abort()
    fresh.close()


def test_a_loser_adopts_a_winner_that_wrote_into_a_family_its_copy_lacks(tmp_path):
    """Two attempts of version 2: the winner commits from a copy holding a family
    an earlier failed attempt created (unrecorded in its changelog); the loser,
    on a fresh copy, adopts that changelog and must end with the winner's state."""
    uri = f"file://{tmp_path}/remote"
    _committed_once(uri, str(tmp_path / "x"))
    _aborted_in_a_new_segment(uri, str(tmp_path / "x"))
    loser = StateStoreProvider(uri, "op", 0, NEW_SEGMENT, str(tmp_path / "y"))
    hy = loser.get_store(1)
    hy["sessions"].put("w", 3_000, 4_000, "loser")
    winner = StateStoreProvider(uri, "op", 0, NEW_SEGMENT, str(tmp_path / "x"))
    hx = winner.get_store(1)
    hx["sessions"].put("v", 10_000_000, 10_000_100, "winner")
    assert hx.commit() == 2
    winner.close()
    assert hy.commit() == 2  # adopted the winner's commit
    h = loser.get_store(2)
    assert [(k, w.start, v) for k in "uvw" for w, v in h["sessions"].fetch(k)] == [
        ("u", 1_000, "first"), ("v", 10_000_000, "winner")
    ]  # fmt: skip
    h.abort()
    loser.close()
