"""The Arrow batch API the event-time aggregators share.

``process_batch`` takes an Arrow table or record batch and returns the updates as
an Arrow table: through the aggregator's columnar path (``process_table``) when the
batch qualifies, else through its Python batch path (``process_rows``). pyarrow is
imported only when a batch is processed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sessionstore.operators.gc_pause import gc_paused

__all__ = ["ArrowBatches", "StateAttribute", "batch_restoring", "CLOSES_ON", "check_closes_on", "judged_time"]


class ArrowBatches:
    """Mixin: ``process_batch`` and ``process_table`` on top of ``process_rows``, the
    aggregator's ``state`` (whose ``rolling_back()`` is the store's batch) and the
    class's columnar path: ``_columnar_applies`` (whether the aggregator's mode and
    state allow it) and ``_run_columnar`` (one prepared batch, inside the store's
    batch)."""

    state: Any

    def process_batch(
        self,
        batch: Any,
        key: str | Sequence[str] = "key",
        timestamp: str = "timestamp",
        value: str | Sequence[str] | None = "value",
        *,
        net: bool = False,
    ) -> Any:
        """Process an Arrow table or record batch; return the updates as an Arrow table.

        ``key`` names one column or several (tuple keys); ``value`` names one column,
        several (each value is a dict of them) or None. Timestamps are epoch
        milliseconds or an Arrow timestamp column. ``net``: the batch's net change
        in update mode (see ``process_rows``).
        """
        from sessionstore.operators.batch_paths.arrow_io import columns_of

        table = self.process_table(batch, key, timestamp, value)
        if table is not None:
            return table
        keys, timestamps, values = columns_of(batch, key, timestamp, value)
        return self._updates_table(self.process_rows(keys, timestamps, values, net=net), key)

    def process_table(
        self,
        batch: Any,
        key: str | Sequence[str] = "key",
        timestamp: str = "timestamp",
        value: str | Sequence[str] | None = "value",
    ) -> Any:
        """The columnar path of :meth:`process_batch`: the emitted updates as an Arrow
        table with typed ``value`` fields, or None, with nothing changed, when the
        batch does not qualify (then use ``process_rows``). Which batches qualify is
        the aggregator's (see :mod:`.sessions.columns` and :mod:`.windows.columns`) and
        :func:`columnar.prepare`'s."""
        if not self._columnar_applies():
            return None
        from sessionstore.operators.batch_paths.columnar import prepare

        prepared = prepare(self.aggregation, batch, key, timestamp, value)
        if prepared is None:
            return None
        with self._rolling_back(), gc_paused():
            return self._run_columnar(prepared, timestamp, value)

    def _columnar_applies(self) -> bool:
        raise NotImplementedError

    def _run_columnar(self, prepared: Any, timestamp: str, value: Any) -> Any:
        raise NotImplementedError

    def _rolling_back(self) -> Any:
        return self.state.rolling_back()

    def _updates_table(self, updates: list[Any], key: str | Sequence[str]) -> Any:
        from sessionstore.operators.batch_paths.arrow_io import updates_to_arrow

        return updates_to_arrow(updates, key)

    def process_rows(self, *args: Any) -> list[Any]:  # provided by the aggregator
        raise NotImplementedError


class StateAttribute:
    """An aggregator attribute that lives in its ``state``, read and written
    through: the batch paths see only the state, and callers may still reset it
    on the aggregator (counters)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else getattr(obj.state, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj.state, self.name, value)


@contextmanager
def batch_restoring(store: Any, restore: Callable[[], None]) -> Iterator[None]:
    """The store's batch; if it fails, the store rolls back, and ``restore`` reads
    back what the aggregator keeps of it in memory (stream time and the like), so
    that memory never runs ahead of the rolled-back store."""
    try:
        with store.batch():
            yield
    except BaseException:
        restore()
        raise


#: When an event-time aggregator closes: at each record's stream time (Kafka's
#: KIP-94 and Samza's semantics), or only when advanced (``advance_to``), every row
#: in between judged by the time of the last advance (Spark's watermark, which a
#: micro-batch takes from the batch before it).
CLOSES_ON = ("record", "advance")


def check_closes_on(closes_on: str) -> None:
    """Raise ``ValueError`` for a ``closes_on`` not in :data:`CLOSES_ON`."""
    if closes_on not in CLOSES_ON:
        raise ValueError(f"closes_on must be 'record' or 'advance', got {closes_on!r}")


def judged_time(held: bool, stream_time: int | None, store_time: int | None) -> int | None:
    """The time an aggregator judges records by (what is closed, late, due): its
    stream time, or when held (``closes_on="advance"``) the time of its last advance,
    which is its store's (writes do not move it then; the minimum also reads a store
    written before, whose time followed the writes). None: nothing is judged yet."""
    if not held:
        return stream_time
    if stream_time is None or store_time is None:
        return None
    return min(stream_time, store_time)
