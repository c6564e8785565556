"""Pausing Python's cyclic garbage collector around batch work.

A micro-batch allocates many small containers (tuples, lists, dicts per row and
per session) and creates no reference cycles. Each allocation burst triggers
collections that traverse every live object, input columns included, again and
again; pausing the collector for a batch saves those traversals (the callgrind
measurement is in BENCHMARKS.md, "Figures quoted in code"). Reference counting still frees everything at once.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector for the block; restore its state after, even
    on error. Nested uses are harmless."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
