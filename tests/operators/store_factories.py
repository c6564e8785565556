"""Session stores for the operator property tests: ``make(name, retention_ms)``
factories, in memory or in RocksDB, with small segments so that expiry happens."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sessionstore import InMemorySessionStore, StateDB


def memory_store(name: str, retention: int) -> InMemorySessionStore:
    """An in-memory session store with 7 ms segments."""
    return InMemorySessionStore(name, retention, segment_interval_ms=7)


@contextmanager
def rocksdb_stores() -> Iterator[Callable[[str, int], Any]]:
    """A factory of RocksDB session stores (one database each, 9 ms segments),
    closed and deleted on exit. A fresh directory per use: hypothesis runs a test
    body many times inside one pytest test."""
    tmp = tempfile.mkdtemp()
    dbs: list[StateDB] = []

    def make(name: str, retention: int) -> Any:
        db = StateDB.open(f"{tmp}/{name}")
        dbs.append(db)
        return db.session_store("s", retention, segment_interval_ms=9)

    try:
        yield make
    finally:
        for db in dbs:
            db.close()
        shutil.rmtree(tmp, ignore_errors=True)
