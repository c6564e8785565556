"""sessionstore.tools."""
