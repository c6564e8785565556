"""Event time shared by the partitions of an operator, recorded in the changelogs.

Sessions and windows must close in partitions that receive no data once the
query's event time passes them, and a replayed batch must see the same time. So
before batch N+1 every partition advances to the largest event time any
partition had after batch N, and that value is fixed once batch N has run:

* **The durable record** is the ``event_time`` field of the header of each
  partition's changelog of version N+1 (:data:`EVENT_TIME_FIELD`), the largest
  event time the partition had seen after batch N (None before any). It is
  written by the commit itself, so it costs no request of its own and can never
  disagree with the state it describes. A partition whose version N+1 has no
  changelog (a repartitioned copy starts from snapshots) has the value in
  ``event_time/<N>/<partition>`` instead, written by the repartition.
* **The fast path** is a coordinator (in Spark, on the driver) that each task
  tells its event time once its commit is durable, and that each task of the
  next batch asks: no object-store request per task. When the coordinator lacks
  reports (it restarted, a report was lost) it reads the durable records once
  per batch, :func:`durable_event_time`; a task that cannot reach it reads them
  itself. Both paths give the same answer, the maximum of the durable records.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sessionstore.checkpoint.records.layout import (
    changelog_name,
    event_time_name,
    manifest_name,
    partition_changelog_header,
    recorded_time,
)
from sessionstore.checkpoint.storage.filesystem import Storage
from sessionstore.encoding.ints import INT64 as _I64
from sessionstore.errors import SessionStoreError

__all__ = [
    "EVENT_TIME_FIELD",
    "MissingEventTimeError",
    "partition_event_time",
    "durable_event_time",
    "max_event_time",
]

#: The changelog header field holding a partition's event time after the batch.
EVENT_TIME_FIELD = "event_time"
#: Partitions read at once by :func:`durable_event_time` (I/O bound: pyarrow
#: releases the GIL while it waits).
READ_THREADS = 16


class MissingEventTimeError(SessionStoreError, LookupError):
    """A partition has no durable record of its event time after a batch."""


def partition_event_time(operator_storage: Storage, batch_id: int, partition: int) -> int | None:
    """The event time ``partition`` recorded after ``batch_id``: the header field of
    its changelog of version ``batch_id + 1`` (one ranged read), or, for a partition
    without that changelog (a repartitioned copy), the ``event_time/<batch>/<partition>``
    file the repartition wrote (None when that partition had none)."""
    rel = f"{partition}/{changelog_name(batch_id + 1)}"
    try:
        header = partition_changelog_header(operator_storage, partition, batch_id + 1)
    except FileNotFoundError:
        # a partition that starts from a snapshot of this version with no changelog
        # (a repartitioned checkpoint) has the repartition's file, or had no event time
        try:
            return _I64.unpack(operator_storage.read(event_time_name(batch_id, partition)))[0]
        except FileNotFoundError:
            if operator_storage.exists(f"{partition}/{manifest_name(batch_id + 1)}"):
                return None
        raise MissingEventTimeError(
            f"{operator_storage.where(rel)} does not exist: partition {partition} has no "
            f"record of its event time after batch {batch_id} (was the batch run, or "
            f"the changelog pruned?)"
        ) from None
    return recorded_time(header, EVENT_TIME_FIELD)


def max_event_time(times: Any) -> int | None:
    """The largest of ``times``, skipping None (None if none is known)."""
    known = [t for t in times if t is not None]
    return max(known) if known else None


def durable_event_time(operator_storage: Storage, batch_id: int, num_partitions: int) -> int | None:
    """The largest event time any of the ``num_partitions`` partitions recorded
    after ``batch_id`` (None before the first batch, or if none had any): one
    ranged read per partition, several at once, no listing."""
    if batch_id < 0:
        return None
    if num_partitions == 1:
        return partition_event_time(operator_storage, batch_id, 0)
    with ThreadPoolExecutor(min(READ_THREADS, num_partitions)) as pool:
        times = pool.map(
            lambda p: partition_event_time(operator_storage, batch_id, p), range(num_partitions)
        )
        return max_event_time(list(times))
