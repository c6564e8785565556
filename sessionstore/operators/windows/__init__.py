"""Time windows (SAMZA-552) and count windows: model (windows, updates), state, the
columnar path, and the aggregators, which hold the record path and choose a
batch's path."""
