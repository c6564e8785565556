"""Engine-agnostic operators: they take records and stores, and return what to emit."""

from sessionstore.operators.aggregations import Aggregation, Aggregations
from sessionstore.operators.sessions.aggregator import (
    SessionUpdate,
    SessionWindowAggregator,
    SessionWindows,
)
from sessionstore.operators.sessions.model import ClosedSessions
from sessionstore.operators.temporal_join import JoinedRecord, TemporalJoin
from sessionstore.operators.window_join import JoinedPair, WindowedJoin
from sessionstore.operators.windows.aggregator import TimeWindows, WindowAggregator, WindowUpdate
from sessionstore.operators.windows.count import CountWindowAggregator, CountWindowUpdate

__all__ = [
    "Aggregation",
    "Aggregations",
    "SessionWindows",
    "SessionUpdate",
    "ClosedSessions",
    "SessionWindowAggregator",
    "TemporalJoin",
    "JoinedRecord",
    "TimeWindows",
    "WindowAggregator",
    "WindowUpdate",
    "WindowedJoin",
    "JoinedPair",
    "CountWindowAggregator",
    "CountWindowUpdate",
]
