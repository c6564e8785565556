"""Keep a long-lived process's imports out of its garbage collections.

A reused Python worker of Spark runs a full garbage collection after every task
(``pyspark/daemon.py``), and a full collection walks every object the process
tracks. Once a worker has run one of our tasks it holds PySpark's SQL modules,
PyArrow's and ours: about 80,000 objects, 25-35 ms of CPU for each collection, so
for each task, about as much as a small task's own work (``bench/python_tasks.py``).
Nearly all of those objects are modules, classes and functions that live as long as
the process. :func:`freeze_long_lived`, called as a task starts, collects once and
then moves every object the process holds into the interpreter's permanent
generation (``gc.freeze``), which collections skip: later collections walk only
what later tasks allocate. A task imports most of our modules as it runs, so a
call freezes again when modules were imported since the last one (the first few
tasks of a process) and does nothing otherwise.

What it costs: an object frozen here that a later task unlinks into a reference
cycle is never collected (one without a cycle is still freed by its reference
count). A freeze follows a collection, and happens only when the process imported
something new, which stops after its first tasks: what can stay behind is a fixed
amount per process (the cycles of a few tasks' inputs), not an amount per task.
"""

from __future__ import annotations

import gc
import sys

from sessionstore.process import this_process

__all__ = ["freeze_long_lived"]


def freeze_long_lived() -> None:
    """Collect garbage, then exclude every object this process holds from all later
    collections (``gc.freeze``): at a process's first call, and at a later one only
    when modules were imported since the last freeze (a forked child starts with
    no freeze of its own: its imports come after the fork)."""
    process = this_process()
    with process.lock:
        frozen = process.get_or_make("frozen_imports", lambda: {"modules": -1})
        if frozen["modules"] == len(sys.modules):
            return
        frozen["modules"] = len(sys.modules)
        gc.collect()
        gc.freeze()
