"""Development helpers: a local Spark session and the demo job."""
