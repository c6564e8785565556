"""sessionstore.encoding."""
