"""Times a StatefulProcessor sees, and which timers a batch fires.

:class:`TimerValues` and :class:`ExpiredTimerInfo` answer the same calls as
PySpark's (``getCurrentProcessingTimeInMs``, ``getCurrentWatermarkInMs``,
``getExpiryTimeInMs``), -1 where the time mode has no such time, as in Spark.

Firing follows Spark: after the batch's input, every timer with expiry at or
before the batch time (processing time, or the watermark in event-time mode),
including one the input registered in this batch, fires in (expiry, grouping key)
order, and is deleted after its handler returns.
The timers live in the processor store's index ``time ‖ enc(key)``, so finding
them is one range read, never a scan of every key.
"""

from __future__ import annotations

__all__ = ["TimerValues", "ExpiredTimerInfo", "TIME_MODES", "normalise_time_mode"]

#: Spark's spellings of the time modes, lower-cased -> canonical.
TIME_MODES = {"none": "None", "processingtime": "ProcessingTime", "eventtime": "EventTime"}


def normalise_time_mode(time_mode: str) -> str:
    """The canonical spelling of ``time_mode`` (case-insensitive, as Spark reads it);
    ``ValueError`` with Spark's error condition for an unknown one."""
    from sessionstore.errors import StatefulProcessorError

    canonical = TIME_MODES.get(str(time_mode).lower())
    if canonical is None:
        raise StatefulProcessorError(
            "STATEFUL_PROCESSOR_UNKNOWN_TIME_MODE",
            f"Unknown time mode {time_mode!r}. Accepted timeMode modes are 'none', "
            "'processingTime', 'eventTime'",
        )
    return canonical


class TimerValues:
    """Processing time and watermark of the current batch (ms; -1 when absent)."""

    __slots__ = ("_processing", "_watermark")

    def __init__(self, currentProcessingTimeInMs: int = -1, currentWatermarkInMs: int = -1) -> None:
        self._processing = currentProcessingTimeInMs
        self._watermark = currentWatermarkInMs

    def getCurrentProcessingTimeInMs(self) -> int:  # noqa: N802 - PySpark's name
        """Processing time of the current batch in ms."""
        return self._processing

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802 - PySpark's name
        """Event-time watermark of the current batch in ms."""
        return self._watermark

    def __repr__(self) -> str:
        return f"TimerValues(processing={self._processing}, watermark={self._watermark})"


class ExpiredTimerInfo:
    """The expiry time of the timer being fired."""

    __slots__ = ("_expiry",)

    def __init__(self, expiryTimeInMs: int = -1) -> None:
        self._expiry = expiryTimeInMs

    def getExpiryTimeInMs(self) -> int:  # noqa: N802 - PySpark's name
        """Expiry time of the fired timer in ms."""
        return self._expiry

    def __repr__(self) -> str:
        return f"ExpiredTimerInfo(expiry={self._expiry})"
