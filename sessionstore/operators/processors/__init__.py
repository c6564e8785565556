"""Run PySpark ``StatefulProcessor`` classes on sessionstore state (engine-agnostic:
no pyspark here). See docs/operators.md, "StatefulProcessor"."""

from sessionstore.operators.processors.core import HandleState, KeyScope, ProcessorCore
from sessionstore.operators.processors.handle import ProcessorHandle, extra_store_name
from sessionstore.operators.processors.runner import BatchTimes, ProcessorRunner
from sessionstore.operators.processors.state import (
    ListState,
    MapState,
    SessionState,
    ValueState,
    VersionedState,
)
from sessionstore.operators.processors.timers import (
    ExpiredTimerInfo,
    TimerValues,
    normalise_time_mode,
)

__all__ = [
    "ProcessorHandle",
    "ProcessorCore",
    "KeyScope",
    "HandleState",
    "ProcessorRunner",
    "BatchTimes",
    "ValueState",
    "ListState",
    "MapState",
    "SessionState",
    "VersionedState",
    "TimerValues",
    "ExpiredTimerInfo",
    "normalise_time_mode",
    "extra_store_name",
]
