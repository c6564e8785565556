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

The dropped entries' importers go from ``sys.path_importer_cache`` too: start-up
imports (before this file) cached a ``zipimporter`` for each, and
``importlib.invalidate_caches()``, which PySpark's worker calls when it adds the
task's files folder to the path, re-reads every cached archive's directory
(``pyspark.zip``: about 11 ms each time; the ``spark-core`` jar, which Spark puts
on the path too and which holds no Python, about 40 ms).
"""

import os
import sys

from spark_integration.conf.pyspark_archives import without_installed_archives

kept = without_installed_archives(sys.path)
dropped = {os.path.abspath(p) for p in set(sys.path) - set(kept)}
for cached in [p for p in sys.path_importer_cache if p and os.path.abspath(p) in dropped]:
    del sys.path_importer_cache[cached]  # under the PYTHONPATH spelling or site's
sys.path[:] = kept
