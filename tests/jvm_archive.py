"""A class-data archive of Spark's JVM classes for every JVM the suite starts.

A JVM loads, parses and verifies each class it uses from its jar the first time;
a Spark session loads about ten thousand, on every start. A dynamic CDS archive
(JDK 13+: ``-XX:ArchiveClassesAtExit``, then ``-XX:SharedArchiveFile``) holds
them already parsed and verified, mapped from one file: a ``local[2]`` session and
a few small streaming queries take 11 CPU-s with it instead of 18, and start
seconds sooner (the suite starts a dozen JVMs: its sessions, a Connect server,
the jobs tests run as a user would).

The archive is made once per virtualenv (it records the JVM and Spark's class
path, which lives in the virtualenv) by :func:`start_build`, in the background
while the run collects and the first tests go: a ``local[2]`` session runs a
short :func:`workload` and the JVM writes what it loaded at its exit, under a
temporary name renamed into place when it is whole. A JVM that starts while
there is none, or finds it unusable (another JVM build, another class path: a
launcher's, an executor's), runs as it would without, silently
(:data:`QUIET`). :func:`wait_for_build` lets a session start wait for it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.pids import running

#: The environment variable holding the pid of the run's archive build, while it runs.
BUILDER_ENV = "SESSIONSTORE_TEST_JVM_ARCHIVE_BUILDER"
#: JVM options that keep an archive the JVM cannot use out of its output (a
#: launcher's stdout is the command line ``spark-class`` reads).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: How long a session start waits for the run's archive build at most.
WAIT_S = 120.0


def archive_path(jvm_options: str) -> Path:
    """Where this virtualenv keeps the archive for ``jvm_options`` and the JVM
    that ``java`` runs: a new JVM, PySpark or option set has a name of its own."""
    import pyspark

    java = os.path.realpath(_which("java") or "java")
    try:
        stamp = os.stat(java).st_mtime_ns
    except OSError:
        stamp = 0
    key = f"{java}|{stamp}|{pyspark.__version__}|{pyspark.__file__}|{jvm_options}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(sys.prefix) / "spark-jvm-archive" / f"{digest}.jsa"


def options_with(path: Path) -> str:
    """The JVM options that map the archive at ``path`` when it is usable."""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def start_build(path: Path, jvm_options: str, environ: dict[str, str]) -> subprocess.Popen:
    """Start making the archive at ``path`` in the background (see the module doc);
    the child's environment is ``environ`` with ``jvm_options`` for its JVMs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    env = {**environ, "JDK_JAVA_OPTIONS": jvm_options}
    env.pop(BUILDER_ENV, None)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.jvm_archive", str(path)],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_for_build(environ: dict[str, str] | None = None, limit: float = WAIT_S) -> None:
    """Return once the run's archive build (:data:`BUILDER_ENV`) has ended, or after
    ``limit`` seconds: a JVM started before it ends would go without it."""
    pid = (environ if environ is not None else os.environ).get(BUILDER_ENV, "")
    deadline = time.monotonic() + limit
    while pid.isdigit() and running(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.2)


def _which(name: str) -> str | None:
    from shutil import which

    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", name) if home else which(name)


def workload(folder: Path) -> int:
    """A ``local[2]`` session running the kinds of query the suite runs most, kept
    short (the archive's build is a cost of the run): a stateful streaming query
    (foreachBatch), Arrow to a Python worker and back, a batch read; the JVM's pid."""
    from spark_integration.conf.local_spark import local_spark
    from tests.spark.streams import json_source, run_stream_batches, write_json

    spark = local_spark(
        "sessionstore-jvm-archive", spark__ui__showConsoleProgress="false"
    )
    try:
        source = folder / "in"
        df = json_source(spark, source, "user string, ts long")
        steps = [
            (lambda i=i: write_json(source, i, [{"user": f"u{i % 3}", "ts": i * 1000}]))
            for i in range(2)
        ]
        run_stream_batches(df.groupBy("user").count(), folder / "ck", steps, "update")
        spark.range(4).mapInArrow(lambda batches: batches, "id long").collect()
        spark.read.json(str(source)).groupBy("user").count().collect()
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    finally:
        spark.stop()


def main(argv: list[str]) -> int:
    """``python -m tests.jvm_archive PATH``: make the archive at ``PATH``. The
    workload runs in a child process, whose JVM writes the archive when it exits
    (after the child does: a gateway JVM ends when its Python driver's pipe
    closes); the whole file is then renamed into place."""
    import json
    import re
    import tempfile

    path = Path(argv[0])
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": (
        f"--driver-java-options -XX:ArchiveClassesAtExit={partial} pyspark-shell"
    )}  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as folder:
            run = subprocess.run(
                [sys.executable, "-c", WORKLOAD, folder], env=env, capture_output=True,
                text=True, timeout=300,
            )  # fmt: skip
            if run.returncode != 0:
                return run.returncode
            jvm = json.loads(re.findall(r'\{"jvm": \d+\}', run.stdout)[-1])["jvm"]
            deadline = time.monotonic() + 60
            while running(jvm) and time.monotonic() < deadline:
                time.sleep(0.1)
        if running(jvm) or not partial.is_file() or partial.stat().st_size == 0:
            return 1
        os.replace(partial, path)
        return 0
    finally:
        partial.unlink(missing_ok=True)


#: The child of :func:`main`: runs :func:`workload` and prints its JVM's pid.
WORKLOAD = """
import json, sys
from pathlib import Path
from tests.jvm_archive import workload
print(json.dumps({"jvm": workload(Path(sys.argv[1]))}))
"""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
