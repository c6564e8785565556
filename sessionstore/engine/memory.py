"""The process's RocksDB memory budget: one block cache and one write-buffer manager
shared by every database the process opens.

A Spark Python worker holds the databases of many partitions at once. Each with its
own block cache and memtables, its native memory grew with every partition it held
(82 MB per partition at 300k sessions, issue #16). As Spark's bounded memory mode
does (``RocksDBMemoryManager``), every database of this process uses:

- one LRU block cache of ``max_mb``, into which index and filter blocks are loaded
  too (``cache_index_and_filter_blocks``), so that they count against the budget
  instead of growing with every table file held open;
- one write-buffer manager charging every memtable to that cache, so that one
  number bounds both: memtables may take up to half of it
  (:data:`WRITE_BUFFER_SHARE`, Spark's ``writeBufferCacheRatio``), blocks the rest.

RocksDB's manager flushes only the database being written, before its write. A
worker's databases go idle after their micro-batch, each keeping its memtables, so
that alone bounds nothing: 40 idle databases kept 68 MB of memtables under a 32 MB
share. So :class:`~sessionstore.engine.db.Database` also flushes its own memtables
after a write that leaves the process over the share: every write either ends
under the share or empties its writer, so idle memtables never add up past it.

The cache is not strict (rocksdict's ``Cache`` cannot ask for it): what is pinned
(the index and filter blocks of L0 files, memtables) can take it past ``max_mb``
rather than fail a read, as Spark's strict cache can. What is not charged at all (per
database and per family bookkeeping, table readers, the Python heap) is the fixed
overhead documented in docs/internals.md.

Created on first use, per process (PySpark forks its workers: a child makes its
own), in the process's ``memory_budget`` slot (:mod:`sessionstore.process`). The
budget is the process's: opening a database with another ``max_mb`` resizes it for
every database of the process.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocksdict import Cache, WriteBufferManager

from sessionstore.process import this_process

__all__ = [
    "MemoryBudget",
    "memory_budget",
    "current_budget",
    "check_memory_max_mb",
    "DEFAULT_MEMORY_MAX_MB",
    "WRITE_BUFFER_SHARE",
]

#: The default budget of one process, in MiB. A Spark executor runs up to one Python
#: worker per core, each with this budget: 256 MiB keeps a 4-core executor's state
#: near 1 GiB (the per-worker arithmetic: docs/internals.md, "Memory"), while a
#: worker holding a few partitions keeps the 64 MiB cache each of them had before.
DEFAULT_MEMORY_MAX_MB = 256
#: The share of the budget memtables may take before the writing database flushes
#: (Spark's ``writeBufferCacheRatio`` default).
WRITE_BUFFER_SHARE = 0.5

_MB = 1024 * 1024


@dataclass
class MemoryBudget:
    """The shared cache and write-buffer manager of this process."""

    max_mb: int
    cache: Cache
    write_buffers: WriteBufferManager

    def usage(self) -> int:
        """Bytes the cache holds: data, index and filter blocks, and the memtables
        charged to it."""
        return self.cache.get_usage()

    def memtables_over_share(self) -> bool:
        """Whether the memtables of this process's databases take more than their
        share of the budget."""
        return self.write_buffers.get_usage() > self.write_buffers.get_buffer_size()

    def resize(self, max_mb: int) -> None:
        """Set the budget of every database of this process to ``max_mb``."""
        self.cache.set_capacity(max_mb * _MB)
        self.write_buffers.set_buffer_size(int(max_mb * _MB * WRITE_BUFFER_SHARE))
        self.max_mb = max_mb


def check_memory_max_mb(max_mb: object) -> None:
    """Raise ValueError unless ``max_mb`` is None or a positive int."""
    if max_mb is not None and (type(max_mb) is not int or max_mb < 1):
        raise ValueError(f"memory_max_mb must be a positive int (MiB), got {max_mb!r}")


def _new_budget(size: int) -> MemoryBudget:
    cache = Cache(size * _MB)
    # allow_stall=False: a stall waits for flushes of other databases, which idle
    # databases of this worker never start; the writer flushes instead
    manager = WriteBufferManager.new_write_buffer_manager_with_cache(
        int(size * _MB * WRITE_BUFFER_SHARE), False, cache
    )
    return MemoryBudget(size, cache, manager)


def memory_budget(max_mb: int | None = None) -> MemoryBudget:
    """This process's budget, created on first use with ``max_mb`` (default
    :data:`DEFAULT_MEMORY_MAX_MB`); an existing one is resized when ``max_mb`` is
    given and differs, and kept as it is when ``max_mb`` is None."""
    check_memory_max_mb(max_mb)
    process = this_process()
    with process.lock:
        budget = process.get("memory_budget")
        if budget is None:
            size = DEFAULT_MEMORY_MAX_MB if max_mb is None else max_mb
            budget = process.get_or_make("memory_budget", lambda: _new_budget(size))
        elif max_mb is not None and max_mb != budget.max_mb:
            budget.resize(max_mb)
        return budget


def current_budget() -> MemoryBudget | None:
    """This process's budget if a database created it, else None."""
    return this_process().get("memory_budget")
