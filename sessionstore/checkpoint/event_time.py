"""Event time shared by the partitions of an operator, through the checkpoint.

Each partition records the largest event time it has seen after batch N in
``<operator>/event_time/<N>/<partition>`` (:func:`~sessionstore.checkpoint.layout.event_time_name`). Before batch N+1, every partition reads
the files of batch N and moves its stream time to their maximum. Sessions and
windows therefore close in partitions that receive no data, one batch after the
query's event time passes them, and deterministically: the files of batch N are
fixed once batch N has run, so a replayed batch sees the same time.
"""

from __future__ import annotations

from sessionstore.checkpoint.filesystem import Storage
from sessionstore.checkpoint.layout import event_time_name
from sessionstore.encoding.ints import INT64 as _I64

__all__ = ["EventTimeExchange"]


class EventTimeExchange:
    """Publish this partition's event time; read the operator's after a batch."""

    def __init__(self, operator_storage: Storage, partition: int) -> None:
        self._root = operator_storage
        self._partition = partition

    def publish(self, batch_id: int, event_time: int | None) -> None:
        if event_time is not None:
            self._root.write_atomic(
                event_time_name(batch_id, self._partition), _I64.pack(event_time)
            )
        # the files of older batches are no longer needed
        if batch_id >= 2:
            self._root.delete(event_time_name(batch_id - 2, self._partition))

    def after(self, batch_id: int) -> int | None:
        """The largest event time any partition had after ``batch_id`` (None if none)."""
        if batch_id < 0:
            return None
        folder = event_time_name(batch_id)
        times = [
            _I64.unpack(self._root.read(f"{folder}/{name}"))[0] for name in self._root.list(folder)
        ]
        return max(times) if times else None
