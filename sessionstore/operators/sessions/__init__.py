"""Session-window aggregation (KIP-94): the aggregator, its record path and its batch paths."""
