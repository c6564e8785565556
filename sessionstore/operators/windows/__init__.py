"""Time windows (SAMZA-552) and count windows: the aggregators and their batch paths."""
