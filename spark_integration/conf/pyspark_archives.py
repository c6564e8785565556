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

Spark also puts its ``spark-core`` jar on that path (a distribution once packed
PySpark into its assembly jar). A jar is a zip to Python: each process reads its
directory (about 6,000 entries, 40 ms of CPU) at start-up and again at every
``importlib.invalidate_caches()``, which PySpark's worker calls as it adds a task's
files folder. A pip-installed PySpark's ``spark-core`` jar holds no Python, so under
the same condition it goes too (only that jar: others in its folder may be a
user's, with Python in them).

Imports nothing but ``os``: the suite's ``sitecustomize`` reads it at every start.
"""

from __future__ import annotations

import os

__all__ = ["without_installed_archives"]


def without_installed_archives(path: list[str]) -> list[str]:
    """``path`` (``sys.path`` or a ``PYTHONPATH``'s entries) without the archives
    and the ``spark-core`` jar of a pip-installed PySpark whose site folder is on it
    too with both packages (see the module doc); every other entry as it is."""
    on_path = {os.path.realpath(p) for p in path if not p.endswith((".zip", ".jar"))}

    def site_of(entry: str) -> str | None:
        """The site folder of ``entry`` when it is one of an installed PySpark's
        archives (``pyspark/python/lib/*.zip``) or its ``spark-core`` jar
        (``pyspark/jars/spark-core_*.jar``, the one jar Spark puts on the path: other
        jars there may be a user's, with Python in them)."""
        entry = os.path.normpath(entry)
        name, parts = os.path.basename(entry), entry.split(os.sep)
        if name.endswith(".zip") and parts[-4:-1] == ["pyspark", "python", "lib"]:
            inside = 3
        elif name.startswith("spark-core_") and name.endswith(".jar") and (
            parts[-3:-1] == ["pyspark", "jars"]
        ):
            inside = 2
        else:
            return None
        for _ in range(inside + 1):  # the file, then its folders up to the site
            entry = os.path.dirname(entry)
        return entry

    def installed_archive(entry: str) -> bool:
        site = site_of(entry)
        return (
            site is not None
            and os.path.realpath(site) in on_path
            and all(
                os.path.isfile(os.path.join(site, package, "__init__.py"))
                for package in ("pyspark", "py4j")
            )
        )

    return [p for p in path if not installed_archive(p)]
