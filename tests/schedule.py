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
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "SECONDS_FILE", "module_seconds", "module_rank", "junit_module_seconds", "write_seconds",
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
