"""Keep a long-lived process's imports out of its garbage collections.

A reused Python worker of Spark runs a full garbage collection after every task
(``pyspark/daemon.py``), and a full collection walks every object the process
tracks. Once a worker has run one of our tasks it holds PySpark's SQL modules,
PyArrow's and ours: about 80,000 objects, 25-35 ms of CPU for each collection, so
for each task (``bench/python_tasks.py``). Nearly all of those objects are modules,
classes and functions that live as long as the process. :func:`freeze_long_lived`,
called as a task ends (before the worker's collection), collects once and then
moves every object the process still holds into the interpreter's permanent
generation (``gc.freeze``), which collections skip: later collections walk only
what later tasks allocate.

When. A task imports most of our modules as it runs, so a call freezes when the
process holds more modules than at any freeze before (its first tasks, or the
first task of another operator) and does nothing otherwise; and at most
:data:`MAX_FREEZES` times in a process, whatever its code imports later.

What it costs: an object frozen here that later becomes garbage inside a
reference cycle is never collected, nor what the cycle references, and its weak
references' callbacks never run (an object outside cycles is still freed by its
reference count). A freeze follows a collection, so only what was alive then is
frozen: the process's modules and long-lived state, and the objects of the
task that ends. At most :data:`MAX_FREEZES` freezes bound what can stay behind to
a fixed amount per process, not an amount per task. Nothing of ours relies on a
collection to close a database or a file: every close is explicit.
"""

from __future__ import annotations

import gc
import sys

from sessionstore.process import this_process

__all__ = ["MAX_FREEZES", "freeze_long_lived"]

#: The most freezes one process makes (its first task's modules, then those of
#: the first task of each other operator it runs, as a few operators would).
MAX_FREEZES = 4


def freeze_long_lived() -> None:
    """Collect garbage, then exclude every object this process holds from all later
    collections (``gc.freeze``), when the process holds more modules than at its
    last freeze and has frozen fewer than :data:`MAX_FREEZES` times (a forked child
    starts with no freeze of its own: its imports come after the fork)."""
    process = this_process()
    modules = len(sys.modules)
    with process.lock:  # test and set only: other threads may need the lock
        frozen = process.get_or_make("frozen_imports", lambda: {"modules": -1, "freezes": 0})
        if modules <= frozen["modules"] or frozen["freezes"] >= MAX_FREEZES:
            return
        frozen["modules"], frozen["freezes"] = modules, frozen["freezes"] + 1
    gc.collect()
    gc.freeze()
