"""Spark glue for sessionstore: everything that imports pyspark lives here."""

from spark_integration.conf.backend import StateBackend
from spark_integration.coordinator.metrics_listener import StateMetricsListener, log_state_metrics
from spark_integration.operators.bootstrap import bootstrap_sessionize, bootstrap_temporal_join
from spark_integration.operators.repartition import repartition_state
from spark_integration.operators.rewrite import rewrite_state
from spark_integration.operators.sessionize import SessionAggregation, sessionize
from spark_integration.operators.temporal_join import temporal_join
from spark_integration.operators.transform_with_state import (
    transform_with_state,
    transform_with_state_in_pandas,
)
from spark_integration.operators.window_aggregate import window_aggregate
from spark_integration.operators.window_join import window_join

__all__ = [
    "StateBackend",
    "sessionize",
    "SessionAggregation",
    "temporal_join",
    "transform_with_state",
    "transform_with_state_in_pandas",
    "window_aggregate",
    "window_join",
    "log_state_metrics",
    "StateMetricsListener",
    "repartition_state",
    "rewrite_state",
    "bootstrap_sessionize",
    "bootstrap_temporal_join",
]
