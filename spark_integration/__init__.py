"""Spark glue for sessionstore: everything that imports pyspark lives here."""
