"""The sessionstore CLI on checkpoints written by the provider, run in the test's
process (:func:`tests.tools.cli_runner.run_cli`) but where a test's claim needs a
real process: the installed script, and the progress display on a terminal."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.records.layout import changelog_name
from tests.packaging import checkout_pythonpath
from tests.tools.cli_runner import run_cli

SPECS = [StoreSpec("sessions", "session", 10**9), StoreSpec("plans", "versioned", 10**9)]
CLI = [sys.executable, "-m", "sessionstore.tools.cli"]


def write_checkpoint(uri, options, local, retain_versions=100):
    """Partitions 0 and 1 of operator "op" at version 3, with a snapshot of version 2."""
    for partition in (0, 1):
        p = StateStoreProvider(
            uri, "op", partition, SPECS, local, snapshot_interval=2,
            retain_versions=retain_versions, storage_options=options,
        )  # fmt: skip
        for v in range(3):
            h = p.get_store(v)
            h["sessions"].put(f"u{partition}", v, v + 5, {"n": v})
            h["plans"].put(f"u{partition}", f"plan{v}", v * 10)
            h.commit()
        p.do_maintenance()
        p.close()


@pytest.fixture(scope="module", params=["file", "s3", "gs"])
def checkpoint(request, tmp_path_factory):
    """A checkpoint (:func:`write_checkpoint`) in a local folder, on the S3 and on
    the GCS endpoint, and the CLI flags to reach it: written once per location for
    the module's tests, which only read it (a test that changes a checkpoint
    writes its own, :func:`fresh_checkpoint`)."""
    from tests.object_stores import new_bucket, new_gcs_bucket

    tmp = tmp_path_factory.mktemp(f"checkpoint-{request.param}")
    if request.param == "file":
        uri, options = f"file://{tmp}/remote", None
    elif request.param == "s3":
        server = request.getfixturevalue("s3_server")
        uri, options = f"s3://{new_bucket(server)}/checkpoints", dict(server)
    else:
        server = request.getfixturevalue("gcs_server")
        uri, options = f"gs://{new_gcs_bucket(server)}/checkpoints", dict(server)
    write_checkpoint(uri, options, tmp / "local")
    return uri, storage_flags(options, tmp)


@pytest.fixture
def fresh_checkpoint(checkpoint_location, tmp_path):
    """:func:`checkpoint`'s, written for one test."""
    uri, options = checkpoint_location
    write_checkpoint(uri, options, tmp_path / "local")
    return uri, storage_flags(options, tmp_path)


def storage_flags(options, folder) -> list[str]:
    """CLI flags for storage ``options``: the credentials in a storage options file
    (mode 0600) in ``folder``, as docs/cli.md advises, the rest as --storage-option."""
    from sessionstore.checkpoint.storage.filesystem import is_secret_option

    options = options or {}
    flags = [f"--storage-option={k}={v}" for k, v in options.items() if not is_secret_option(k)]
    secrets = {k: v for k, v in options.items() if is_secret_option(k)}
    if secrets:
        path = os.path.join(folder, f"storage-{uuid.uuid4().hex}.options")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in secrets.items())
        flags += ["--storage-options-file", path]
    return flags


#: The CLI in this process, as a subprocess would give it (the tests' usual way).
run = run_cli


def spawn(*args, cwd=None, timeout=120):
    """The CLI in a subprocess (in ``cwd``, importing this checkout's package), for
    a test whose claim needs a real process."""
    env = {**os.environ, "PYTHONPATH": checkout_pythonpath()}
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def test_ls(checkpoint):
    uri, flags = checkpoint
    out = run("ls", uri, *flags)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "│ op" in line]
    assert len(lines) == 2
    cells = [c.strip() for c in lines[1].split("│")[1:-1]]
    assert cells[:5] == ["op", "1", "3", "1..3", "2"]
    assert "sessions (session" in out.stdout and "plans (versioned" in out.stdout


@pytest.mark.slow
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


def test_a_missing_gcs_bucket_is_one_line_naming_it_and_no_secret(gcs_server, tmp_path):
    token = "ya29.s3cr3t-t0k3n"
    options = {k: v for k, v in gcs_server.items() if k != "anonymous"}
    options["access_token"] = token
    flags = storage_flags(options, tmp_path)
    flags.append("--storage-option=credential_token_expiration=2099-01-01T00:00:00Z")
    for args in (["ls"], ["verify"], ["dump", "--operator", "op", "--store", "s"]):
        out = run(args[0], "gs://no-such-bucket/ckpt", *args[1:], *flags)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "gs://no-such-bucket/ckpt" in out.stderr and token not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_console_script_is_installed():
    from importlib.metadata import version

    # a subprocess: the claim is about the script pip installed
    script = os.path.join(os.path.dirname(sys.executable), "sessionstore")
    out = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "dump" in out.stdout and "ls" in out.stdout
    out = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert (
        out.returncode == 0
        and out.stdout.strip() == f"sessionstore, version {version('sessionstore')}"
    )


def test_verify_passes_then_names_each_problem(fresh_checkpoint, checkpoint_location):
    from sessionstore.checkpoint.storage.filesystem import open_filesystem

    uri, flags = fresh_checkpoint
    out = run("verify", uri, *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verified 2 partitions of 1 operators: 0 problems" in out.stdout
    root = open_filesystem(*checkpoint_location)
    data = bytearray(root.read(f"op/0/{changelog_name(3)}"))
    data[30] ^= 0xFF
    root.write_atomic(f"op/0/{changelog_name(3)}", bytes(data))
    root.delete("op/1/snapshot/2.manifest")  # without it, versions 1-3 need changelog 1
    root.delete(f"op/1/{changelog_name(1)}")
    out = run("verify", uri, *flags)
    assert out.returncode == 1
    # named by the path it is stored at
    assert f"changelog op/0/{changelog_name(3)} (version 3) is corrupt: checksum" in out.stdout
    assert "op/1: changelog of version 1 is missing (gap after 0)" in out.stdout
    assert "2 problems" in out.stdout


@pytest.mark.slow
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
    # an existing empty directory is the database's, as reported (not target/db)
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run("restore", uri, "--operator", "op", "--partition", "1", "--to", str(empty), *flags)
    assert out.returncode == 0, out.stderr
    assert f"to {empty}" in out.stdout and not (empty / "db").exists()
    with StateDB.open(empty) as db:
        store = db.session_store("sessions", 10**9)
        assert [w.start for w, _ in store.fetch("u1")] == [0, 1, 2]


def test_dump_csv_and_parquet(checkpoint, tmp_path):
    import csv

    import pyarrow.parquet as pq

    uri, flags = checkpoint
    args = ["dump", uri, "--operator", "op", "--store", "sessions", "--partition", "0", *flags]
    out = run(*args, "--format", "csv")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(out.stdout.splitlines()))
    assert rows[0] == {
        "partition": "0", "key": "u0", "start": "1970-01-01T00:00:00.000Z",
        "end": "1970-01-01T00:00:00.005Z", "value": '{"n": 0}',
    }  # fmt: skip
    out = run(*args, "--format", "csv", "--epoch-ms")
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


def test_table_and_csv_show_versioned_times_as_iso_utc_and_epoch_ms_keeps_integers(tmp_path):
    import csv

    uri = f"file://{tmp_path}/remote"
    provider = StateStoreProvider(uri, "op", 0, SPECS, tmp_path / "local")
    handle = provider.get_store(0)
    handle["plans"].put("u", "free", 1_700_000_000_000)
    handle["plans"].put("u", "pro", 1_700_000_060_123)
    handle.commit()
    provider.close()
    base = [uri, "--store", "plans"]
    out = run("dump", *base, "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert list(csv.reader(out.stdout.splitlines())) == [
        ["partition", "key", "value", "valid_from", "valid_to"],
        ["0", "u", "pro", "2023-11-14T22:14:20.123Z", ""],
        ["0", "u", "free", "2023-11-14T22:13:20.000Z", "2023-11-14T22:14:20.123Z"],
    ]
    out = run("get", *base, "--key", "u", "--as-of", "1700000000001", "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert list(csv.reader(out.stdout.splitlines()))[1] == [
        "0", "u", "free", "2023-11-14T22:13:20.000Z", "2023-11-14T22:14:20.123Z",
    ]  # fmt: skip
    out = run("get", *base, "--key", "u", "--format", "csv", "--epoch-ms")
    assert list(csv.reader(out.stdout.splitlines()))[1] == [
        "0", "u", "pro", "1700000060123", "",
    ]  # fmt: skip
    for command in (["dump", *base], ["get", *base, "--key", "u"]):
        out = run(*command, "--format", "table")
        assert out.returncode == 0, out.stderr
        cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.stdout.splitlines()]
        assert ["0", "u", "pro", "2023-11-14T22:14:20.123Z", "None"] in cells
        out = run(*command, "--format", "table", "--epoch-ms")
        cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.stdout.splitlines()]
        assert ["0", "u", "pro", "1700000060123", "None"] in cells
    # jsonl keeps the integers
    out = run("get", *base, "--key", "u")
    assert json.loads(out.stdout.splitlines()[0])["valid_from"] == 1_700_000_060_123


def test_ls_shows_stream_time_and_key_estimates(checkpoint):
    uri, flags = checkpoint
    out = run("ls", uri, *flags)
    assert out.returncode == 0, out.stderr
    # read from the newest changelog's header: sessions ended at 5, 6 and 7 ms; plans at 0..20
    assert out.stdout.count("sessions (session, retention 1,000,000,000 ms) stream time") == 2
    assert "stream time 1970-01-01T00:00:00.007Z ~3 keys" in out.stdout
    assert "plans (versioned, retention 1,000,000,000 ms) stream time 1970-01-01T00:00:00.020Z" in (
        out.stdout
    )


def dump_rows(*args):
    out = run("dump", *args)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.slow
def test_dump_filters_key_range_and_time(checkpoint):
    uri, flags = checkpoint
    base = [uri, "--store", "sessions", *flags]  # one operator: --operator may be left out
    assert [r["key"] for r in dump_rows(*base, "--key-from", "u1")] == ["u1"] * 3
    assert [r["key"] for r in dump_rows(*base, "--key-to", "u0")] == ["u0"] * 3
    assert dump_rows(*base, "--key-from", "u1", "--key-to", "u0") == []
    # sessions [v, v+5]: overlapping [6, 6] are v=1 and v=2; ending by 5 only v=0
    assert [(r["partition"], r["start"]) for r in dump_rows(*base, "--from-ts", "6", "--to-ts", "6")
            ] == [(0, 1), (0, 2), (1, 1), (1, 2)]  # fmt: skip
    assert [r["start"] for r in dump_rows(*base, "--key", "u0", "--to-ts", "0")] == [0]
    # versioned: validity [0,10), [10,20), [20,-): versions overlapping [12, 25]
    plans = [uri, "--store", "plans", "--partition", "0", *flags]
    assert [r["value"] for r in dump_rows(*plans, "--from-ts", "12", "--to-ts", "25")] == [
        "plan2",
        "plan1",
    ]
    assert [r["value"] for r in dump_rows(*plans, "--key-from", "u0", "--key-to", "u0")] == [
        "plan2", "plan1", "plan0",
    ]  # fmt: skip
    iso = "1970-01-01T00:00:00.015Z"
    assert dump_rows(*plans, "--as-of", iso) == [
        {"partition": 0, "key": "u0", "value": "plan1", "valid_from": 10, "valid_to": 20}
    ]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--key", "u0", "--key-from", "u0"], "either a key or a key range"),
        (["--as-of", "5"], "as_of applies to versioned stores; 'sessions' is a session store"),
        (["--from-ts", "yesterday"], "--from-ts 'yesterday' is neither epoch milliseconds"),
        (["--key", "[1", "--key-json"], "--key-json: '[1' is not JSON"),
        (["--partition", "7"], "has no partition 7"),
        (["--limit", "0"], "--limit must be at least 1, got 0"),
        (["--from-ts", "9", "--to-ts", "3"], "from_ts 9 is after to_ts 3"),
    ],
)
def test_dump_filter_errors(checkpoint, args, message):
    uri, flags = checkpoint
    out = run("dump", uri, "--store", "sessions", *args, *flags)
    assert out.returncode == 2, out.stdout
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_progress_shows_on_a_terminal_only(checkpoint, tmp_path):
    import pty

    uri, flags = checkpoint
    # subprocesses: the claim is about a real process's stderr, a pipe then a terminal
    args = [*CLI, "dump", uri, "--store", "sessions", *flags]
    piped = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "100"}
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=follower, env=env) as proc:
        os.close(follower)
        stdout, _ = proc.communicate(timeout=120)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.returncode == 0
    assert len(stdout.splitlines()) == 6  # rows still go to stdout, unchanged
    assert b"partitions" in seen and b"\x1b[" in seen  # a drawn (ANSI) progress display


@pytest.mark.parametrize("spelling", ["remote", "./remote/"])
def test_commands_work_on_a_relative_path(tmp_path, spelling):
    """`make demo` writes through a file:// URI; verify, get, dump and ls on the
    relative path used to refuse the checkpoint's own snapshots ("snapshot 2 of
    remote/op/0 holds version -1")."""
    write_checkpoint(f"file://{tmp_path}/remote", None, tmp_path / "local")
    for partition, version in ((0, 1), (0, 2), (1, 1), (1, 2)):  # as pruning would
        os.remove(tmp_path / f"remote/op/{partition}" / changelog_name(version))
    out = run("verify", spelling, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verified 2 partitions of 1 operators: 0 problems" in out.stdout
    out = run("get", spelling, "--store", "plans", "--key", "u1", "--as-of", "15", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "partition": 1, "key": "u1", "value": "plan1", "valid_from": 10, "valid_to": 20,
    }  # fmt: skip
    out = run("dump", spelling, "--store", "sessions", "--partition", "0", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"partition": 0, "key": "u0", "start": v, "end": v + 5, "value": {"n": v}} for v in range(3)
    ]
    out = run("ls", spelling, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.stdout.splitlines()]
    assert [r[:5] for r in rows if r and r[0] == "op"] == [
        ["op", "0", "3", "2..3", "2"],
        ["op", "1", "3", "2..3", "2"],
    ]


def test_retry_options_bound_a_failing_store_and_the_error_says_what_was_tried(tmp_path):
    """--retry-max-attempts and --retry-max-seconds (on every command): an endpoint
    that refuses connections fails at once after that many attempts, on one line."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = storage_flags({
        "endpoint_override": f"127.0.0.1:{port}", "scheme": "http", "region": "us-east-1",
        "access_key": "testing", "secret_key": "testing",
    }, tmp_path)  # fmt: skip
    out = run("ls", "s3://bucket/ck", *flags, "--retry-max-attempts", "2",
              "--retry-max-seconds", "20")  # fmt: skip
    assert out.returncode == 2
    assert "cannot reach s3://bucket/ck" in out.stderr and "(2 attempts in" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = run("ls", "s3://bucket/ck", *flags, "--retry-max-attempts", "0")
    assert out.returncode == 2 and "--retry-max-attempts" in out.stderr


def test_parquet_dumps_of_a_temporal_join_table_hold_timestamps_only_when_recorded(tmp_path):
    """A temporal join over epoch milliseconds records no time type: its table's
    ``valid_from``/``valid_to`` dump to Parquet as int64. One told its times are
    timestamps records so, and both columns are timestamp[ms, UTC], also where
    every ``valid_to`` dumped is open (null)."""
    from datetime import UTC, datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    from sessionstore.operators import TemporalJoin

    def instant(ms):
        return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)

    spec = [StoreSpec("table", "versioned", 10**12)]
    for time_type in (None, "timestamp"):
        uri = f"file://{tmp_path}/{time_type}"
        provider = StateStoreProvider(uri, "temporal_join", 0, spec, tmp_path / f"l-{time_type}")
        handle = provider.get_store(0)
        join = TemporalJoin(handle["table"], time_type=time_type)
        join.process_table("a", "free", 1_700_000_000_000)
        join.process_table("a", "pro", 1_700_000_060_123)
        join.process_table("b", "free", 1_700_000_000_500)
        handle.commit()
        provider.close()
        shown = instant if time_type else (lambda ms: ms)
        want = pa.timestamp("ms", tz="UTC") if time_type else pa.int64()
        for key, rows in [
            ([], [("a", "pro", 1_700_000_060_123, None),
                  ("a", "free", 1_700_000_000_000, 1_700_000_060_123),
                  ("b", "free", 1_700_000_000_500, None)]),
            (["--key", "b"], [("b", "free", 1_700_000_000_500, None)]),
        ]:  # fmt: skip
            target = tmp_path / f"{time_type}{len(key)}.parquet"
            out = run("dump", uri, "--store", "table", *key, "--format", "parquet",
                      "--output", str(target))  # fmt: skip
            assert out.returncode == 0, out.stderr
            dump = pq.read_table(target)
            assert [dump.schema.field(c).type for c in ("valid_from", "valid_to")] == [want, want]
            assert [
                (r["key"], r["value"], r["valid_from"], r["valid_to"]) for r in dump.to_pylist()
            ] == [(k, v, shown(f), shown(t)) for k, v, f, t in rows]
        # jsonl keeps the integers
        out = run("dump", uri, "--store", "table", "--key", "b")
        assert json.loads(out.stdout)["valid_from"] == 1_700_000_000_500
