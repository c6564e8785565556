"""Offline operations on a whole operator: verify, repartition, change, erase."""
