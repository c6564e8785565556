"""Driver-side planning: resolving columns and times, aggregation specs, placement, the state backend."""
