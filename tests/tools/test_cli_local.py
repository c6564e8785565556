"""The CLI on a job's local database directories, and reading while a job writes.

Run in the test's process (:func:`tests.tools.cli_runner.run_cli`), but in another
process where a writer holds or changes the database (a reader is another process
than the job: :class:`Reader`, one process for a test's calls) and where a dump's
memory (its process's peak RSS) is measured."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import time

import pytest

from sessionstore import StateDB, StateStoreProvider, StoreSpec
from tests.packaging import checkout_pythonpath
from tests.tools.test_cli import run

SPECS = [StoreSpec("sessions", "session", 10**12), StoreSpec("plans", "versioned", 10**12)]


READER = textwrap.dedent(
    """
    import json, sys
    from tests.tools.cli_runner import run_cli
    for line in sys.stdin:
        done = run_cli(*json.loads(line))
        print(json.dumps([done.returncode, done.stdout, done.stderr]), flush=True)
    """
)


#: How long a :class:`Reader` call may take.
READ_TIMEOUT_S = 300.0


class Reader:
    """A process of its own that runs CLI calls one by one, each as
    :func:`tests.tools.cli_runner.run_cli` runs it (its own streams, process-wide
    state and exit status, every database closed after it): a reader that is
    another process than the job, without a Python start and import per call.
    A context manager; :meth:`run` answers as ``subprocess.run`` of the CLI would."""

    def __enter__(self) -> Reader:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", READER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": checkout_pythonpath()},
        )  # fmt: skip
        return self

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``sessionstore ARGS...`` in the reader's process; a call that has not
        answered within :data:`READ_TIMEOUT_S` fails the test (as ``spawn``'s
        timeout did)."""
        self._proc.stdin.write(json.dumps(args) + "\n")
        self._proc.stdin.flush()
        # one line per call, nothing read ahead: the pipe is what holds the answer
        ready, _, _ = select.select([self._proc.stdout], [], [], READ_TIMEOUT_S)
        assert ready, f"sessionstore {args} did not answer within {READ_TIMEOUT_S:.0f} s"
        line = self._proc.stdout.readline()
        assert line, f"the reader process ended (status {self._proc.wait()})"
        code, out, err = json.loads(line)
        return subprocess.CompletedProcess(["sessionstore", *args], code, out, err)

    def __exit__(self, *exc: object) -> None:
        self._proc.stdin.close()
        if exc[0] is not None:
            self._proc.kill()  # a failed call may be stuck in the reader
        try:
            self._proc.wait(timeout=60)
        finally:
            if self._proc.poll() is None:  # stuck in a call: leave no process behind
                self._proc.kill()
                self._proc.wait()
            self._proc.stdout.close()
        assert exc[0] is not None or self._proc.returncode == 0


def rows_of(out):
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def listing(path):
    return sorted(os.listdir(path))


@pytest.mark.slow
def test_local_database_while_the_writer_holds_it(tmp_path):
    local = tmp_path / "local"
    provider = StateStoreProvider(f"file://{tmp_path}/remote", "op", 3, SPECS, local)
    for v in range(4):
        h = provider.get_store(v)
        h["sessions"].put("alice", 10 * v, 10 * v + 5, v)
        h["plans"].put(("acme", 1), f"plan{v}", 100 * v)
        h.commit()
    db_dir = local / "op" / "3" / "db"
    # another process: the reader is not the writer holding the lock
    before = listing(db_dir)
    try:  # the provider keeps the database open: its RocksDB lock is held
        with Reader() as reader:
            expected = [
                {"partition": 3, "key": "alice", "start": 10 * v, "end": 10 * v + 5, "value": v}
                for v in range(4)
            ]
            for uri in (str(local), str(local / "op"), str(db_dir), f"file://{local}"):
                assert rows_of(reader.run("dump", uri, "--store", "sessions")) == expected, uri
            got = rows_of(reader.run("get", str(local), "--store", "plans", "--key",
                                     '["acme", 1]', "--key-json", "--as-of", "150"))  # fmt: skip
            assert got == [{"partition": 3, "key": ["acme", 1], "value": "plan1",
                            "valid_from": 100, "valid_to": 200}]  # fmt: skip
            out = reader.run("ls", str(local))
            assert out.returncode == 0, out.stderr
            assert "local databases" in out.stdout
            assert "stream time 1970-01-01T00:00:00.035Z ~4 keys" in out.stdout
            # the reader left nothing behind in the job's directory, and the job goes on
            assert listing(db_dir) == before
            h = provider.get_store(4)
            h["sessions"].put("bob", 50, 55, 4)
            assert h.commit() == 5
            dumped = rows_of(reader.run("dump", str(local), "--store", "sessions"))
            assert [r["key"] for r in dumped] == ["alice", "alice", "alice", "alice", "bob"]
            out = reader.run("dump", str(local), "--store", "sessions", "--version", "2")
            assert out.returncode == 2 and "is at version 5, not 2" in out.stderr
            out = reader.run("verify", str(local))
            assert out.returncode == 2 and "works on a checkpoint root" in out.stderr
    finally:
        provider.close()


def test_operator_is_required_when_there_are_several(tmp_path):
    for name in ("alpha", "beta"):
        p = StateStoreProvider(f"file://{tmp_path}/remote", name, 0, SPECS, tmp_path / "local")
        p.get_store(0).commit()
        p.close()
    out = run("dump", str(tmp_path / "local"), "--store", "sessions")
    assert out.returncode == 2 and "several operators; pick one with --operator (alpha, beta)" in (
        out.stderr
    )
    out = run("dump", str(tmp_path / "nowhere"), "--store", "sessions")
    assert out.returncode == 2 and "does not exist" in out.stderr


WRITER = textwrap.dedent(
    """
    import os, sys
    from sessionstore import StateStoreProvider, StoreSpec
    remote, local, stop = sys.argv[1:4]
    specs = [StoreSpec("sessions", "session", 10**12)]
    p = StateStoreProvider(remote, "op", 0, specs, local, snapshot_interval=5)
    v = 0
    while not os.path.exists(stop) and v < 2000:
        h = p.get_store(v)
        # 2 KB values: snapshots flush memtables, so compactions delete files as we read
        h["sessions"].put(f"k{v + 1:05d}", v + 1, v + 1, [v + 1, "x" * 2000])
        v = h.commit()
        if v % 5 == 0:
            p.do_maintenance()
    p.close()
    print(v)
    """
)


@pytest.mark.slow
def test_dump_while_a_writer_keeps_committing(tmp_path):
    remote, local, stop = f"file://{tmp_path}/remote", tmp_path / "local", tmp_path / "stop"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, remote, str(local), str(stop)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while not (local / "op" / "0" / "db" / "CURRENT").exists():
            time.sleep(0.05)
        time.sleep(0.5)
        seen = {"local": [], "checkpoint": []}
        # another process: reading while another process (a job) writes
        with Reader() as reader:
            for _ in range(3):
                for name, uri in (("local", str(local)), ("checkpoint", remote)):
                    assert writer.poll() is None, "the writer stopped while we read"
                    dumped = rows_of(reader.run("dump", uri, "--store", "sessions"))
                    values = [r["value"][0] for r in dumped]
                    # a committed state: versions 1..n, nothing torn, nothing missing
                    assert values == list(range(1, len(values) + 1)), name
                    seen[name].append(len(values))
        assert writer.poll() is None
    finally:
        stop.touch()
        out, _ = writer.communicate(timeout=120)
    assert writer.returncode == 0
    final = int(out.strip())
    for name, counts in seen.items():
        assert counts == sorted(counts) and counts[-1] > counts[0] > 0, (name, counts)
        assert counts[-1] <= final
    # the writer is gone: this process reads the checkpoint it left
    values = [r["value"][0] for r in rows_of(run("dump", remote, "--store", "sessions"))]
    assert values == list(range(1, final + 1))


PEAK = textwrap.dedent(
    """
    import resource, sys
    from sessionstore.tools.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, file=sys.stderr)
    sys.exit(code)
    """
)


@pytest.mark.slow
def test_dumping_a_million_sessions_keeps_memory_flat(tmp_path):
    db_dir = tmp_path / "big" / "db"
    with StateDB.open(db_dir) as db:
        store = db.session_store("sessions", 10**12)
        for chunk in range(10):
            with db.batch():
                store.put_many(
                    (f"user{i:07d}", i, i + 1000, {"clicks": i % 97})
                    for i in range(chunk * 100_000, (chunk + 1) * 100_000)
                )

    def peak_mb(*args):
        out = subprocess.run(
            [sys.executable, "-c", PEAK, "dump", str(db_dir), "--store", "sessions", *args],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return int(out.stderr.strip().splitlines()[-1]), out

    small, _ = peak_mb("--limit", "10000", "--output", str(tmp_path / "small.jsonl"))
    full, out = peak_mb("--output", str(tmp_path / "full.jsonl"))
    with open(tmp_path / "full.jsonl") as f:
        lines = sum(1 for _ in f)
    assert lines == 1_000_000
    # 100x the rows; materialising them would take hundreds of MB
    print(f"peak RSS: {small} MB (10k rows), {full} MB (1M rows)")
    assert full - small < 40, (small, full)
    # Parquet against Parquet: the base is a dump of more rows than one row group
    # (65,536) in the same format (pyarrow's allocator and the row group's Python
    # rows: 80-110 MB over the jsonl base, more on a loaded machine, which made the
    # old comparison with jsonl flaky). 10x the rows add 25-35 MB of allocator
    # high-water mark here; holding the rows would add several hundred MB
    pq_small, _ = peak_mb(
        "--format", "parquet", "--limit", "100000", "--output", str(tmp_path / "s.parquet")
    )  # fmt: skip
    pq_peak, out = peak_mb("--format", "parquet", "--output", str(tmp_path / "full.parquet"))
    assert "wrote 1,000,000 rows" in out.stdout
    print(f"peak RSS: {pq_small} MB (100k rows to parquet), {pq_peak} MB (1M rows)")
    assert pq_peak - pq_small < 60, (pq_small, pq_peak)
