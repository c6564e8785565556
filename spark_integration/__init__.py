"""Spark glue for sessionstore: everything that imports pyspark lives here.

Names are imported on first use (:mod:`sessionstore.lazy`).
"""

from typing import TYPE_CHECKING

from sessionstore.lazy import lazy_exports

#: the public names, and where each lives (``__all__``, in this order)
_EXPORTS = {
    "StateBackend": "spark_integration.conf.backend",
    "StateMetricsListener": "spark_integration.coordinator.metrics_listener",
    "log_state_metrics": "spark_integration.coordinator.metrics_listener",
    "bootstrap_sessionize": "spark_integration.operators.bootstrap",
    "bootstrap_temporal_join": "spark_integration.operators.bootstrap",
    "repartition_state": "spark_integration.operators.repartition",
    "rewrite_state": "spark_integration.operators.rewrite",
    "SessionAggregation": "spark_integration.operators.sessionize",
    "sessionize": "spark_integration.operators.sessionize",
    "temporal_join": "spark_integration.operators.temporal_join",
    "transform_with_state": "spark_integration.operators.transform_with_state",
    "transform_with_state_in_pandas": "spark_integration.operators.transform_with_state",
    "window_aggregate": "spark_integration.operators.window_aggregate",
    "window_join": "spark_integration.operators.window_join",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from spark_integration.conf.backend import StateBackend  # noqa: F401
    from spark_integration.coordinator.metrics_listener import (  # noqa: F401
        StateMetricsListener,
        log_state_metrics,
    )
    from spark_integration.operators.bootstrap import bootstrap_sessionize, bootstrap_temporal_join  # noqa: F401
    from spark_integration.operators.repartition import repartition_state  # noqa: F401
    from spark_integration.operators.rewrite import rewrite_state  # noqa: F401
    from spark_integration.operators.sessionize import SessionAggregation, sessionize  # noqa: F401
    from spark_integration.operators.temporal_join import temporal_join  # noqa: F401
    from spark_integration.operators.transform_with_state import (  # noqa: F401
        transform_with_state,
        transform_with_state_in_pandas,
    )
    from spark_integration.operators.window_aggregate import window_aggregate  # noqa: F401
    from spark_integration.operators.window_join import window_join  # noqa: F401

__all__ = list(_EXPORTS)
