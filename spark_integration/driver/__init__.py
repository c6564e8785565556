"""Driver-side services: the coordinator and the metrics listener."""
