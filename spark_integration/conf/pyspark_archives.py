"""Which PySpark a Python process Spark starts should import: Spark's archives or
an installed copy of the same release.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on the
``PYTHONPATH`` of every Python process it starts. Python keeps no bytecode for
modules imported from an archive, so each such process compiles PySpark from
source (about 190 modules, 1-3 s of CPU). A pip-installed PySpark is its own
``SPARK_HOME`` (``<site>/pyspark``), so when ``<site>`` is on the path too, with
``pyspark`` and ``py4j`` in it, the same files are there with their bytecode.
Archives of a Spark distribution elsewhere (a cluster's ``SPARK_HOME``) stay: the
installed package may be another release there.

Imports nothing but ``os``: the suite's ``sitecustomize`` reads it at every start.
"""

from __future__ import annotations

import os

__all__ = ["without_installed_archives"]


def without_installed_archives(path: list[str]) -> list[str]:
    """``path`` (``sys.path`` or a ``PYTHONPATH``'s entries) without the archives
    of a pip-installed PySpark whose site folder is on it too with both packages
    (see the module doc); every other entry as it is."""
    on_path = {os.path.realpath(p) for p in path if not p.endswith(".zip")}

    def installed_archive(entry: str) -> bool:
        lib = os.path.dirname(entry)
        site = os.path.dirname(os.path.dirname(os.path.dirname(lib)))
        return (
            entry.endswith(".zip")
            and lib.endswith(os.path.join("pyspark", "python", "lib"))
            and os.path.realpath(site) in on_path
            and all(
                os.path.isfile(os.path.join(site, package, "__init__.py"))
                for package in ("pyspark", "py4j")
            )
        )

    return [p for p in path if not installed_archive(p)]
