"""``sessionstore stats``: per operator and micro-batch, over partitions, on a
file:// URI, the S3 endpoint and a relative path; bad arguments exit 2."""

from __future__ import annotations

import json

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.records.metrics import STATS_FIELDS
from tests.tools.test_cli import run, storage_flags

SPECS = [StoreSpec("sessions", "session", 10**9)]


def write(uri, options, local):
    """Operator "op", 2 partitions, 3 batches with known writes and notes.

    Partition 0: batch 0 puts a, b (emits 0); batch 1 puts c and removes a (emits
    2); batch 2 puts d. Partition 1: batch 0 gets a single late row, dropped; batch
    1 puts x; batch 2 nothing. A second operator "other" has one batch."""
    plan = {
        0: [(["a", "b"], [], 0, 0), (["c"], ["a"], 0, 2), (["d"], [], 0, 0)],
        1: [([], [], 1, 0), (["x"], [], 0, 0), ([], [], 0, 0)],
    }
    for partition, batches in plan.items():
        p = StateStoreProvider(
            uri, "op", partition, SPECS, str(local), snapshot_interval=100, storage_options=options
        )
        for version, (puts, removes, late, emitted) in enumerate(batches):
            h = p.get_store(version)
            for key in puts:
                h["sessions"].put(key, 0, 1, {"n": 1})
            for key in removes:
                h["sessions"].remove(key, 0, 1)
            h.note(late_dropped=late, emitted=emitted)
            h.commit()
        p.close()
    p = StateStoreProvider(uri, "other", 0, SPECS, str(local), storage_options=options)
    p.get_store(0).commit()
    p.close()


EXPECTED = [  # batch, rows_total, rows_updated, rows_removed, late_dropped, emitted
    (0, 2, 2, 0, 1, 0),
    (1, 3, 2, 1, 0, 2),
    (2, 4, 1, 0, 0, 0),
]


def check_json(stdout, batches=(0, 1, 2)):
    rows = [json.loads(line) for line in stdout.splitlines()]
    assert all(tuple(r) == STATS_FIELDS for r in rows)
    assert [(r["operator"], r["batch"]) for r in rows] == [("op", b) for b in batches]
    for r in rows:
        want = next(e for e in EXPECTED if e[0] == r["batch"])
        got = (r["batch"], r["rows_total"], r["rows_updated"], r["rows_removed"])
        assert got + (r["late_dropped"], r["emitted"]) == want
        assert r["partitions"] == 2
        assert r["loads"] == ({"restore": 2} if r["batch"] == 0 else {"warm": 2})
        assert r["snapshot_lag_max"] == r["batch"] + 1  # no snapshot uploaded yet
        assert r["uploaded_bytes"] > 0 and r["memory_bytes_max"] > 0
        assert r["load_ms_max"] >= 0
        if r["batch"] == 2:  # the newest commit's time is in no changelog yet
            assert r["commit_ms_p50"] is None and r["commit_ms_max"] is None
        else:
            assert 0 < r["commit_ms_p50"] <= r["commit_ms_max"]
    return rows


def test_stats_json_and_table(checkpoint_location, tmp_path):
    uri, options = checkpoint_location
    write(uri, options, tmp_path / "local")
    flags = storage_flags(options, tmp_path)
    out = run("stats", uri, "--operator", "op", "--format", "json", *flags)
    assert out.returncode == 0, out.stderr
    check_json(out.stdout)
    out = run("stats", uri, "--operator", "op", "--last", "2", "--format", "json", *flags)
    assert out.returncode == 0, out.stderr
    check_json(out.stdout, (1, 2))
    out = run("stats", uri, "--format", "json", *flags)  # every operator
    assert [json.loads(x)["operator"] for x in out.stdout.splitlines()] == ["op"] * 3 + ["other"]
    out = run("stats", uri, "--operator", "op", *flags)
    assert out.returncode == 0, out.stderr
    assert "commit ms p50" in out.stdout and "state rows" in out.stdout
    assert "trend over the batches shown" in out.stdout
    assert any(c in out.stdout for c in "▁▂▃▄▅▆▇█")


def test_stats_on_a_relative_path(tmp_path):
    write(str(tmp_path / "ckpt"), None, tmp_path / "local")
    out = run("stats", "ckpt", "--operator", "op", "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    check_json(out.stdout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--last", "0"], "--last"),
        (["--last", "x"], "--last"),
        (["--format", "csv"], "--format"),
        (["--operator", "nope"], "no operator 'nope'"),
    ],
)
def test_stats_bad_arguments_exit_2_with_one_line(tmp_path, args, message):
    write(str(tmp_path / "ckpt"), None, tmp_path / "local")
    out = run("stats", str(tmp_path / "ckpt"), *args)
    assert out.returncode == 2
    assert out.stdout == "" and len(out.stderr.strip().splitlines()) == 1
    assert message in out.stderr


def test_stats_refuses_local_databases_and_empty_places(tmp_path):
    write(str(tmp_path / "ckpt"), None, tmp_path / "local")
    out = run("stats", str(tmp_path / "local"))
    assert out.returncode == 2 and "checkpoint root" in out.stderr
    (tmp_path / "empty").mkdir()
    out = run("stats", str(tmp_path / "empty"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
