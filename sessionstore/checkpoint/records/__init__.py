"""What a checkpoint holds: every name (layout), the changelog and snapshot formats, the operator-wide event and processing time records, per-task metrics."""
