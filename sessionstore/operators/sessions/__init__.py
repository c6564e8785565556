"""Session-window aggregation (KIP-94): model (settings, updates), state, the
record-exact batch replay and its vectorised part, the columnar path, and the
aggregator, which holds the record path and chooses a batch's path."""
