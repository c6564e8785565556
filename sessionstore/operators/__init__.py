"""Engine-agnostic operators: they take records and stores, and return what to emit."""

from sessionstore.operators.aggregations import Aggregation, Aggregations
from sessionstore.operators.count_windows import CountWindowAggregator, CountWindowUpdate
from sessionstore.operators.sessions import SessionUpdate, SessionWindowAggregator, SessionWindows
from sessionstore.operators.temporal_join import JoinedRecord, TemporalJoin
from sessionstore.operators.window_join import JoinedPair, WindowedJoin
from sessionstore.operators.windows import TimeWindows, WindowAggregator, WindowUpdate

__all__ = [
    "Aggregation",
    "Aggregations",
    "SessionWindows",
    "SessionUpdate",
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
