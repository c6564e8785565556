"""The per-process store service and its request server."""
