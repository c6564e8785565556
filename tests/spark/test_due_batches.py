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
