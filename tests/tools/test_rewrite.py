"""Rewriting values (tools/rewrite.py on change.py) without Spark: a session
store with a recorded output plan, its aggregates changed by a function, every
refusal before anything is written, kill -9 in the middle, a busy checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import msgpack
import pytest

from sessionstore import StateStoreProvider, StoreSpec, rewrite
from sessionstore.checkpoint.offline.change import ChangeError, CheckpointBusyError
from sessionstore.checkpoint.partition.provider import CheckpointMismatchError
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.encoding.spark_hash import partition_ids
from sessionstore.operators.aggregations import Aggregations, record_output_plan
from sessionstore.stores import closing
from sessionstore.tools.reader import CheckpointSource, store_rows

SPECS = [StoreSpec("sessions", "session", 10**9), StoreSpec("counts", "kv", 0)]
AGG = Aggregations({"n": "count", "total": ("sum", "amount"), "mean": ("avg", "amount"),
                    "top": ("max", "amount")})  # fmt: skip
KEYS = [f"user-{i}" for i in range(12)]
VERSIONS = 5
PARTS = 3


def _acc(amounts):
    acc = AGG.initializer()
    for a in amounts:
        acc = AGG.add("k", {"amount": a}, 0, acc)
    return acc


def write_source(uri, local):
    """Operator "op": per version, a session of each key (amounts from the key and
    the version), a kv row each, and a block of sessions kept to close in the last."""
    owner = partition_ids([KEYS], ["string"], PARTS).tolist()
    for p in range(PARTS):
        provider = StateStoreProvider(uri, "op", p, SPECS, local, snapshot_interval=2,
                                      num_partitions=PARTS, key_types=["string"])  # fmt: skip
        for v in range(VERSIONS):
            h = provider.get_store(v)
            record_output_plan(h["sessions"], AGG, "acc")
            mine = [(i, k) for i, k in enumerate(KEYS) if owner[i] == p]
            for i, key in mine:
                t = v * 1000 + i
                h["sessions"].put(key, t, t + 5, _acc([i, v, 1]))
                h["sessions"].end_index().add(h["sessions"].encode_key(key), t, t + 5)
                h["counts"].put(key, v)
            if v == VERSIONS - 1 and mine:
                store = h["sessions"]
                starts = [50_000 + i for i, _ in mine]
                store.closing_sessions().add_many(
                    [store.encode_key(k) for _, k in mine], starts, [s + 9 for s in starts],
                    [msgpack.packb(_acc([i, 100])) for i, _ in mine],
                )  # fmt: skip
            h.note_event_time(100 + v)
            h.commit()
        provider.do_maintenance()
        provider.close()


def sessions(uri, raw=False):
    rows = store_rows(CheckpointSource(uri), "op", "sessions", raw=raw)
    return sorted(repr(r) for r in rows)


def files(uri):
    op = open_filesystem(uri).child("op")
    return {rel: op.read(rel) for rel in op.list_files()}


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setattr(closing, "BLOCK_SESSIONS", 2)  # kept sessions span blocks
    uri = f"file://{tmp_path}/src"
    write_source(uri, str(tmp_path / "local"))
    return uri


def double_total(row):
    row["value"]["total"] *= 2
    return row


def test_doubling_one_aggregate_of_every_session(source, tmp_path):
    before = list(store_rows(CheckpointSource(source), "op", "sessions"))
    assert len(before) == len(KEYS) * (VERSIONS + 1)  # the kept ones too
    done = rewrite(source, "op", double_total, quiet_s=0)
    assert (done["rows"], done["changed"], done["deleted"]) == (len(before), len(before), 0)
    assert done["version"] == VERSIONS and done["store"] == "sessions"
    after = list(store_rows(CheckpointSource(source), "op", "sessions"))
    expected = [{**r, "value": {**r["value"], "total": 2 * r["value"]["total"]}} for r in before]
    assert sorted(map(repr, after)) == sorted(map(repr, expected))
    # the accumulator: the sum's slot doubled, the average's (count, sum) as it was
    raw = {(r["key"], r["start"]): r["value"] for r in
           store_rows(CheckpointSource(source), "op", "sessions", raw=True)}  # fmt: skip
    for r in before:
        n, total, mean, top = raw[r["key"], r["start"]]
        assert total == 2 * r["value"]["total"] and n == r["value"]["n"]
        assert mean[0] == n and mean[1] == pytest.approx(r["value"]["total"])
    # the restarted partitions merge into the doubled sums
    for p in range(PARTS):
        provider = StateStoreProvider(source, "op", p, SPECS, str(tmp_path / "local"))
        h = provider.get_store(VERSIONS)
        for window, acc in h["sessions"].fetch_range(None, None):
            assert acc == raw[window.key, window.start]
        h.abort()
        provider.close()


def test_a_deleted_row_leaves_no_session_and_no_index_entry(source, tmp_path):
    gone = {"user-3", "user-4"}
    done = rewrite(source, "op", lambda r: None if r["key"] in gone else r, quiet_s=0)
    assert (done["changed"], done["deleted"]) == (0, len(gone) * (VERSIONS + 1))
    left = list(store_rows(CheckpointSource(source), "op", "sessions"))
    assert {r["key"] for r in left} == set(KEYS) - gone
    indexed = []
    for p in range(PARTS):
        provider = StateStoreProvider(source, "op", p, SPECS, str(tmp_path / "local"))
        store = provider.get_store(VERSIONS)["sessions"]
        indexed += [store.decode_key(kb) for _, _, kb in store.end_index().all()]
        provider.close()
    assert sorted(indexed) == sorted(k for k in KEYS if k not in gone for _ in range(VERSIONS))


@pytest.mark.parametrize(
    "fn, words",
    [
        (
            lambda r: {**r, "value": {**r["value"], "total": "lots"}},
            "aggregate 'total' (sum) holds int values; got str 'lots'",
        ),
        (lambda r: {**r, "value": {**r["value"], "n": -1}}, "not a count"),
        (
            lambda r: {**r, "value": {**r["value"], "mean": 1e9}},
            "'mean' (avg) cannot be set from its result",
        ),
        (lambda r: {**r, "start": r["start"] + 1}, "fn changed 'start'"),
        (lambda r: {**r, "value": {"total": 1}}, "the value's aggregates are ['total']"),
        (lambda r: 7, "fn returned 7, not a row"),
        (lambda r: r["value"]["total"] / 0, "fn raised ZeroDivisionError: division by zero"),
    ],
)
def test_a_row_the_store_cannot_hold_is_refused_before_anything_is_written(source, fn, words):
    before = files(source)
    calls = []

    def late(row):  # the bad row comes last: every partition was read before it
        calls.append(row)
        return fn(row) if len(calls) == len(KEYS) * (VERSIONS + 1) else row

    with pytest.raises(ChangeError, match="row key=") as refused:
        rewrite(source, "op", late, quiet_s=0)
    assert words in str(refused.value)
    assert files(source) == before  # not one object written, changed or deleted


def test_other_stores_and_unknown_stores_are_refused(source):
    with pytest.raises(ChangeError, match="'counts' of .* is a kv store"):
        rewrite(source, "op", lambda r: r, store="counts", quiet_s=0)
    with pytest.raises(ChangeError, match="no store 'nope'"):
        rewrite(source, "op", lambda r: r, store="nope", quiet_s=0)


def test_a_checkpoint_committed_to_recently_is_refused(source):
    before = files(source)
    with pytest.raises(CheckpointBusyError, match="a query seems to hold the checkpoint"):
        rewrite(source, "op", double_total)
    assert files(source) == before


_KILLER = """
import os, signal, sys
import sessionstore.checkpoint.offline.change as change
from sessionstore import rewrite
from tests.tools.test_rewrite import double_total
step, at = sys.argv[2], int(sys.argv[3])
original = getattr(change, step)
calls = []
def dying(*args, **kw):
    calls.append(1)
    if len(calls) == at:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*args, **kw)
setattr(change, step, dying)
rewrite(sys.argv[1], "op", double_total, quiet_s=0)
"""


@pytest.mark.parametrize("step, at", [("_stage_partition", 2), ("_apply_partition", 2)])
def test_kill_9_leaves_the_old_or_the_new_state(source, tmp_path, step, at):
    before = sessions(source, raw=True)
    run = subprocess.run(
        [sys.executable, "-c", _KILLER, source, step, str(at)],
        capture_output=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )  # fmt: skip
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()
    if step == "_stage_partition":  # before the commit point: the old state, exactly
        assert sessions(source, raw=True) == before
    else:  # after it: refused until finished
        with pytest.raises(CheckpointMismatchError, match="committed but not applied"):
            StateStoreProvider(source, "op", 0, SPECS, str(tmp_path / "q"))
    done = rewrite(source, "op", double_total, quiet_s=0)  # the rerun
    assert (done["resumed"] is None) == (step == "_stage_partition")
    doubled = {(r["key"], r["start"]): r["value"]["total"]
               for r in store_rows(CheckpointSource(source), "op", "sessions")}  # fmt: skip
    rows = [eval(r) for r in before]  # noqa: S307 - reprs of ints, strs and lists
    assert doubled == {(r["key"], r["start"]): 2 * r["value"][1] for r in rows}
    assert not open_filesystem(source).child("op").list_dirs("_changes")


@pytest.mark.slow
def test_a_rerun_finishes_only_its_own_interrupted_rewrite(source, monkeypatch):
    """A rewrite that died after its commit point is finished by the next rewrite:
    the same function is not applied twice, and another function of the same name
    (two lambdas) is applied after it, not taken for it."""
    from sessionstore.checkpoint.offline import change

    finish = change.finish_change

    def driver_dies(*args):
        raise SystemExit("the driver died after the commit point")

    def first_rewrite(uri, fn):
        monkeypatch.setattr(change, "finish_change", driver_dies)
        with pytest.raises(SystemExit):
            rewrite(uri, "op", fn, store="sessions", force=True)
        monkeypatch.setattr(change, "finish_change", finish)

    def copy(suffix):
        uri = f"{source}-{suffix}"
        write_source(uri, source.removeprefix("file://") + f"-local-{suffix}")
        return uri

    keep, drop = (lambda row: row), (lambda row: None)
    assert keep.__qualname__ == drop.__qualname__
    first_rewrite(source, keep)
    result = rewrite(source, "op", drop, store="sessions", force=True)
    assert result["resumed"] is not None and sessions(source) == []

    interrupted, whole = copy("interrupted"), copy("whole")
    rewrite(whole, "op", double_total, store="sessions", force=True)
    first_rewrite(interrupted, double_total)
    assert rewrite(interrupted, "op", double_total, store="sessions", force=True)["resumed"]
    assert sessions(interrupted) == sessions(whole)  # doubled once
