"""When a partition's pending timers and TTL expiries fall due, recorded in the
changelog header.

A processor's timers and TTL expiries fire in the first batch whose time passes
them; on a quiet stream nothing starts that batch unless something outside the
tasks knows when it is due. So every commit of a ``transform_with_state``
partition records, in its changelog header (no request of its own, never out of
step with the state it describes):

* :data:`DUE_PROCESSING_FIELD`: the earliest processing time (ms) at which a
  batch has something to do: the earliest pending processing-time timer, or the
  earliest TTL expiry of a value (None when there is neither);
* :data:`DUE_EVENT_FIELD`: the shared event time (ms) from which the next batch
  fires the earliest pending event-time timer: its expiry plus the watermark
  delay, because a batch's watermark is the shared event time minus the delay
  (None when no event-time timer is pending).

The due source (spark_integration/planning/due_timers.py) reads them back, once
per committed batch and partition, with the event time in the same header.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sessionstore.checkpoint.records.event_time import (
    EVENT_TIME_FIELD,
    READ_THREADS,
    max_event_time,
    partition_event_time,
)
from sessionstore.checkpoint.records.layout import partition_changelog_header, recorded_time
from sessionstore.checkpoint.storage.filesystem import Storage

__all__ = [
    "DUE_PROCESSING_FIELD",
    "DUE_EVENT_FIELD",
    "Deadlines",
    "partition_deadlines",
    "operator_deadlines",
]

#: The changelog header field: the earliest processing time a batch has work at.
DUE_PROCESSING_FIELD = "due_processing_time"
#: The changelog header field: the shared event time from which a batch has work.
DUE_EVENT_FIELD = "due_event_time"


@dataclass(frozen=True)
class Deadlines:
    """What partitions recorded after a batch: their (largest) event time, and the
    earliest processing time and shared event time at which a batch has work
    (None: never, until new input)."""

    event_time: int | None = None
    processing: int | None = None
    event: int | None = None

    def due(self, now_ms: int) -> bool:
        """Whether the batch after this one has work when it starts at ``now_ms``
        (wall clock) from the shared event time recorded here."""
        if self.processing is not None and self.processing <= now_ms:
            return True
        return (
            self.event is not None
            and self.event_time is not None
            and (self.event <= self.event_time)
        )


def _least(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def partition_deadlines(operator_storage: Storage, batch_id: int, partition: int) -> Deadlines:
    """What ``partition`` recorded after ``batch_id``: the header of its changelog of
    version ``batch_id + 1`` (one ranged read). A partition without that changelog
    (a repartitioned copy starts from a snapshot) recorded no deadline, so it is
    taken as due at once: one batch then records them."""
    try:
        header = partition_changelog_header(operator_storage, partition, batch_id + 1)
    except FileNotFoundError:
        event_time = partition_event_time(operator_storage, batch_id, partition)
        return Deadlines(event_time, processing=0, event=None)
    return Deadlines(
        recorded_time(header, EVENT_TIME_FIELD),
        recorded_time(header, DUE_PROCESSING_FIELD),
        recorded_time(header, DUE_EVENT_FIELD),
    )


def operator_deadlines(operator_storage: Storage, batch_id: int, num_partitions: int) -> Deadlines:
    """The shared event time after ``batch_id`` and the earliest deadlines of the
    operator's ``num_partitions`` partitions: one ranged read per partition,
    several at once (``MissingEventTimeError`` while a partition has not
    committed the batch)."""
    if batch_id < 0:
        return Deadlines()
    with ThreadPoolExecutor(min(READ_THREADS, num_partitions)) as pool:
        parts = list(
            pool.map(
                lambda p: partition_deadlines(operator_storage, batch_id, p),
                range(num_partitions),
            )
        )
    return Deadlines(
        max_event_time(d.event_time for d in parts),
        _least([d.processing for d in parts]),
        _least([d.event for d in parts]),
    )
