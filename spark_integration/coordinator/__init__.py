"""The driver coordinator: its server on the driver and the client tasks call."""
