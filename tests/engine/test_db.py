"""StateDB: atomic batches, read-your-writes, column families, reopen and locking."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import msgpack
import pytest
from rocksdict import Options, Rdict

from sessionstore import StateDB, StateDBLockedError, StateDBPathError, StoreSpecMismatchError
from sessionstore.engine.db import INFO_LOG_BYTES, INFO_LOGS_KEPT, META_CF
from sessionstore.errors import SessionStoreError


class Boom(Exception):
    pass


def test_a_new_database_gets_its_metadata_family_in_the_open_itself(tmp_path):
    """RocksDB rewrites its OPTIONS file (and reads it back) at an open and at every
    family created (about 4 ms of CPU each): a new database has its metadata family
    from the open's own write, one OPTIONS file, and a second open writes one more."""
    from sessionstore.engine.db import Database

    path = tmp_path / "db"
    db = Database.open(path)
    assert db.column_families() == [META_CF]
    db.close()
    assert Rdict.list_cf(str(path)) == ["default", META_CF]
    assert len(list(path.glob("OPTIONS-*"))) == 1
    db = Database.open(path)
    assert db.column_families() == [META_CF]
    db.close()
    options = sorted(int(p.name.split("-")[1]) for p in path.glob("OPTIONS-*"))
    assert len(options) == 2 and options[0] < options[1]  # RocksDB keeps the last two


def test_a_new_database_gets_the_families_it_is_opened_with_in_the_open_itself(tmp_path):
    """The families a new database is opened with come with the open's one options
    write (each created after the open writes one more); an existing database
    ignores them."""
    from sessionstore.engine.db import Database

    def newest_options(folder):
        return max(p.name for p in folder.glob("OPTIONS-*"))

    Database.open(tmp_path / "bare").close()
    path = tmp_path / "db"
    db = Database.open(path, families=["s.kv", "s.timers", "s.kv"])
    assert db.column_families() == [META_CF]  # none asked for yet
    for name in ("s.kv", "s.timers"):
        db.create_column_family(name)
    assert db.column_families() == [META_CF, "s.kv", "s.timers"]
    db.close()
    assert sorted(Rdict.list_cf(str(path))) == ["default", META_CF, "s.kv", "s.timers"]
    assert newest_options(path) == newest_options(tmp_path / "bare")  # no write of its own
    one_by_one = Database.open(tmp_path / "other")
    for name in ("s.kv", "s.timers"):
        one_by_one.create_column_family(name)
    one_by_one.close()
    assert newest_options(tmp_path / "other") > newest_options(path)
    db = Database.open(path, families=["s.ttl"])  # exists: as it is
    assert db.column_families() == [META_CF, "s.kv", "s.timers"]
    db.close()


def test_a_family_the_open_created_is_recorded_when_first_asked_for(tmp_path):
    """A batch that asks for a family the open created records its creation (what
    the batch's changelog carries) as it would have created it then, once; one
    never asked for is never recorded; a replay of the batches onto an empty
    database builds the same families and rows."""
    opened = StateDB.open(tmp_path / "opened", families=["s.kv", "s.ttl"])
    created = StateDB.open(tmp_path / "created")
    replica = StateDB.open(tmp_path / "replica")
    try:
        for step in range(2):
            prepared = []
            for db in (opened, created):
                db.begin()
                db.create_column_family("s.kv")
                db.put("s.kv", b"k%d" % step, b"v")
                prepared.append(db.prepare())
            assert prepared[0].created == prepared[1].created == (["s.kv"] if not step else [])
            opened.apply(prepared[0])
            created.apply(prepared[1])
            replica.apply(prepared[0])
        for db in (created, replica):
            assert db.column_families() == [META_CF, "s.kv"]
            assert [k for k, _ in db.scan("s.kv")] == [b"k0", b"k1"]
        assert opened.column_families() == [META_CF, "s.kv"]  # s.ttl: never asked for
    finally:
        for db in (opened, created, replica):
            db.close()
    with StateDB.open(tmp_path / "opened", families=["s.ttl", "s.x"]) as again:
        # it exists now (in the files, empty): nothing to create or record, and a
        # database that exists creates none of the families it is opened with
        assert again.column_families() == [META_CF, "s.kv", "s.ttl"]
        again.begin()
        again.create_column_family("s.ttl")
        assert again.prepare().created == []


def _twins(tmp_path, name):
    """A new database opened with family ``name`` and one opened without it."""
    return (
        StateDB.open(tmp_path / "with", families=[name]),
        StateDB.open(tmp_path / "without"),
    )


def test_a_family_the_open_created_acts_absent_until_a_replay_creates_it(tmp_path):
    """A replayed batch that creates and writes a family the open created takes it
    over as a database without it creates it: asked for afterwards, it is not
    recorded as created again."""
    source = StateDB.open(tmp_path / "source")
    source.begin()
    source.create_column_family("s.1")
    source.put("s.1", b"k", b"v")
    replayed = source.prepare()
    source.rollback()
    source.close()
    for db in _twins(tmp_path, "s.1"):
        with db:
            assert db.column_families() == [META_CF]
            db.apply(replayed)
            assert db.column_families() == [META_CF, "s.1"]
            db.begin()
            db.create_column_family("s.1")
            assert db.prepare().created == []
            assert db.get("s.1", b"k") == b"v"


def test_a_drop_of_a_family_the_open_created_is_ignored_as_for_a_missing_one(tmp_path):
    """Dropped then asked for in one batch, a family the open created ends as a
    family a database without it creates in that batch: there, recorded as
    created and not as dropped."""
    results = []
    for db in _twins(tmp_path, "s.1"):
        with db:
            db.begin()
            db.drop_column_family("s.1")
            db.create_column_family("s.1")
            db.put("s.1", b"k", b"v")
            buf = db.prepare()
            db.apply(buf)
            results.append((buf.created, buf.dropped, db.column_families(), db.get("s.1", b"k")))
    assert results[0] == results[1] == (["s.1"], [], [META_CF, "s.1"], b"v")


@pytest.mark.parametrize("families", ["s.kv", ["default"], ["meta"], [""], [7], None])
def test_families_that_cannot_name_a_store_family_are_refused_before_the_open(tmp_path, families):
    from sessionstore.engine.db import Database

    named = families[0] if isinstance(families, list) else families
    with pytest.raises(ValueError, match=re.escape(repr(named))):
        Database.open(tmp_path / "db", families=families)
    assert not (tmp_path / "db").exists()


def test_batch_is_atomic_and_rollback_discards(tmp_path):
    with StateDB.open(tmp_path) as db:
        db.create_column_family("x.0")
        with db.batch():
            db.put("x.0", b"a", b"1")
            db.put("x.0", b"b", b"2")
        with pytest.raises(Boom):
            with db.batch():
                db.put("x.0", b"c", b"3")
                db.delete("x.0", b"a")
                assert db.get("x.0", b"c") == b"3"  # read-your-writes
                assert db.get("x.0", b"a") is None
                raise Boom()
        assert db.get("x.0", b"c") is None
        assert db.get("x.0", b"a") == b"1"
    with StateDB.open(tmp_path) as db:
        assert list(db.scan("x.0")) == [(b"a", b"1"), (b"b", b"2")]


def record_commits(db, monkeypatch, what):
    """Record ``what(buffer)`` of every write buffer the database applies."""
    commits, apply = [], db._apply

    def recording(buf):
        apply(buf)
        commits.append(what(buf))

    monkeypatch.setattr(db, "_apply", recording)
    return commits


def test_nested_batches_commit_once(db, monkeypatch):
    db.create_column_family("x.0")
    commits = record_commits(db, monkeypatch, lambda buf: dict(buf.families["x.0"]))
    with db.batch():
        db.put("x.0", b"a", b"1")
        with db.batch():
            db.put("x.0", b"b", b"2")
        assert commits == []
        db.put("x.0", b"a", b"3")  # last write wins, one RocksDB op
    assert commits == [{b"a": b"3", b"b": b"2"}]


def test_scan_merges_pending_writes_in_both_directions(db):
    db.create_column_family("x.0")
    with db.batch():
        for k in (b"b", b"d", b"f"):
            db.put("x.0", k, k.upper())
    with db.batch():
        db.put("x.0", b"a", b"A2")
        db.put("x.0", b"d", b"D2")
        db.delete("x.0", b"f")
        db.put("x.0", b"e", b"E2")
        assert list(db.scan("x.0")) == [(b"a", b"A2"), (b"b", b"B"), (b"d", b"D2"), (b"e", b"E2")]
        assert list(db.scan("x.0", b"b", b"e")) == [(b"b", b"B"), (b"d", b"D2")]
        assert list(db.scan("x.0", b"b", b"f", reverse=True)) == [
            (b"e", b"E2"),
            (b"d", b"D2"),
            (b"b", b"B"),
        ]
        assert db.get_many("x.0", [b"a", b"b", b"f", b"z"]) == [b"A2", b"B", None, None]
    assert list(db.scan("x.0", reverse=True))[0] == (b"e", b"E2")


def test_close_releases_lock_with_open_iterators(tmp_path):
    db = StateDB.open(tmp_path)
    db.create_column_family("x.0")
    for i in range(10):
        db.put("x.0", bytes([i]), b"v")
    started = db.scan("x.0")
    next(started)
    unstarted = db.scan("x.0", reverse=True)
    db.close()
    with StateDB.open(tmp_path) as again:  # would fail with "lock hold by current process"
        assert len(list(again.scan("x.0"))) == 10
    with pytest.raises(StopIteration):
        next(started)
    del unstarted


def test_second_handle_in_process_is_a_clear_error(tmp_path):
    with StateDB.open(tmp_path):
        with pytest.raises(StateDBLockedError, match="locked by another open handle"):
            StateDB.open(tmp_path)


def test_other_process_holding_the_db_is_a_clear_error_and_nothing_is_lost(tmp_path):
    with StateDB.open(tmp_path) as db:
        store = db.session_store("s", 1000)
        store.put("k", 1, 2, "kept")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from sessionstore import StateDB
                db = StateDB.open({str(tmp_path)!r})
                print("ready", flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StateDBLockedError) as err:
            StateDB.open(tmp_path)
        assert str(tmp_path) in str(err.value)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with StateDB.open(tmp_path) as db:
        assert db.session_store("s", 1000).fetch_session("k", 1, 2) == "kept"


def test_reopen_restores_families_stores_and_stream_time(tmp_path):
    with StateDB.open(tmp_path) as db:
        s = db.session_store("clicks", 100_000, segment_interval_ms=10_000)
        v = db.versioned_store("prices", 50_000, segment_interval_ms=10_000)
        s.put("u", 0, 5_000, 1)
        s.put("u", 20_000, 25_000, 2)
        v.put("p", 1.5, 1_000)
        v.put("p", 2.5, 30_000)
        families = db.column_families()
    assert families == [
        "clicks.0",
        "clicks.2",
        "meta",
        "prices.3",
        "prices.latest",
    ]
    with StateDB.open(tmp_path) as db:
        assert db.column_families() == families
        assert set(db.store_specs()) == {"clicks", "prices"}
        assert db.store_specs()["clicks"]["segment_interval_ms"] == 10_000
        s = db.session_store("clicks", 100_000)  # interval adopted from the record
        assert s.segment_interval_ms == 10_000
        assert s.observed_stream_time == 25_000
        assert [w.end for w, _ in s.fetch("u")] == [5_000, 25_000]
        v = db.versioned_store("prices", 50_000)
        assert v.observed_stream_time == 30_000
        assert v.get("p", 2_000).value == 1.5


def test_reopens_keep_only_the_newest_info_logs(tmp_path):
    """Every open moves RocksDB's last info log aside; a partition reopened at each
    move keeps the newest few, not one per open (RocksDB's default is 1,000)."""
    with StateDB.open(tmp_path) as db:
        db.session_store("clicks", 100_000, segment_interval_ms=10_000).put("u", 0, 5, 1)
    for _ in range(INFO_LOGS_KEPT + 6):
        StateDB.open(tmp_path).close()
    logs = sorted(name for name in os.listdir(tmp_path) if name.startswith("LOG"))
    assert logs[0] == "LOG" and len(logs) == INFO_LOGS_KEPT, logs
    assert all(n.startswith("LOG.old.") for n in logs[1:]), logs
    options = max(n for n in os.listdir(tmp_path) if n.startswith("OPTIONS-"))
    text = (tmp_path / options).read_text()
    assert f"keep_log_file_num={INFO_LOGS_KEPT}" in text
    assert f"max_log_file_size={INFO_LOG_BYTES}" in text
    with StateDB.open(tmp_path) as db:  # what was committed is still there
        assert [w.end for w, _ in db.session_store("clicks", 100_000).fetch("u")] == [5]


def test_a_reader_keeps_its_own_info_logs_and_leaves_the_writers(tmp_path):
    """A secondary instance (the CLI's reader of a live database) logs in its own
    folder, keeps the newest few there, and deletes none of the writer's."""
    path, reader_dir = tmp_path / "db", tmp_path / "reader"
    for _ in range(INFO_LOGS_KEPT + 2):
        StateDB.open(path).close()
    with StateDB.open(path):  # the writer, live
        writers = sorted(n for n in os.listdir(path) if n.startswith("LOG"))
        for _ in range(INFO_LOGS_KEPT + 4):
            StateDB.open_secondary(path, str(reader_dir)).close()
        assert sorted(n for n in os.listdir(path) if n.startswith("LOG")) == writers
    assert len([n for n in os.listdir(reader_dir) if n.startswith("LOG")]) == INFO_LOGS_KEPT


def test_expired_segments_are_dropped_column_families(db):
    s = db.session_store("s", retention_ms=100, segment_interval_ms=50)
    for end in (0, 60, 110, 160):
        s.put("k", end, end, end)
    before = db.column_families()
    assert [f for f in before if f.startswith("s.")] == ["s.1", "s.2", "s.3"]
    s.put("k", 400, 400, 1)  # stream time 400: only ends >= 301 remain visible
    after = db.column_families()
    assert [f for f in after if f.startswith("s.")] == ["s.8"]
    assert len(after) < len(before)


def test_dropping_a_read_family_frees_it_and_keeps_the_others(tmp_path):
    """Families are dropped while other families' objects live (only the dropped
    one's object is released): the others stay readable, the dropped one is gone
    after reopen, and close still releases the lock."""
    db = StateDB.open(tmp_path)
    for name in ("x.0", "x.1"):
        db.create_column_family(name)
        db.put(name, b"k", name.encode())
        assert db.get(name, b"k") == name.encode()  # creates the family's object
    db.drop_column_family("x.0")
    assert db.get("x.1", b"k") == b"x.1"
    assert db.column_families() == ["meta", "x.1"]
    db.close()
    with StateDB.open(tmp_path) as again:  # would fail with "lock hold by current process"
        assert again.column_families() == ["meta", "x.1"]
        assert again.get("x.1", b"k") == b"x.1"


def test_store_spec_mismatch_is_refused(db):
    db.session_store("s", 1000, segment_interval_ms=100)
    with pytest.raises(StoreSpecMismatchError, match="segment_interval_ms=100"):
        db.session_store("s", 1000, segment_interval_ms=200)
    with pytest.raises(StoreSpecMismatchError, match="kind='session'"):
        db.versioned_store("s", 1000)


@pytest.mark.parametrize("name", ["", "a.b", "meta", "default", "a b", None])
def test_bad_store_names(db, name):
    with pytest.raises(ValueError, match="invalid store name"):
        db.session_store(name, 1000)


def test_bad_options(tmp_path):
    with pytest.raises(ValueError, match="unknown compression 'brotli'"):
        StateDB.open(tmp_path, compression="brotli")
    with pytest.raises(TypeError):
        StateDB.open(tmp_path, no_such_option=1)
    with pytest.raises(FileNotFoundError, match="no state database"):
        StateDB.open(tmp_path / "missing", create_if_missing=False)


def test_open_on_a_regular_file_names_the_path_and_leaves_the_file(tmp_path):
    path = tmp_path / "state"
    path.write_text("not a database")
    with pytest.raises(StateDBPathError) as info:
        StateDB.open(path)
    assert str(info.value) == (
        f"cannot open state database {str(path)!r}: it is a file, not a directory "
        "(give a directory; it is created if missing)"
    )
    assert info.value.path == str(path)
    assert isinstance(info.value, SessionStoreError) and isinstance(info.value, OSError)
    assert path.read_text() == "not a database"


@pytest.mark.parametrize("below", ["db", "x/y/db"])
def test_open_below_a_regular_file_names_the_path_and_the_file(tmp_path, below):
    (tmp_path / "f").write_text("x")
    path = tmp_path / "f" / below
    with pytest.raises(StateDBPathError) as info:
        StateDB.open(path)
    assert str(info.value) == (
        f"cannot open state database {str(path)!r}: {str(tmp_path / 'f')!r} is a file, "
        "not a directory"
    )


def test_open_on_an_empty_path_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StateDBPathError, match="cannot open state database '': the path is empty"):
        StateDB.open("")
    assert list(tmp_path.iterdir()) == []


def _open_without_privileges(path: str) -> str:
    """``StateDB.open(path)`` in a forked child that is not root (as nobody if we are
    root, since root may write anywhere); returns the error text or "opened"."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        result = "opened"
        try:
            if os.geteuid() == 0:
                os.setuid(65534)
            try:
                StateDB.open(path).close()
            except Exception as exc:
                result = f"{type(exc).__name__}: {exc}"
            os.write(write, result.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        out = pipe.read()
    os.waitpid(pid, 0)
    return out


@pytest.fixture
def shared_dir():
    """A temporary directory the unprivileged child can enter (tmp_path cannot be)."""
    path = tempfile.mkdtemp()
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def test_open_in_a_directory_that_is_not_writable(shared_dir):
    parent = os.path.join(shared_dir, "read-only")
    os.mkdir(parent, 0o555)
    os.chmod(parent, 0o555)
    path = os.path.join(parent, "db")
    assert _open_without_privileges(path) == (
        f"StateDBPathError: cannot open state database {path!r}: {parent!r} is not writable, "
        "so the database cannot be created in it"
    )
    assert os.listdir(parent) == []


def test_open_of_a_database_whose_directory_is_not_writable(shared_dir):
    path = os.path.join(shared_dir, "db")
    with StateDB.open(path) as db:
        db.session_store("s", 1000).put("k", 0, 5, "kept")
    os.chmod(path, 0o555)
    assert _open_without_privileges(path) == (
        f"StateDBPathError: cannot open state database {path!r}: the directory is not writable"
    )
    os.chmod(path, 0o755)
    with StateDB.open(path) as db:
        assert db.session_store("s", 1000).fetch_session("k", 0, 5) == "kept"


def test_format_version_mismatch_is_refused(tmp_path):
    with StateDB.open(tmp_path) as db:
        db.put(META_CF, b"format_version", msgpack.packb(99))
    with pytest.raises(SessionStoreError, match="format version 99"):
        StateDB.open(tmp_path)
    # the refused open released the lock: a raw handle can still repair the record
    opts = Options(raw_mode=True)
    families = {n: opts for n in Rdict.list_cf(str(tmp_path)) if n != "default"}
    raw = Rdict(str(tmp_path), opts, column_families=families)
    meta = raw.get_column_family(META_CF)
    meta[b"format_version"] = msgpack.packb(1)
    del meta
    raw.close()
    with StateDB.open(tmp_path) as db:
        assert db.column_families() == ["meta"]


def test_closed_db_is_a_clear_error(tmp_path):
    db = StateDB.open(tmp_path)
    s = db.session_store("s", 1000)
    db.close()
    db.close()  # idempotent
    with pytest.raises(SessionStoreError, match="is closed"):
        s.put("k", 1, 2, 3)


def test_a_batch_is_one_commit_with_its_metadata(db, monkeypatch):
    store = db.session_store("s", 1000)
    commits = record_commits(db, monkeypatch, lambda buf: sorted(buf.families))
    with db.batch():
        for i in range(5):
            store.put(f"k{i}", i, i, i)
    store.put("solo", 9, 9, 9)  # outside a batch: its own commit
    assert commits == [["meta", "s.0"], ["meta", "s.0"]]


def test_estimated_keys_count_a_stores_rows_not_its_indexes(db):
    from sessionstore.stores.base import is_data_family

    store = db.session_store("s", 10**9, segment_interval_ms=10)
    with db.batch():
        for start in (1, 15, 25):  # three segments
            store.put("k", start, start, 1)
    index = store.end_index()
    with db.batch():
        index.add(b"k", 1, 1)  # an index family, s.open, is not the store's rows
    assert db.estimated_keys("s") == 3
    families = ("s.0", "s.-3", "s.latest", "s.closing", "s.open", "st.0")
    assert [is_data_family("s", f) for f in families] == [
        True, True, True, True, False, False,
    ]  # fmt: skip
