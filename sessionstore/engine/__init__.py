"""sessionstore.engine."""
