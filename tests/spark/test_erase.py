"""Erasing keys on real Spark: a query stopped after 3 micro-batches, keys erased,
restarted with the same local directory, against a run whose input never had
those keys; and an erase attempted while the query runs."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from sessionstore import erase
from sessionstore.checkpoint.offline.change import CheckpointBusyError
from spark_integration import StateBackend
from tests.spark.shared_runs import SharedRuns
from tests.spark.streams import run_stream
from tests.spark.test_repartition import _batches, _query, file_steps

pytestmark = pytest.mark.slow

#: the files of _batches fed: 3 before the stop, 1 after it, then the 2 that close
#: every session and window (the claim is about what the restart carries over,
#: not about how many files follow it)
DATA_FILES = 4
#: users u=1 and u=4 of _batches: their user names and uids
GONE_USERS, GONE_UIDS = ("ü1", "ü4"), (-7920, -31677)
KEYS = {
    "sessions": list(zip(GONE_USERS, GONE_UIDS, strict=True)),
    "windows": list(GONE_USERS),
    "join": list(GONE_UIDS),
}


def _without_keys(batches):
    return [[r for r in rows if r["uid"] not in GONE_UIDS] for rows in batches]


def _stopped_and_restarted(spark, tmp_path, operator, name, rows, between, running=None):
    """``operator``'s query (4 partitions) over the first 3 files of ``rows``, then
    stopped, ``between(checkpoint_uri)``, and restarted over the others: the rows
    the restarted query emitted. ``running(checkpoint_uri)``, if given, is called
    as the first run's last step, while the query runs."""
    backend = StateBackend(f"file://{tmp_path}/{name}", local_dir=str(tmp_path / f"l-{name}"))
    folder, checkpoint = tmp_path / f"in-{name}", tmp_path / f"ck-{name}"
    steps = file_steps(rows, folder, range(3))
    if running is not None:
        steps.append(functools.partial(running, backend.checkpoint_uri))
    query = _query(spark, folder, backend, 4, operator)
    run_stream(query, checkpoint, steps)
    between(backend.checkpoint_uri)
    query = _query(spark, folder, backend, 4, operator)
    return run_stream(query, checkpoint, file_steps(rows, folder, range(3, len(rows))))


def _erased_run(spark, operator, tmp_path):
    """The run of ``operator`` whose keys are erased between its stop and its
    restart (its first 3 files carry them, the others do not), as
    ``{"rows": ..., "erased": erase's answer, "refused": [...]}``. For "sessions",
    the first run's last step, while the query runs, also attempts the erase
    without ``force``; "refused" holds the messages of the CheckpointBusyError it
    met (test_an_erase_while_the_query_runs_is_refused)."""
    batches = _batches(count=DATA_FILES)
    out = {"refused": []}

    def erase_now(uri):
        try:
            erase(uri, "sessions", key=KEYS["sessions"])
        except CheckpointBusyError as exc:
            out["refused"].append(str(exc))

    def erase_keys(uri):
        out["erased"] = erase(uri, operator, key=KEYS[operator], force=True)

    out["rows"] = _stopped_and_restarted(
        spark, tmp_path, operator, "erased", batches[:3] + _without_keys(batches)[3:],
        erase_keys, running=erase_now if operator == "sessions" else None,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def erased(spark, tmp_path_factory):
    """``erased(operator)``: :func:`_erased_run` of ``operator``, run once for the
    module. test_an_erase_while_the_query_runs_is_refused reads the "sessions" run,
    which is its query (sessionize at 4 partitions over the first 3 files of
    _batches, without due batches, while it runs): an erase refused there must
    change nothing, which the restarted run's comparison and the forced erase
    after the stop check; test_the_restarted_query_continues_as_if_the_keys_never_came
    reads every operator's."""
    runs = SharedRuns(tmp_path_factory)

    def run(operator):
        return runs.get(operator, functools.partial(_erased_run, spark, operator))

    return run


@pytest.mark.parametrize("operator", ["sessions", "windows", "join"])
def test_the_restarted_query_continues_as_if_the_keys_never_came(spark, tmp_path, operator, erased):
    batches = _batches(count=DATA_FILES)
    assert any(r["uid"] in GONE_UIDS for r in batches[0] + batches[1] + batches[2])
    expected = _stopped_and_restarted(
        spark, tmp_path, operator, "clean", _without_keys(batches), lambda uri: None
    )
    assert len(expected) > 10

    # the keys' rows before the erase only: what their state would carry on
    run = erased(operator)
    done = run["erased"]
    assert done["version"] == 3 and sum(done["rows"].values()) > 0
    missing = Counter(map(str, expected)) - Counter(map(str, run["rows"]))
    extra = Counter(map(str, run["rows"])) - Counter(map(str, expected))
    assert (missing, extra) == (Counter(), Counter())


def test_an_erase_while_the_query_runs_is_refused(erased):
    run = erased("sessions")
    outcome = run["refused"]
    assert len(outcome) == 1 and "a query seems to hold the checkpoint" in outcome[0]
    # nothing changed: the erased keys' state is still there once the query stopped
    assert run["erased"]["rows"]["sessions"] > 0


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
