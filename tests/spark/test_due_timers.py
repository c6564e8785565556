"""The due source's offsets for processor timers and TTL
(spark_integration/planning/due_timers.py), read from a real checkpoint the way
Spark's source worker reads it, without Spark: an offset advances exactly when a
recorded processing-time deadline is passed by the clock or an event-time one by
the shared event time, never otherwise (no busy loop), and a fresh reader (a
restart) answers as the first one did."""

from __future__ import annotations

import pickle

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.records.deadlines import Deadlines, operator_deadlines
from spark_integration import StateBackend
from spark_integration.planning import due_timers
from spark_integration.planning.due_batches import OFFSET_FIELD
from spark_integration.planning.due_timers import DueTimers

SPECS = [StoreSpec("processor", "processor", 0)]
PARTITIONS = 2


def commit(backend: StateBackend, batch: int, records: list[tuple]) -> None:
    """Batch ``batch`` on every partition, partition p recording ``records[p]``:
    ``(event time, processing deadline, event deadline)``."""
    for partition, (event_time, processing, event) in enumerate(records):
        provider = StateStoreProvider(
            backend.checkpoint_uri, "op", partition, SPECS, backend.local_dir,
            num_partitions=PARTITIONS,
        )  # fmt: skip
        handle = provider.get_store(batch)
        handle.note_event_time(event_time)
        handle.note_deadlines(processing, event)
        handle.commit()
        provider.close()


def offset(value: int) -> dict:
    return {OFFSET_FIELD: value}


def test_processing_deadlines_make_a_batch_due_once_the_clock_passes_them(tmp_path, monkeypatch):
    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    clock = [10_000]
    monkeypatch.setattr(due_timers, "now_ms", lambda: clock[0])
    times = DueTimers(backend, "op", PARTITIONS)
    start = offset(-1)
    assert times.latest(start) == start  # nothing committed
    commit(backend, 0, [(None, None, None), (None, 15_000, None)])
    assert operator_deadlines(times.storage(), 0, PARTITIONS) == Deadlines(None, 15_000, None)
    assert times.latest(start) == start  # pending, not due
    clock[0] = 14_999
    assert times.latest(start) == start
    clock[0] = 15_000  # Spark's test is inclusive
    assert times.latest(start) == offset(0)
    start = offset(0)
    assert times.latest(start) == start  # asked again before batch 1 ran
    commit(backend, 1, [(None, 20_000, None), (None, None, None)])  # the due batch
    clock[0] = 19_000
    assert times.latest(start) == start  # and nothing after it until the clock passes
    assert times.latest(start) == start
    fresh = pickle.loads(pickle.dumps(times))  # a restarted reader, as Spark ships it
    assert fresh.latest(start) == start
    clock[0] = 20_001
    assert fresh.latest(start) == offset(1)
    assert times.latest(start) == offset(1)


def test_event_deadlines_make_a_batch_due_once_the_event_time_passes_them(tmp_path, monkeypatch):
    backend = StateBackend(f"file://{tmp_path}/ck", local_dir=str(tmp_path / "local"))
    monkeypatch.setattr(due_timers, "now_ms", lambda: 10**13)
    times = DueTimers(backend, "op", PARTITIONS)
    start = offset(-1)
    # partition 1 has a timer whose batch fires it once the shared event time
    # reaches 5000 (its expiry plus the delay); the event time is 4000
    commit(backend, 0, [(4_000, None, None), (1_000, None, 5_000)])
    assert times.latest(start) == start
    commit(backend, 1, [(4_000, None, None), (4_999, None, 5_000)])
    assert times.latest(start) == start
    commit(backend, 2, [(5_000, None, None), (1_000, None, 5_000)])  # partition 0's rows
    assert times.latest(start) == offset(2)
    start = offset(2)
    commit(backend, 3, [(5_000, None, None), (5_000, None, None)])  # fired
    assert times.latest(start) == start
    # a partition not yet committed is no answer: asked again at the next trigger
    provider = StateStoreProvider(
        backend.checkpoint_uri, "op", 0, SPECS, backend.local_dir, num_partitions=PARTITIONS
    )
    handle = provider.get_store(4)
    handle.note_event_time(9_000)
    handle.note_deadlines(0, None)
    handle.commit()
    provider.close()
    assert times.latest(start) == start
