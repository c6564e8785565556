"""The sessionstore CLI, run as a subprocess on checkpoints written by the provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sessionstore import StateStoreProvider, StoreSpec

SPECS = [StoreSpec("sessions", "session", 10**9), StoreSpec("plans", "versioned", 10**9)]
CLI = [sys.executable, "-m", "sessionstore.cli"]


@pytest.fixture
def checkpoint(checkpoint_location, tmp_path):
    uri, options = checkpoint_location
    for partition in (0, 1):
        p = StateStoreProvider(
            uri, "op", partition, SPECS, tmp_path / "local", snapshot_interval=2,
            storage_options=options,
        )  # fmt: skip
        for v in range(3):
            h = p.get_store(v)
            h["sessions"].put(f"u{partition}", v, v + 5, {"n": v})
            h["plans"].put(f"u{partition}", f"plan{v}", v * 10)
            h.commit()
        p.do_maintenance()
        p.close()
    flags = [f"--storage-option={k}={v}" for k, v in (options or {}).items()]
    return uri, flags


def run(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_ls(checkpoint):
    uri, flags = checkpoint
    out = run("ls", uri, *flags)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "│ op" in line]
    assert len(lines) == 2
    cells = [c.strip() for c in lines[1].split("│")[1:-1]]
    assert cells[:5] == ["op", "1", "3", "1..3", "2"]
    assert "sessions (session" in out.stdout and "plans (versioned" in out.stdout


def test_dump_jsonl_exact(checkpoint):
    uri, flags = checkpoint
    out = run("dump", uri, "--operator", "op", "--store", "sessions", "--partition", "1", *flags)
    assert out.returncode == 0, out.stderr
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"partition": 1, "key": "u1", "start": v, "end": v + 5, "value": {"n": v}} for v in range(3)
    ]
    out = run(
        "dump",
        uri,
        "--operator",
        "op",
        "--store",
        "plans",
        "--version",
        "2",
        "--limit",
        "1",
        *flags,
    )
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"partition": 0, "key": "u0", "value": "plan1", "valid_from": 10, "valid_to": None}
    ]


def test_get_as_of(checkpoint):
    uri, flags = checkpoint
    out = run(
        "get", uri, "--operator", "op", "--store", "plans", "--key", "u1", "--as-of", "15", *flags
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "partition": 1, "key": "u1", "value": "plan1", "valid_from": 10, "valid_to": 20,
    }  # fmt: skip


@pytest.mark.parametrize(
    "args,message",
    [
        (["dump", "{uri}", "--operator", "op", "--store", "nope"], "has no store 'nope'"),
        (["dump", "{uri}", "--operator", "nobody", "--store", "plans"], "no operator 'nobody'"),
        (
            ["get", "{uri}", "--operator", "op", "--store", "plans", "--key", "zz"],
            "key 'zz' not found",
        ),
        (["ls", "ftp://host/x"], "unsupported storage URI scheme 'ftp'"),
        (["dump", "{uri}", "--operator", "op"], "Missing option '--store'"),
        (["dump", "{uri}", "--operator", "op", "--store", "plans", "--version", "9"], "version 9"),
    ],
)
def test_errors_are_one_line_and_exit_2(checkpoint, args, message):
    uri, flags = checkpoint
    out = run(*[a.format(uri=uri) for a in args], *flags)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "sessionstore")
    out = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "dump" in out.stdout and "ls" in out.stdout


def test_verify_passes_then_names_each_problem(checkpoint, tmp_path):
    uri, flags = checkpoint
    out = run("verify", uri, *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verified 2 partitions of 1 operators: 0 problems" in out.stdout
    if not uri.startswith("file://"):
        return
    root = uri[len("file://") :]
    with open(f"{root}/op/0/changelog/3.changelog", "r+b") as f:
        f.seek(30)
        byte = f.read(1)
        f.seek(30)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.remove(f"{root}/op/1/snapshot/2.manifest")  # without it, versions 1-3 need changelog 1
    os.remove(f"{root}/op/1/changelog/1.changelog")
    out = run("verify", uri, *flags)
    assert out.returncode == 1
    assert "changelog op/0/changelog/3 (version 3) is corrupt: checksum mismatch" in out.stdout
    assert "op/1: changelog of version 1 is missing (gap after 0)" in out.stdout
    assert "2 problems" in out.stdout


def test_restore_materialises_a_local_database(checkpoint, tmp_path):
    from sessionstore import StateDB

    uri, flags = checkpoint
    target = tmp_path / "restored"
    out = run(
        "restore",
        uri,
        "--operator",
        "op",
        "--partition",
        "1",
        "--version",
        "2",
        "--to",
        str(target),
        *flags,
    )
    assert out.returncode == 0, out.stderr
    assert "version 2" in out.stdout
    with StateDB.open(target) as db:
        store = db.session_store("sessions", 10**9)
        assert [w.start for w, _ in store.fetch("u1")] == [0, 1]
    again = run("restore", uri, "--operator", "op", "--partition", "1", "--to", str(target), *flags)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_dump_csv_and_parquet(checkpoint, tmp_path):
    import csv

    import pyarrow.parquet as pq

    uri, flags = checkpoint
    args = ["dump", uri, "--operator", "op", "--store", "sessions", "--partition", "0", *flags]
    out = run(*args, "--format", "csv")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(out.stdout.splitlines()))
    assert rows[0] == {"partition": "0", "key": "u0", "start": "0", "end": "5", "value": '{"n": 0}'}
    target = tmp_path / "sessions.parquet"
    out = run(*args, "--format", "parquet", "--output", str(target))
    assert out.returncode == 0 and "wrote 3 rows" in out.stdout
    assert pq.read_table(target).to_pylist()[2] == {
        "partition": 0, "key": "u0", "start": 2, "end": 7, "value": '{"n": 2}',
    }  # fmt: skip
    out = run(*args, "--format", "parquet")
    assert out.returncode == 2 and "--format parquet needs --output FILE" in out.stderr
