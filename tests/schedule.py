"""The order in which ``make test`` deals test modules out to its pytest-xdist
workers: the longest first, so that the run ends with short modules and the
workers finish together.

``make test`` runs ``--dist loadfile``: a worker takes a whole module, the next
one in the queue when it is free. pytest-xdist's own order is by number of tests,
which puts the modules of one or two long tests (a job run as a user would, a
million-row dump, an executor lost mid-stream) last, where each one alone is the
end of the run. :data:`SECONDS` holds each module's seconds from a whole run
(``tests/module_seconds.json``); a module it does not name goes first, since a
short module first costs nothing and a long one last costs its length.

Regenerate the file from the JUnit XML of one or more whole runs (their mean)::

    make test PYTEST_ADDOPTS=--junitxml=run.xml
    .venv/bin/python -m tests.schedule run.xml

With three workers or more, one of them never starts the suite's Spark session
(:class:`SessionSparkScheduling`): the modules that use it (:func:`uses_session_spark`)
go to the others, Spark's first, and that worker takes the rest. A session JVM,
its Python workers and its state servers cost CPU of their own to start and warm
up, and on two saturated cores CPU is time; the free worker's tests still fill
the time the Spark tests spend waiting, which two workers alone leave idle. A
whole ``make test`` from a fresh clone: three sessions, 1,371 CPU-s in 739 s;
two sessions and a free worker, 1,278-1,304 CPU-s in 682-695 s (three runs); two
workers, 1,263 CPU-s in 766 s (1.71 cores busy after the install, against 1.93
and 1.95).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadFileScheduling

__all__ = [
    "SECONDS_FILE", "module_seconds", "module_rank", "junit_module_seconds", "write_seconds",
    "SESSION_SPARK_MODULES", "uses_session_spark", "SessionSparkScheduling",
]  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]
#: A module's path (from the checkout's root) -> its seconds in a whole run.
SECONDS_FILE = Path(__file__).with_name("module_seconds.json")


def module_seconds(path: Path = SECONDS_FILE) -> dict[str, float]:
    """The recorded seconds of each module (empty where there is no file)."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def module_rank(module: str, seconds: dict[str, float]) -> float:
    """A sort key putting ``module`` (a path from the root) in :mod:`tests.schedule`'s
    order: unrecorded modules first, then the recorded ones longest first."""
    return -seconds.get(module, float("inf"))


def junit_module_seconds(reports: Sequence[Path], root: Path = ROOT) -> dict[str, float]:
    """Each module's seconds in the JUnit XML ``reports`` (their mean over the
    reports that ran it), keyed by its path from ``root``."""
    runs: dict[str, list[float]] = defaultdict(list)
    for report in reports:
        totals: dict[str, float] = defaultdict(float)
        for case in ET.parse(report).iter("testcase"):
            module = _module_path(case.get("classname", ""), root)
            if module is not None:
                totals[module] += float(case.get("time") or 0.0)
        for module, seconds in totals.items():
            runs[module].append(seconds)
    return {module: sum(times) / len(times) for module, times in runs.items()}


def _module_path(classname: str, root: Path) -> str | None:
    """The module file of a JUnit ``classname`` (``tests.x.test_y[.Class]``)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = Path(*parts[:end]).with_suffix(".py")
        if (root / candidate).is_file():
            return candidate.as_posix()
    return None


#: The modules (paths from the root; a folder ends with ``/``) whose tests use the
#: suite's Spark session, the ``spark`` fixture. ``tests/test_suite_settings.py``
#: checks that no other module does.
SESSION_SPARK_MODULES = ("tests/spark/", "tests/test_suite_settings.py")


def uses_session_spark(module: str) -> bool:
    """Whether ``module`` (a path from the root) is one of :data:`SESSION_SPARK_MODULES`."""
    return any(
        module.startswith(m) if m.endswith("/") else module == m for m in SESSION_SPARK_MODULES
    )


class SessionSparkScheduling(LoadFileScheduling):
    """``--dist loadfile`` in the queue's order, where with three workers or more the
    last one (``gw<n-1>``) is kept free of the suite's Spark session: the other
    workers take the modules that use it first, the free worker takes the others,
    and a worker takes a Spark module only when no other worker can (the free one,
    once the others are gone)."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._free: Any = None

    def schedule(self) -> None:
        if self.collection is None and len(self.nodes) >= 3:
            self._free = max(self.nodes, key=_worker_number)
        super().schedule()

    def _next_scope(self, node: Any) -> str | None:
        """The first module in the queue ``node`` takes, or None."""
        if self._free is None:
            return next(iter(self.workqueue), None)
        spark = [s for s in self.workqueue if uses_session_spark(s)]
        rest = [s for s in self.workqueue if not uses_session_spark(s)]
        if node is not self._free:
            return next(iter(spark + rest), None)
        alone = all(n is node or n.shutting_down for n in self.assigned_work)
        return next(iter(rest + spark if alone else rest), None)

    def _assign_work_unit(self, node: Any) -> None:
        scope = self._next_scope(node)
        if scope is None:
            return
        self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)

    def _reschedule(self, node: Any) -> None:
        if not node.shutting_down and self.workqueue and self._next_scope(node) is None:
            node.shutdown()  # after the tests it was given: nothing it may take is left
            return
        super()._reschedule(node)


def _worker_number(node: Any) -> int:
    """``n`` of a pytest-xdist worker named ``gw<n>``."""
    name = str(node.gateway.id)
    return int(name[2:]) if name[2:].isdigit() else -1


def write_seconds(seconds: dict[str, float], path: Path = SECONDS_FILE) -> None:
    """Write ``seconds`` rounded to whole seconds, longest first."""
    ordered = dict(sorted(((m, round(s)) for m, s in seconds.items()), key=lambda i: (-i[1], i[0])))
    path.write_text(json.dumps(ordered, indent=1) + "\n")


def main(argv: Iterable[str] | None = None) -> None:
    reports = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not reports:
        sys.exit("usage: python -m tests.schedule RUN.xml [RUN.xml ...]")
    write_seconds(junit_module_seconds(reports))
    print(f"wrote {SECONDS_FILE}")


if __name__ == "__main__":
    main()
