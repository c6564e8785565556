"""Per-task metrics in changelog headers: exact counts, load kinds, commit timings
carried by the next changelog, snapshot lag, and old changelogs without metrics."""

from __future__ import annotations

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.records.changelog import (
    _HEAD,
    FORMAT,
    MAGIC,
    encode_changelog,
    read_changelog_header,
)
from sessionstore.checkpoint.records.layout import changelog_name
from sessionstore.checkpoint.records.metrics import (
    HEADER_FIELDS,
    STATS_FIELDS,
    TASK_FIELDS,
    snapshot_lag,
    summarize_batch,
    task_records,
)
from sessionstore.engine.write_buffer import WriteBuffer
from sessionstore.tools.reader import CheckpointSource

SPECS = [StoreSpec("sessions", "session", 10**9)]


def provider(uri, local, partition=0, interval=2):
    return StateStoreProvider(uri, "op", partition, SPECS, str(local), snapshot_interval=interval)


def header(p, version):
    return read_changelog_header(p._remote, changelog_name(version))


def test_counts_load_kinds_and_next_commit_timings(tmp_path):
    uri = f"file://{tmp_path}/remote"
    p = provider(uri, tmp_path / "local")
    h = p.get_store(0)
    h["sessions"].put("a", 0, 1, {"n": 1})
    h["sessions"].put("b", 0, 1, {"n": 1})
    h.note(late_dropped=3, emitted=2)
    h.commit()
    seen_by_task = p.last_metrics
    h = p.get_store(1)
    h["sessions"].put("c", 0, 1, {"n": 1})
    h["sessions"].remove("a", 0, 1)
    h.commit()
    first, second = header(p, 1)["metrics"], header(p, 2)["metrics"]
    assert (first["rows_total"], first["rows_updated"], first["rows_removed"]) == (2, 2, 0)
    assert (first["late_dropped"], first["emitted"]) == (3, 2)
    assert first["load_kind"] == "restore" and first["previous"] is None
    assert (second["rows_total"], second["rows_updated"], second["rows_removed"]) == (2, 1, 1)
    assert (second["late_dropped"], second["emitted"]) == (None, None)  # nothing noted
    assert second["load_kind"] == "warm"
    # the commit of version 1 is timed in changelog 2's header, as the task saw it
    assert second["previous"]["version"] == 1
    for step in ("prepare_ms", "upload_ms", "apply_ms"):
        assert second["previous"][step] == seen_by_task[step] >= 0
    assert seen_by_task["commit_ms"] >= seen_by_task["upload_ms"]
    assert p.last_metrics["version"] == 2 and p.last_metrics["commit_ms"] > 0
    # one list of names: what a commit records is what a coordinator accepts
    assert set(second) - {"format", "previous", "changelog_bytes"} == set(HEADER_FIELDS)
    assert set(p.last_metrics) - {"previous"} <= TASK_FIELDS
    # the header states the changelog's own size exactly
    size = (tmp_path / "remote/op/0" / changelog_name(1)).stat().st_size
    assert first["uploaded_bytes"] == size
    assert first["memory_bytes"] > 0
    p.close()

    again = provider(uri, tmp_path / "local")  # the database is on disk: reopened
    again.get_store(2).commit()
    assert header(again, 3)["metrics"]["load_kind"] == "handover"
    assert header(again, 3)["metrics"]["previous"]["version"] == 2
    behind = provider(uri, tmp_path / "other")  # another machine: restored
    behind.get_store(3).commit()
    assert header(behind, 4)["metrics"]["load_kind"] == "restore"
    assert header(behind, 4)["metrics"]["previous"] is None  # timed on the other machine
    behind.close()
    again.get_store(4).commit()  # local at 3, changelog 4 present: replayed
    assert header(again, 5)["metrics"]["load_kind"] == "replay"
    assert header(again, 5)["metrics"]["previous"] is None  # its record is of version 3
    again.close()


def test_snapshot_lag_counts_versions_since_the_newest_uploaded_snapshot(tmp_path):
    uri = f"file://{tmp_path}/remote"
    p = provider(uri, tmp_path / "local", interval=2)
    lags = []
    for v in range(5):
        p.get_store(v).commit()
        lags.append(header(p, v + 1)["metrics"]["snapshot_lag"])
        if v == 1:
            p.do_maintenance()  # uploads snapshot 2 only now
    # v1: none yet; v2: snapshot 2 taken, not uploaded; v3: 2 uploaded;
    # v4: snapshot 4 waits, 2 is the newest uploaded; v5: same
    assert lags == [1, 2, 1, 2, 3]
    # snapshot 2's bytes are counted with the next commit, by the process that uploaded
    assert (
        header(p, 3)["metrics"]["uploaded_bytes"] > 10 * header(p, 4)["metrics"]["uploaded_bytes"]
    )
    p.close()
    assert snapshot_lag(7, 5, []) == 2
    assert snapshot_lag(10, 5, [10, 5]) == 10
    assert snapshot_lag(0, 5, []) == 0


def test_changelogs_without_metrics_still_read(tmp_path):
    """A format-2 changelog of an earlier release (stats only, no metrics) reads,
    and stats shows what it knows: the rows, nothing made up."""
    uri = f"file://{tmp_path}/remote"
    p = provider(uri, tmp_path / "local")
    h = p.get_store(0)
    h["sessions"].put("a", 0, 1, {"n": 1})
    h.commit()
    p.close()
    path = tmp_path / "remote/op/0" / changelog_name(1)
    old = encode_changelog(WriteBuffer(), "op", 0, 1, {"sessions": {"stream_time": 1, "keys": 7}})
    assert old[:4] == MAGIC and _HEAD.unpack_from(old)[1] == FORMAT == 2
    path.write_bytes(old)
    assert "metrics" not in header(p, 1)
    [row] = CheckpointSource(uri).batch_metrics("op")
    assert row == {
        "operator": "op", "batch": 0, "partitions": 1, "rows_total": 7, "rows_updated": None,
        "rows_removed": None, "late_dropped": None, "emitted": None, "load_ms_max": None,
        "loads": {}, "commit_ms_p50": None, "commit_ms_max": None, "uploaded_bytes": None,
        "snapshot_lag_max": None, "memory_bytes_max": None, "repaired": None,
    }  # fmt: skip
    assert tuple(row) == STATS_FIELDS


def test_summarize_batch_over_partitions():
    headers = {
        0: {
            1: {"metrics": {"rows_total": 5, "rows_updated": 2, "rows_removed": 1,
                            "late_dropped": 0, "emitted": 4, "load_kind": "warm", "load_ms": 1.5,
                            "uploaded_bytes": 100, "snapshot_lag": 1, "memory_bytes": 10}},
            2: {"metrics": {"previous": {"version": 1, "prepare_ms": 1.0, "upload_ms": 2.0,
                                         "apply_ms": 0.5}}},
        },
        1: {
            1: {"metrics": {"rows_total": 1, "rows_updated": 0, "rows_removed": 0,
                            "late_dropped": 1, "emitted": 0, "load_kind": "restore",
                            "load_ms": 9.0, "uploaded_bytes": 50, "snapshot_lag": 3,
                            "memory_bytes": 30}},
            2: {"metrics": {"previous": {"version": 1, "prepare_ms": 0.5, "upload_ms": 0.5,
                                         "apply_ms": 0.0}}},
        },
        2: {
            1: {"metrics": {"rows_total": 0, "rows_updated": 0, "rows_removed": 0,
                            "late_dropped": 0, "emitted": 0, "load_kind": "warm", "load_ms": 0.1,
                            "uploaded_bytes": 40, "snapshot_lag": 1, "memory_bytes": 20,
                            "repaired": 1}},
        },
    }  # fmt: skip
    records = [task_records(h, p)[1] for p, h in headers.items()]
    assert summarize_batch("op", 0, records) == {
        "operator": "op", "batch": 0, "partitions": 3, "rows_total": 6, "rows_updated": 2,
        "rows_removed": 1, "late_dropped": 1, "emitted": 4, "load_ms_max": 9.0,
        "loads": {"restore": 1, "warm": 2}, "commit_ms_p50": 2.25, "commit_ms_max": 3.5,
        "uploaded_bytes": 190, "snapshot_lag_max": 3, "memory_bytes_max": 30, "repaired": 1,
    }  # fmt: skip


def test_a_caller_that_waited_for_the_state_notes_its_load_time(tmp_path):
    p = provider(f"file://{tmp_path}/remote", tmp_path / "local")
    h = p.get_store(0)
    h.note(load_ms=42.5)  # e.g. a Spark task that waited for a handover first
    h.commit()
    assert header(p, 1)["metrics"]["load_ms"] == 42.5
    p.get_store(1).commit()
    assert header(p, 2)["metrics"]["load_ms"] < 42.5  # the provider's own measure
    p.close()
