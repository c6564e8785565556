"""Due batches for ``transform_with_state``: a micro-batch when a processor's timer
or TTL expiry falls due, when no row arrives.

The operator unions the due source of spark_integration/planning/due_batches.py
into its input before its shuffle, with :class:`DueTimers` deciding when its
offset advances. Each partition's commit records when it next has work without
input (sessionstore/checkpoint/records/deadlines.py): the earliest processing time (a
processing-time timer, a TTL expiry) and the earliest shared event time (an
event-time timer's expiry plus the watermark delay). Something is due after the
newest committed batch ``b`` when

* the earliest processing-time deadline of any partition is at or before the
  wall clock now (the batch's tasks, which have no rows, take the wall clock
  when they run, later still, so the timer fires in it), or
* the earliest event-time deadline is at or before the shared event time after
  ``b``: batch ``b + 1``'s watermark passes the timer.

Spark's own operator runs a batch after every watermark move in event time; this
one runs one only when a timer or an expiry is due. The records are read once per committed batch (one ranged read per
partition, made by the source's worker on the driver); an idle trigger costs one
existence check, plus a clock comparison.

Exactly-once as for every due batch: the offset is ``{"due_after": b}``, a
function of the checkpoint and of the wall clock at the trigger, recorded in
Spark's offset log; a replayed due-only batch loads the same version and takes
the processing time its first run recorded (processing_time.py), so it fires the
same timers and emits the same rows. No busy loop: after the due batch ``b + 1``
the deadlines it records are later than its time (what it fired is gone, TTL
values expire after the batch that wrote them), so nothing is due again until the
clock or new input passes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sessionstore.checkpoint.records.deadlines import Deadlines, operator_deadlines
from spark_integration.planning.due_batches import DueTimes

__all__ = ["DueTimers"]


def now_ms() -> int:
    """The wall clock in ms."""
    return int(time.time() * 1000)


@dataclass
class DueTimers(DueTimes):
    """:class:`DueTimes` for a processor: due when a recorded timer or TTL deadline
    is passed (see the module doc)."""

    _deadlines: dict[int, Deadlines] = field(default_factory=dict, repr=False)

    def deadlines_after(self, batch: int) -> Deadlines:
        """What the partitions recorded after ``batch`` (read once per batch)."""
        if batch not in self._deadlines:
            self._deadlines[batch] = operator_deadlines(self.storage(), batch, self.num_partitions)
            while len(self._deadlines) > 4:
                del self._deadlines[min(self._deadlines)]
        return self._deadlines[batch]

    def due_after(self, batch: int) -> bool:
        """Whether batch ``batch + 1``, started now, fires a timer or expires a
        value."""
        if batch < 0:
            return False
        return self.deadlines_after(batch).due(now_ms())
