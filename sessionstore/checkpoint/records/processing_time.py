"""The processing time of a batch in a partition without rows, recorded in the
changelog header.

A partition with rows takes the batch's processing time from its input (Spark's
``current_timestamp()``, fixed per batch in the offset log, so a replay sees the
same). A partition without rows has no such column and takes the wall clock; a
replay of the batch (a restart after the sink took the batch's output but before
Spark recorded the batch as done) must see the time of the first run, or timers
and TTL would decide differently from the output the sink kept. So the commit
records the time in its changelog header (:data:`PROCESSING_TIME_FIELD`): no
request of its own, and never out of step with the state it describes. It is
read back, with one ranged read, only by a task that may be such a replay.
"""

from __future__ import annotations

from sessionstore.checkpoint.records.layout import partition_changelog_header, recorded_time
from sessionstore.checkpoint.storage.filesystem import Storage

__all__ = ["PROCESSING_TIME_FIELD", "recorded_processing_time"]

#: The changelog header field holding the batch's processing time in ms.
PROCESSING_TIME_FIELD = "processing_time"


def recorded_processing_time(
    operator_storage: Storage, batch_id: int, partition: int
) -> int | None:
    """The processing time ``partition`` used in ``batch_id``: the header field of
    its changelog of version ``batch_id + 1`` (one ranged read). None when the
    batch was never committed there, or its changelog records no time (nothing was
    recorded: the caller takes the time)."""
    try:
        header = partition_changelog_header(operator_storage, partition, batch_id + 1)
    except FileNotFoundError:
        return None
    return recorded_time(header, PROCESSING_TIME_FIELD)
