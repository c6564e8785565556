"""The due source's offsets (spark_integration/planning/due_batches.py), read from a
real checkpoint the way Spark's source worker reads it, without Spark: an offset
advances exactly after a batch that moved the shared event time, never otherwise
(no busy loop), and a fresh reader (a restart) answers as the first one did."""

from __future__ import annotations

import pickle

from sessionstore import StateStoreProvider, StoreSpec
from spark_integration import StateBackend
from spark_integration.planning.due_batches import OFFSET_FIELD, DueTimes

SPECS = [StoreSpec("sessions", "session", 10**12)]
PARTITIONS = 2


def commit(backend: StateBackend, batch: int, times: list[int | None]) -> None:
    """Batch ``batch`` on every partition, partition p recording ``times[p]``."""
    for partition, event_time in enumerate(times):
        provider = StateStoreProvider(
            backend.checkpoint_uri, "op", partition, SPECS, backend.local_dir,
            num_partitions=PARTITIONS,
        )  # fmt: skip
        handle = provider.get_store(batch)
        handle.note_event_time(event_time)
        handle.commit()
        provider.close()


def offset(value: int) -> dict:
    return {OFFSET_FIELD: value}


def test_an_offset_moves_only_after_a_batch_that_moved_the_event_time(tmp_path):
    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    times = DueTimes(backend, "op", PARTITIONS)
    start = offset(-1)
    assert times.latest(start) == start  # nothing committed
    commit(backend, 0, [None, None])  # a batch without event time: nothing due
    assert times.latest(start) == start
    commit(backend, 1, [1_000, None])  # the event time moved: batch 2 is due
    assert times.latest(start) == offset(1)
    start = offset(1)
    assert times.latest(start) == start  # asked again before batch 2 ran
    commit(backend, 2, [1_000, 900])  # the due batch: no partition moved past 1000
    assert times.latest(start) == start
    assert times.latest(start) == start  # and never after it: no busy loop
    commit(backend, 3, [1_000, 5_000])  # rows moved it again
    assert times.latest(start) == offset(3)
    # a restarted reader (pickled, as Spark ships it) answers the same from the
    # checkpoint alone, and a batch not committed on every partition is no answer
    fresh = pickle.loads(pickle.dumps(times))
    assert fresh.latest(offset(3)) == offset(3)
    assert fresh.latest(offset(1)) == offset(3)
    provider = StateStoreProvider(
        backend.checkpoint_uri, "op", 0, SPECS, backend.local_dir, num_partitions=PARTITIONS
    )
    handle = provider.get_store(4)
    handle.note_event_time(9_000)
    handle.commit()
    provider.close()
    assert fresh.latest(offset(3)) == offset(3)  # partition 1 has not run batch 4


def test_a_driver_that_cannot_run_the_source_leaves_it_out_or_refuses(spark, tmp_path, monkeypatch):
    """With PYSPARK_PYTHON naming a path only executors have (a shipped archive in
    client mode), a new checkpoint runs without the due source and warns; one that
    has the source refuses to start, naming the path, instead of Spark's
    ``Cannot run program``."""
    import pytest

    from spark_integration.planning.due_batches import (
        DueSourceUnrunnable,
        driver_python_problem,
        with_due_batches,
    )
    from tests.spark.streams import json_source, write_json

    assert driver_python_problem(spark) is None
    source = tmp_path / "in"
    write_json(source, 0, [{"user": "a", "ts": 1}])
    df = json_source(spark, source, "user string, ts long")
    marked = StateBackend(f"file://{tmp_path}/marked", local_dir=str(tmp_path / "l1"))
    assert with_due_batches(df, marked, "op", 2) is not df  # marker written

    monkeypatch.setattr(spark.sparkContext, "pythonExec", "./environment/bin/python")
    problem = driver_python_problem(spark)
    assert problem is not None and "'./environment/bin/python'" in problem
    fresh = StateBackend(f"file://{tmp_path}/fresh", local_dir=str(tmp_path / "l2"))
    with pytest.warns(UserWarning, match="'op' runs without due batches.*environment/bin/python"):
        assert with_due_batches(df, fresh, "op", 2) is df
    assert not (tmp_path / "fresh" / "op" / "due_batches").exists()
    with pytest.raises(
        DueSourceUnrunnable, match="'op'.*reads a due source.*environment/bin/python"
    ):
        with_due_batches(df, marked, "op", 2)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "no-such-python-3")
    assert "'no-such-python-3'" in driver_python_problem(spark)
