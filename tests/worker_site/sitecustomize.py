"""Python processes the suite's Spark starts import PySpark from site-packages.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the
``PYTHONPATH`` of every Python process it starts: a data source's planner, a
streaming Python source's runner, the worker daemon. A zip holds no compiled
bytecode, so each such process compiles PySpark from source and re-reads the zips'
directories (about 0.8 s of CPU each, and a test module starts dozens: a query
with a due source starts one runner). The suite's PySpark is pip-installed, so the
same files, compiled once, are in site-packages: this drops the zips from
``sys.path`` at start-up, but only those of a pip-installed PySpark whose
site-packages (holding ``pyspark`` and ``py4j``) is on ``sys.path`` too, so a
process that has no other copy keeps them. The conftest puts this folder on
``PYTHONPATH``, which Spark passes on to those processes; Python imports the
first ``sitecustomize`` on the path at start-up (an interpreter's own one, which
none of the suite's has, would be shadowed).
"""

import os
import sys


def _has_installed_copy(path: str, on_path: set[str]) -> bool:
    """Whether ``path`` is a zip of pip-installed PySpark
    (``<site>/pyspark/python/lib/*.zip``) whose ``<site>`` is on ``sys.path`` with
    both packages in it."""
    lib = os.path.dirname(path)
    package = os.path.dirname(os.path.dirname(lib))
    site = os.path.dirname(package)
    return (
        path.endswith(".zip")
        and lib.endswith(os.path.join("pyspark", "python", "lib"))
        and os.path.realpath(site) in on_path
        and all(os.path.isfile(os.path.join(site, p, "__init__.py")) for p in ("pyspark", "py4j"))
    )


_on_path = {os.path.realpath(p) for p in sys.path if not p.endswith(".zip")}
sys.path[:] = [p for p in sys.path if not _has_installed_copy(p, _on_path)]
