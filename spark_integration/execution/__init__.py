"""Executor-side execution: the task runtime, operator output, the per-executor state servers."""
