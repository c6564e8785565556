"""Rescaling a checkpoint (checkpoint/offline/repartition.py) without Spark: every store
kind, rows routed exactly by Spark's hash partitioning (encoding/spark_hash.py,
itself checked against Spark in tests/spark/test_repartition.py), meta merged,
refusals, and a run that dies midway."""

from __future__ import annotations

import msgpack
import pytest

import sessionstore.checkpoint.offline.repartition as rp
from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.offline.repartition import RepartitionError, repartition_checkpoint
from sessionstore.checkpoint.partition.provider import CheckpointMismatchError
from sessionstore.checkpoint.records.event_time import partition_event_time
from sessionstore.checkpoint.records.layout import read_metadata
from sessionstore.checkpoint.records.snapshot import download_snapshot
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.encoding.ints import INT64
from sessionstore.encoding.spark_hash import partition_ids
from sessionstore.stores import closing
from sessionstore.stores.base import aux_key, stream_time_key
from sessionstore.stores.state_db import StateDB
from sessionstore.tools.reader import CheckpointSource, store_rows

SPECS = [
    StoreSpec("sessions", "session", 10**9),
    StoreSpec("windows", "window", 10**9, window_size_ms=10),
    StoreSpec("msgs", "messages", 10**9),
    StoreSpec("table", "versioned", 10**9),
    StoreSpec("counts", "kv", 0),
    StoreSpec("proc", "processor", 0),  # transform_with_state's state (issue #18)
]
TYPES = ["string", "long"]
KEYS = [(s, n) for s in ("", "a", "é", "日本語", "user-1") for n in (-(2**40), -1, 0, 7, 2**33)]


def write_source(uri, local, options=None, key_types=TYPES, versions=3, m=4):
    """Operator "op" at ``m`` partitions and version ``versions``, each key's rows
    in the partition Spark gives it; partition p's stream times end at 1000 + p."""
    owner = partition_ids([[k[0] for k in KEYS], [k[1] for k in KEYS]], TYPES, m).tolist()
    for p in range(m):
        provider = StateStoreProvider(
            uri, "op", p, SPECS, local, snapshot_interval=2, storage_options=options,
            num_partitions=m, key_types=key_types,
        )  # fmt: skip
        for v in range(versions):
            h = provider.get_store(v)
            for i, key in enumerate(KEYS):
                if owner[i] != p:
                    continue
                t = v * 100 + i
                h["sessions"].put(key, t, t + 5, {"n": v})
                h["windows"].put_window(key, t - t % 10, v)
                h["msgs"].put_message(key, t, i, {"m": i})
                h["table"].put(key, {"v": v}, t)
                h["counts"].put(key, v)
                proc = h["proc"]  # a variable and a timer of the key
                proc.write(proc.encode_key(key), proc.encode_key("n"), ((v,), None))
                proc.index_put(proc.timers_cf, t, proc.encode_key(key))
            last = h["sessions"]
            last.put(("zz", p), 0, 1000 + p, 1)  # partition p's stream time: 1000 + p
            if v == versions - 1:  # sessions kept to close at the next advance: a block
                mine = [key for i, key in enumerate(KEYS) if owner[i] == p]
                starts = [v * 100 + KEYS.index(key) + 10 for key in mine]
                last.closing_sessions().add_many(
                    [last.encode_key(key) for key in mine], starts, [t + 2 for t in starts],
                    [msgpack.packb({"kept": key[0]}) for key in mine],
                )  # fmt: skip
            h["sessions"].write_aux("plan", b"same everywhere")
            h.note_event_time(500 + 10 * v + p)  # after batch v: in the header of version v + 1
            h.commit()
        provider.do_maintenance()
        provider.close()
    return owner


def rows(uri, store, options=None):
    found = list(store_rows(CheckpointSource(uri, options), "op", store, raw=True))
    return sorted(
        ({k: v for k, v in r.items() if k != "partition"} for r in found), key=repr
    ), found


def key_of(row):
    return row["key"]


@pytest.fixture
def source(tmp_path, monkeypatch):
    # blocks of at most 4 kept sessions: a partition's kept sessions span blocks
    monkeypatch.setattr(closing, "BLOCK_SESSIONS", 4)
    uri = f"file://{tmp_path}/src"
    write_source(uri, str(tmp_path / "local"))
    return uri


@pytest.mark.slow
def test_every_kind_moves_to_sparks_partition(source, tmp_path):
    target = str(tmp_path / "dst")
    done = repartition_checkpoint(source, "op", 7, target)
    assert {k: done[k] for k in ("version", "from_partitions", "partitions", "event_time")} == {
        "version": 3, "from_partitions": 4, "partitions": 7, "event_time": 500 + 20 + 3,
    }  # fmt: skip
    for spec in SPECS:
        before, _ = rows(source, spec.name)
        after, placed = rows(target, spec.name)
        assert after == before and after, spec.name
        keys = [key_of(r) for r in placed]
        ids = partition_ids([[k[0] for k in keys], [k[1] for k in keys]], TYPES, 7).tolist()
        assert [r["partition"] for r in placed] == ids, spec.name
    metadata = read_metadata(open_filesystem(target).child("op"))
    recorded = read_metadata(open_filesystem(source).child("op"))
    assert metadata["num_partitions"] == 7 and metadata["key_types"] == TYPES
    assert metadata["stores"] == recorded["stores"]
    assert metadata["checkpoint_id"] != recorded["checkpoint_id"]
    for p in range(7):  # the shared event time of batch 2, what batch 3 reads
        assert partition_event_time(open_filesystem(target).child("op"), 2, p) == 523
    # again, from the rows a repartition wrote (kept sessions as a row each)
    again = str(tmp_path / "again")
    repartition_checkpoint(target, "op", 3, again)
    for spec in SPECS:
        after, placed = rows(again, spec.name)
        assert after == rows(source, spec.name)[0], spec.name
        keys = [key_of(r) for r in placed]
        ids = partition_ids([[k[0] for k in keys], [k[1] for k in keys]], TYPES, 3).tolist()
        assert [r["partition"] for r in placed] == ids, spec.name


def test_restart_continues_at_version_v_with_min_stream_time(source, tmp_path):
    target = f"file://{tmp_path}/dst"
    repartition_checkpoint(source, "op", 7, target)
    for p in range(7):
        provider = StateStoreProvider(
            target, "op", p, SPECS, str(tmp_path / "local2"), num_partitions=7,
            key_types=TYPES,
        )  # fmt: skip
        h = provider.get_store(3)
        # the smallest source stream time: partition 0's ("zz", 0) ended at 1000
        assert h["sessions"].observed_stream_time == 1000
        assert h["sessions"].read_aux("plan") == b"same everywhere"
        h["counts"].put(("new", p), 1)
        assert h.commit() == 4
        provider.close()
    with pytest.raises(CheckpointMismatchError, match="written with 7 partitions"):
        StateStoreProvider(target, "op", 0, SPECS, str(tmp_path / "l3"), num_partitions=4)


def test_refusals_write_nothing(source, tmp_path):
    target = str(tmp_path / "dst")
    cases = [
        (dict(operator="nope"), r"no operator 'nope' in .* \(operators: op\)"),
        (dict(version=9), r"version 9 of .* is not loadable in partition 0 \(loadable: 1..3\)"),
        (dict(partitions=0), "the partition count must be a positive int, got 0"),
        (dict(key_types=["string", "int"]), "--key-types string,integer disagrees .*string,long"),
        (dict(key_types=["double"]), "key column type 'double' cannot be routed"),
    ]
    for change, message in cases:
        args = {"operator": "op", "partitions": 7, "version": None, "key_types": None, **change}
        with pytest.raises(RepartitionError, match=message):
            repartition_checkpoint(
                source, args["operator"], args["partitions"], target, args["version"],
                args["key_types"],
            )  # fmt: skip
        assert not open_filesystem(target).has_files()
    open_filesystem(target).write_atomic("op/x", b"")
    with pytest.raises(RepartitionError, match="dst/op exists and is not empty"):
        repartition_checkpoint(source, "op", 7, target)


def test_a_damaged_closing_block_is_refused_and_nothing_written(tmp_path):
    """A block of closing sessions this code did not write stops the repartition
    with an error naming the partition, the store and the row; no target appears."""
    uri = f"file://{tmp_path}/src"
    provider = StateStoreProvider(
        uri, "op", 0, SPECS[:1], str(tmp_path / "local"), num_partitions=1, key_types=TYPES
    )
    h = provider.get_store(0)
    h["sessions"].closing_sessions()
    h.db.put("sessions.closing", bytes(16), msgpack.packb([1, b"", b"", ["k"], []]))
    h.commit()
    provider.close()
    target = str(tmp_path / "dst")
    with pytest.raises(
        RepartitionError,
        match=r"src/op/0 store 'sessions': closing: the closing block 0+ is not one this "
        r"code writes \(its columns differ in length or type\)",
    ):
        repartition_checkpoint(uri, "op", 3, target)
    assert not open_filesystem(target).has_files()


def test_checkpoints_without_key_types_need_them(tmp_path):
    uri = f"file://{tmp_path}/old"
    write_source(uri, str(tmp_path / "local"), key_types=None, versions=1, m=2)
    with pytest.raises(RepartitionError, match="does not record the Spark types .* --key-types"):
        repartition_checkpoint(uri, "op", 3, str(tmp_path / "a"))
    done = repartition_checkpoint(uri, "op", 3, str(tmp_path / "b"), key_types=["string", "bigint"])
    assert done["partitions"] == 3
    assert read_metadata(open_filesystem(str(tmp_path / "b")).child("op"))["key_types"] == TYPES


@pytest.mark.slow
def test_a_run_that_dies_midway_leaves_no_checkpoint(source, tmp_path, monkeypatch):
    """A fault injected from here: the third snapshot upload fails. No _metadata
    is written, a query on the target is refused, a rerun asks for a clean target."""
    target = f"file://{tmp_path}/dst"
    calls = []
    real = rp.upload_snapshot

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("injected: the machine died")
        return real(*args, **kwargs)

    monkeypatch.setattr(rp, "upload_snapshot", failing)
    with pytest.raises(OSError, match="injected"):
        repartition_checkpoint(source, "op", 7, target)
    monkeypatch.undo()
    storage = open_filesystem(target).child("op")
    assert not storage.exists("_metadata") and storage.has_files("0")
    with pytest.raises(CheckpointMismatchError, match="no _metadata: an incomplete checkpoint"):
        StateStoreProvider(target, "op", 0, SPECS, str(tmp_path / "l2"), num_partitions=7)
    with pytest.raises(RepartitionError, match="not empty"):
        repartition_checkpoint(source, "op", 7, target)


def test_disagreeing_meta_is_refused(tmp_path):
    uri = f"file://{tmp_path}/src"
    write_source(uri, str(tmp_path / "local"), versions=1, m=2)
    for p in (0, 1):
        provider = StateStoreProvider(uri, "op", p, SPECS, str(tmp_path / "local"))
        h = provider.get_store(1)
        if p == 1:
            h["sessions"].write_aux("plan", msgpack.packb("another plan"))
        h.commit()
        provider.close()
    entry = aux_key("sessions", "plan")
    with pytest.raises(RepartitionError, match=f"disagree on the meta entry {entry!r}"):
        repartition_checkpoint(uri, "op", 3, str(tmp_path / "dst"))


def test_operator_times_merge_by_their_rules(source, tmp_path):
    """Times take the minimum over the sources that have them; for the close time
    emitted, a source that emitted nothing yet wins (nothing is skipped)."""
    plan = rp.plan_repartition(source, "op", 2, str(tmp_path / "dst"))
    writer = rp.TargetWriter(plan, 0, str(tmp_path / "w"))
    times = {"stream_time": (5, 7, 1), "emitted_close": (3, 4, None), "early_tick": (9, 2, None)}
    for i in range(3):
        entries = [
            (aux_key("sessions", name), INT64.pack(values[i]))
            for name, values in times.items()
            if values[i] is not None
        ]
        entries.append((stream_time_key("table"), INT64.pack(100 - i)))
        writer.add("meta", b"", msgpack.packb(entries))
    writer.finish()
    download_snapshot(plan.target().child("0"), 3, str(tmp_path / "db"))
    db = StateDB.open(str(tmp_path / "db"))
    got = {
        name: db.get_meta(aux_key("sessions", name))
        for name in ("stream_time", "emitted_close", "early_tick")
    }
    assert got == {"stream_time": INT64.pack(1), "emitted_close": None, "early_tick": INT64.pack(2)}
    assert db.get_meta(stream_time_key("table")) == INT64.pack(98)
    db.close()


def test_a_target_opens_its_database_at_its_first_flush_with_its_rows_families(source, tmp_path):
    """A target's database is created at its first flush with the families of the
    rows it holds (in the open, one options write); a family first seen at a later
    flush is created then; a closed writer takes nothing more, also before any
    flush."""
    plan = rp.plan_repartition(source, "op", 2, str(tmp_path / "dst"))
    writer = rp.TargetWriter(plan, 0, str(tmp_path / "w"), flush_rows=2)
    writer.add("sessions.1", b"a", b"1")
    assert not (tmp_path / "w").exists()  # nothing opened before the first flush
    writer.add("sessions.2", b"b", b"2")  # the second row flushes both families
    db = writer.seal()
    assert db.column_families() == ["meta", "sessions.1", "sessions.2"]
    writer.add("sessions.3", b"c", b"3")
    writer.seal()
    assert db.column_families() == ["meta", "sessions.1", "sessions.2", "sessions.3"]
    assert [db.get(f"sessions.{i}", k) for i, k in ((1, b"a"), (2, b"b"), (3, b"c"))] == [
        b"1",
        b"2",
        b"3",
    ]
    writer.close()
    unused = rp.TargetWriter(plan, 1, str(tmp_path / "w"))
    unused.close()
    with pytest.raises(RepartitionError, match="writer is closed"):
        unused.seal()
    assert not (tmp_path / "w" / "target-1").exists()


def test_the_due_batches_marker_moves_with_the_checkpoint(source, tmp_path):
    """A query that read a due source (spark_integration/planning/due_batches.py)
    must read one after a rescale, or Spark refuses its restart: the marker is
    carried; a checkpoint without one gives a copy without one."""
    from sessionstore.checkpoint.records.layout import DUE_BATCHES_MARKER
    from sessionstore.checkpoint.storage.filesystem import open_filesystem

    plain = f"file://{tmp_path}/plain"
    repartition_checkpoint(source, "op", 3, plain)
    assert not open_filesystem(plain).child("op").exists(DUE_BATCHES_MARKER)
    open_filesystem(source).child("op").write_atomic(DUE_BATCHES_MARKER, b"1")
    marked = f"file://{tmp_path}/marked"
    repartition_checkpoint(source, "op", 3, marked)
    assert open_filesystem(marked).child("op").read(DUE_BATCHES_MARKER) == b"1"
