"""The public operators, one module each."""
