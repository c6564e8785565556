"""Runs that several tests compare against, computed once.

A Spark test's CPU goes to the queries it starts and the micro-batches they run
(planning, listing the source folder, the stages, the callback), so tests that
each drive the very same query over the very same input (a reference run: the
same rows, operator settings, partition count and due-batch setting) can share one
run. :class:`SharedRuns` computes each run the first time a test asks for it, in a
folder of its own, and hands every test a copy of its result;
:func:`uninterrupted_batches` shares the uninterrupted reference runs of the
rescale tests across modules.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest

from spark_integration import StateBackend
from tests.spark.streams import run_stream_batches, write_json


class SharedRuns:
    """Results by key, each computed once in a new folder of ``factory``'s."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory
        self._results: dict[Hashable, Any] = {}

    def get(self, key: Hashable, compute: Callable[[Path], Any]) -> Any:
        """A copy of the result of ``compute(folder)`` for ``key``: computed on the
        first call for ``key``, kept for the later ones (a copy each, so that no
        test sees another's changes). A run that raised is not kept: the next call
        for ``key`` runs it again."""
        if key not in self._results:
            self._results[key] = compute(self._factory.mktemp("run"))
        return copy.deepcopy(self._results[key])


#: the uninterrupted reference runs of this test process (:func:`uninterrupted_batches`)
_REFERENCES: SharedRuns | None = None


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
    ``batches`` per micro-batch in output ``mode``: run once per test process.

    Such a run is a pure function of its arguments, so the key holds all of them
    (the builder by its qualified name, a digest of the input rows): two runs that
    differ in anything are never mixed up."""

    def run(root: Path) -> list[list[dict]]:
        backend = StateBackend(f"file://{root}/whole", local_dir=str(root / "local"))
        folder = root / "in"
        steps = [
            (lambda i=i, rows=rows: write_json(folder, i, rows)) for i, rows in enumerate(batches)
        ]
        out = query(spark, folder, backend, partitions, case)
        return run_stream_batches(out, root / "ck", steps, mode)

    global _REFERENCES
    if _REFERENCES is None:  # the session's factory: the same for every caller
        _REFERENCES = SharedRuns(factory)
    key = (query.__module__, query.__qualname__, case, partitions, mode, _digest(batches))
    return _REFERENCES.get(key, run)
