"""Erasing keys on real Spark: a query stopped after 3 micro-batches, keys erased,
restarted with the same local directory, against a run whose input never had
those keys; and an erase attempted while the query runs."""

from __future__ import annotations

from collections import Counter

import pytest

from sessionstore import erase
from sessionstore.checkpoint.offline.change import CheckpointBusyError
from spark_integration import StateBackend
from tests.spark.streams import drive, run_stream
from tests.spark.test_repartition import _batches, _query, file_steps

pytestmark = pytest.mark.slow

#: users u=1 and u=4 of _batches: their user names and uids
GONE_USERS, GONE_UIDS = ("ü1", "ü4"), (-7920, -31677)
KEYS = {
    "sessions": list(zip(GONE_USERS, GONE_UIDS, strict=True)),
    "windows": list(GONE_USERS),
    "join": list(GONE_UIDS),
}


def _without_keys(batches):
    return [[r for r in rows if r["uid"] not in GONE_UIDS] for rows in batches]


@pytest.mark.parametrize("operator", ["sessions", "windows", "join"])
def test_the_restarted_query_continues_as_if_the_keys_never_came(spark, tmp_path, operator):
    batches = _batches()
    assert any(r["uid"] in GONE_UIDS for r in batches[0] + batches[1] + batches[2])

    def stopped_and_restarted(name, rows, between):
        backend = StateBackend(f"file://{tmp_path}/{name}", local_dir=str(tmp_path / f"l-{name}"))
        folder, checkpoint = tmp_path / f"in-{name}", tmp_path / f"ck-{name}"
        query = _query(spark, folder, backend, 4, operator)
        run_stream(query, checkpoint, file_steps(rows, folder, range(3)))
        between(backend.checkpoint_uri)
        query = _query(spark, folder, backend, 4, operator)
        return run_stream(query, checkpoint, file_steps(rows, folder, range(3, 8)))

    expected = stopped_and_restarted("clean", _without_keys(batches), lambda uri: None)
    assert len(expected) > 10

    def erase_keys(uri):
        done = erase(uri, operator, key=KEYS[operator], force=True)
        assert done["version"] == 3 and sum(done["rows"].values()) > 0

    # the keys' rows before the erase only: what their state would carry on
    got = stopped_and_restarted("erased", batches[:3] + _without_keys(batches)[3:], erase_keys)
    missing = Counter(map(str, expected)) - Counter(map(str, got))
    extra = Counter(map(str, got)) - Counter(map(str, expected))
    assert (missing, extra) == (Counter(), Counter())


def test_an_erase_while_the_query_runs_is_refused(spark, tmp_path):
    batches = _batches()
    backend = StateBackend(f"file://{tmp_path}/ckpt", local_dir=str(tmp_path / "local"))
    folder = tmp_path / "in"
    query = _query(spark, folder, backend, 4, "sessions")
    outcome = []

    def erase_now():
        try:
            erase(backend.checkpoint_uri, "sessions", key=KEYS["sessions"])
        except CheckpointBusyError as exc:
            outcome.append(str(exc))

    steps = file_steps(batches, folder, range(3)) + [erase_now]
    stream = (
        query.writeStream.outputMode("append")
        .option("checkpointLocation", str(tmp_path / "spark-ck"))
        .foreachBatch(lambda batch, _: batch.count())  # runs the operator
        .start()
    )
    drive(stream, steps)
    assert len(outcome) == 1 and "a query seems to hold the checkpoint" in outcome[0]
    # nothing changed: the erased keys' state is still there once the query stopped
    done = erase(backend.checkpoint_uri, "sessions", key=KEYS["sessions"], force=True)
    assert done["rows"]["sessions"] > 0


def test_transform_with_state_continues_as_if_the_keys_never_came(spark, tmp_path):
    from spark_integration import transform_with_state
    from tests.spark import processors as P
    from tests.spark.streams import json_source, write_json
    from tests.spark.test_transform_with_state import BATCHES, SCHEMA, _run

    gone = ("a", "b")  # value, list and map state each (P.RowTracker)
    # "a" comes back in the third batch: it must start from nothing
    assert any(r["id"] == "a" for r in BATCHES[2])
    clean = [[r for r in rows if r["id"] not in gone] for rows in BATCHES[:2]] + BATCHES[2:]

    def stopped_and_restarted(tag, batches, between):
        backend = StateBackend(f"file://{tmp_path}/{tag}", local_dir=str(tmp_path / f"l-{tag}"))
        src = tmp_path / f"in-{tag}"

        def run(part):
            df = json_source(spark, src, SCHEMA)
            steps = [lambda i=i: write_json(src, i, batches[i]) for i in part]
            out = transform_with_state(
                df, "id", P.RowTracker(), P.OUT_SCHEMA, backend=backend, name="t",
                num_partitions=2,
            )  # fmt: skip
            return _run(out, tmp_path / f"ck-{tag}", steps)

        run(range(2))
        between(backend.checkpoint_uri)
        return run(range(2, 3))

    expected = stopped_and_restarted("clean", clean, lambda uri: None)
    assert expected

    def erase_keys(uri):
        done = erase(uri, "t", key=list(gone), force=True)
        assert done["version"] == 2 and sum(done["rows"].values()) > 0

    got = stopped_and_restarted("erased", BATCHES, erase_keys)
    assert sorted(got) == sorted(expected)
