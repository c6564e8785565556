"""Engine-agnostic operators: they take records and stores, and return what to emit."""

from sessionstore.operators.aggregations import Aggregation, Aggregations
from sessionstore.operators.sessions import SessionUpdate, SessionWindowAggregator, SessionWindows

__all__ = [
    "Aggregation",
    "Aggregations",
    "SessionWindows",
    "SessionUpdate",
    "SessionWindowAggregator",
]
