"""Uninterrupted reference runs computed once per test process.

Several rescale tests (and parametrized cases) compare their run against the very
same uninterrupted run: the same query builder and case, the same input rows, the
same partition count and output mode, on a local ``file://`` checkpoint. Such a run
is a pure function of those, so :func:`uninterrupted_batches` starts it once and
hands every later caller the rows it wrote. The key holds everything the run
depends on (the builder by its qualified name, and a digest of the input rows), so
two runs that differ in anything are never mixed up.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from spark_integration import StateBackend
from tests.spark.streams import run_stream_batches, write_json

#: the rows of each micro-batch of every run started so far, by key
_RUNS: dict[tuple, list[list[dict]]] = {}


def _digest(batches: Sequence[Sequence[dict]]) -> str:
    return hashlib.sha256(json.dumps(batches, sort_keys=True).encode()).hexdigest()


def uninterrupted_batches(
    spark: Any,
    factory: pytest.TempPathFactory,
    query: Callable[..., Any],
    case: str,
    batches: Sequence[Sequence[dict]],
    partitions: int = 4,
    mode: str = "append",
) -> list[list[dict]]:
    """The rows of each micro-batch of ``query(spark, folder, backend, partitions,
    case)`` run without a stop on a fresh ``file://`` checkpoint, fed one file of
    ``batches`` per micro-batch in output ``mode``: started the first time, the same
    rows (a copy) after."""
    key = (query.__module__, query.__qualname__, case, partitions, mode, _digest(batches))
    if key not in _RUNS:
        root = factory.mktemp("reference")
        backend = StateBackend(f"file://{root}/whole", local_dir=str(root / "local"))
        folder = root / "in"
        steps = [
            (lambda i=i, rows=rows: write_json(folder, i, rows)) for i, rows in enumerate(batches)
        ]
        out = query(spark, folder, backend, partitions, case)
        _RUNS[key] = run_stream_batches(out, root / "ck", steps, mode)
    return copy.deepcopy(_RUNS[key])
