"""sessionstore.stores."""
