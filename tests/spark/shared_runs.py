"""Runs that several tests of a module compare against, computed once.

A Spark test module's CPU goes to the queries it starts and the micro-batches they
run (planning, listing the source folder, the stages, the callback), so two tests
that each drive the very same query over the very same input (a reference run:
the same rows, operator settings, partition count and due-batch setting) can share
one run. :class:`SharedRuns` computes each run the first time a test asks for it,
in a folder of its own, and hands the same result to every later test.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any


class SharedRuns:
    """Results by key, each computed once in its own folder under ``root``."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._results: dict[Hashable, Any] = {}
        self._folders = itertools.count()

    def get(self, key: Hashable, compute: Callable[[Path], Any]) -> Any:
        """The result of ``compute(folder)`` for ``key``: computed on the first call
        for ``key`` (in a new folder under the root), the same object afterwards. A
        run that raised is not kept: the next call for ``key`` runs it again."""
        if key not in self._results:
            folder = self._root / f"run-{next(self._folders)}"
            folder.mkdir()
            self._results[key] = compute(folder)
        return self._results[key]
