"""Shared fixtures."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

import pytest

from sessionstore import StateDB


@pytest.fixture
def db(tmp_path):
    """A fresh StateDB in a temporary directory, closed after the test."""
    handle = StateDB.open(tmp_path / "db")
    yield handle
    handle.close()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 HTTP endpoint (moto server) on 127.0.0.1, stopped after the session."""
    from tests.object_stores import moto_s3_server

    with moto_s3_server() as options:
        yield options


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket on the moto endpoint; yields (uri, storage_options)."""
    from tests.object_stores import new_bucket

    yield f"s3://{new_bucket(s3_server)}/checkpoints", dict(s3_server)


@pytest.fixture(scope="session")
def gcs_server():
    """A real GCS HTTP endpoint (fake-gcs-server) on 127.0.0.1, killed after the session."""
    from tests.object_stores import gcs_server

    with gcs_server() as options:
        yield options


@pytest.fixture
def gs_bucket(gcs_server):
    """A fresh bucket on the GCS endpoint; yields (uri, storage_options)."""
    from tests.object_stores import new_gcs_bucket

    yield f"gs://{new_gcs_bucket(gcs_server)}/checkpoints", dict(gcs_server)


@pytest.fixture(params=["file", "s3", "gs"])
def checkpoint_location(request, tmp_path):
    """(uri, storage_options) in a local folder, on the S3 and on the GCS endpoint."""
    if request.param == "file":
        return f"file://{tmp_path}/remote", None
    return request.getfixturevalue(f"{request.param}_bucket")


#: JVM options of every JVM the suite starts. One JVM runs hundreds of small
#: queries, each planned and code-generated afresh, and little of its code runs long
#: enough to gain from the C2 compiler: the C1 compiler alone, with one compiler
#: thread, and the serial collector spend less CPU on compiling and collecting on
#: two cores (five small streaming queries in a fresh local[2] session: 31 s of the
#: JVM's CPU instead of 53 s with the JVM's defaults; the README's job, a process of
#: its own, 13 s instead of 26 s). Planning a micro-batch allocates much and keeps
#: little, so a larger young generation (half of a heap that starts at 5% of the
#: memory, where the JVM's default starts at 1/64 with a third young) collects
#: several times less often at about the same cost each: two Spark modules,
#: alternated in four rounds, 154-174 CPU-s against 165-178. A JVM given ``-Xmx``
#: (Spark's launcher: 128 MB) keeps its own maximum.
SUITE_JVM_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC"
    " -XX:InitialRAMPercentage=5 -XX:NewRatio=1"
)

#: Spark's checkpoint file manager over Hadoop's ``FileSystem`` API (see below).
FILESYSTEM_CHECKPOINT_FILES = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)

#: Spark settings of every Spark the suite starts, as Java system properties (which
#: a ``SparkConf`` reads as defaults, under anything a session sets):
#:
#: * expressions evaluated by Spark's interpreter instead of compiled to Java and
#:   then to machine code. A test query handles a few hundred rows, far too few to
#:   repay compiling each of its plans (the aggregations module: 87-90 CPU-s instead
#:   of 96-100). The results are the same either way (Spark's own tests run both);
#:   what the suite compares is ours against Spark's, on the same Spark;
#: * a query on the default trigger that found no new data waits 100 ms before it
#:   asks its sources again, not 10 ms (``pollingDelay``): a query idle between a
#:   test's steps asked every 10 ms for 0.20 CPU-s a second (0.29 with a due
#:   source), at 100 ms for 0.04; five Spark modules, alternated: 342 and 366 CPU-s
#:   against 353 and 373, in the same wall time. A trigger with an interval that
#:   found nothing sleeps as long too, inside its interval (the quiet tests' 500 ms):
#:   it saves nothing there and costs no trigger;
#: * Spark's own checkpoint files (offset and commit logs, the state files of its
#:   operators) written through Hadoop's ``FileSystem`` API, not its
#:   ``FileContext`` (``checkpointFileManagerClass``). Without Hadoop's native
#:   library (PySpark ships none) a local file system starts a process for some
#:   file operations: a ``chmod`` for each file created, and, through
#:   ``FileContext`` only, a ``readlink`` for each side of a rename, so two for
#:   each file a query commits. Two Spark modules started 6,630 processes from
#:   their JVM, 4,936 of them ``readlink``, and 1,700 with this setting; four
#:   Spark modules, alternated: 161 and 177 CPU-s against 193 and 198. Both
#:   write each file under a temporary name and rename it into place, with the
#:   same files (and the same ``.crc`` checksum files) in a checkpoint.
#:
#: Benchmarks keep Spark's defaults.
SUITE_SPARK_PROPERTIES = (
    "-Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN"
    " -Dspark.sql.streaming.pollingDelay=100ms"
    f" -Dspark.sql.streaming.checkpointFileManagerClass={FILESYSTEM_CHECKPOINT_FILES}"
)


#: Put first on ``PYTHONPATH``: its ``sitecustomize`` has the Python processes Spark
#: starts import PySpark from site-packages, compiled, instead of from Spark's zip.
WORKER_SITE = Path(__file__).with_name("worker_site")


#: Where the suite's temporary files go when the machine has it: a RAM-backed
#: (tmpfs) folder. The tests write thousands of small databases, changelogs and
#: commit records, each synced; on a virtual disk every sync costs CPU, on tmpfs
#: none (the fast suite: 303 CPU-s in 179 s on the disk, 280 CPU-s in 160 s here).
#: A sync's promise is not what the tests check: a process killed mid-write keeps
#: what reached the page cache on either file system.
RAM_TMP_ROOT = "/dev/shm"
#: The least free space under :data:`RAM_TMP_ROOT` the suite takes it with.
RAM_TMP_MIN_FREE = 4 << 30


def ram_backed_tmp(
    root: str = RAM_TMP_ROOT,
    min_free: int = RAM_TMP_MIN_FREE,
    name: str = f"sessionstore-tests-{os.geteuid()}",
) -> str | None:
    """This user's own folder ``name`` for temporary files under the tmpfs ``root``,
    made if missing; None where ``root`` is not a tmpfs mount with ``min_free`` bytes
    free, or the folder is not a directory of this user that only this user can
    write and list (a name another user took first is never used)."""
    try:
        with open("/proc/mounts") as mounts:
            tmpfs = any(f.split()[1:3] == [root, "tmpfs"] for f in mounts)
        free = os.statvfs(root)
    except OSError:
        return None
    if not tmpfs or free.f_bavail * free.f_frsize < min_free:
        return None
    path = os.path.join(root, name)
    try:
        # others may pass through (as through /tmp: tests run children as another
        # user), never list or write
        os.mkdir(path, 0o711)
    except FileExistsError:
        pass
    except OSError:
        return None
    mode = os.lstat(path)
    if not stat.S_ISDIR(mode.st_mode) or mode.st_uid != os.geteuid() or mode.st_mode & 0o066:
        return None
    return path


def pytest_configure(config):
    """Four settings of every process the run starts, all for CPU (the suite is
    bound by it on two cores):

    * :data:`SUITE_JVM_OPTIONS` and :data:`SUITE_SPARK_PROPERTIES` for every JVM,
      through the ``java`` launcher's ``JDK_JAVA_OPTIONS``: the suite's own session
      and those of the processes tests start (a Connect server, ``local-cluster``
      executors, jobs run as a user would), which set no JVM options of their own;
      with the run's class-data archive (:func:`suite_jvm_options`); a value
      already set is kept;
    * :data:`WORKER_SITE` first on ``PYTHONPATH``, which Spark passes to the Python
      processes it starts (see its ``sitecustomize``);
    * ``TMPDIR`` (Python's temporary files, pytest's ``tmp_path`` among them) in
      :func:`ram_backed_tmp` where there is one; a ``TMPDIR`` already set is kept;
    * with that folder, a bytecode cache in it where the environment turned
      bytecode off (:func:`bytecode_cache`).
    """
    if "JDK_JAVA_OPTIONS" not in os.environ:
        os.environ["JDK_JAVA_OPTIONS"] = suite_jvm_options(config)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(WORKER_SITE) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(WORKER_SITE), *filter(None, paths)])
    if "TMPDIR" not in os.environ and (ram := ram_backed_tmp()) is not None:
        _RUN_FOLDER.append(run_folder(ram))
        os.environ["TMPDIR"] = _RUN_FOLDER[-1]
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
        bytecode_cache(_RUN_FOLDER[-1], os.environ)


def suite_jvm_options(config) -> str:
    """:data:`SUITE_JVM_OPTIONS` and :data:`SUITE_SPARK_PROPERTIES`, with the
    virtualenv's class-data archive of Spark's classes (:mod:`tests.jvm_archive`).
    Where there is none yet it is made now, in the background, unless the run
    leaves the slow tests out: the fast suite starts three JVMs, whose faster
    starts repay less than the archive costs to make (about 35 CPU-s); it uses one
    a whole run made."""
    from tests import jvm_archive

    options = f"{SUITE_JVM_OPTIONS} {SUITE_SPARK_PROPERTIES}"
    archive = jvm_archive.archive_path(options)
    fast = "not slow" in (config.getoption("markexpr", "") or "")
    if not archive.is_file() and not fast:
        builder = jvm_archive.start_build(archive, options, dict(os.environ))
        _ARCHIVE_BUILDS.append(builder)
        os.environ[jvm_archive.BUILDER_ENV] = str(builder.pid)
    return f"{options} {jvm_archive.options_with(archive)}"


#: The class-data archive build this process started (:func:`suite_jvm_options`).
_ARCHIVE_BUILDS: list = []


def bytecode_cache(folder: str, environ: MutableMapping[str, str]) -> None:
    """Where ``environ`` turns bytecode off (``PYTHONDONTWRITEBYTECODE``) and names
    no cache of its own, have the processes it starts cache their compiled modules
    under ``folder`` (``PYTHONPYCACHEPREFIX``), never beside the sources.

    Every Python process the suite starts (a CLI call, a state server, a Spark
    Python worker, a streaming source's runner: about a thousand) imports this
    project's packages, and without bytecode each compiles them from source again:
    ``sessionstore --help`` takes 0.43 CPU-s so, 0.30 with a warm cache. The first
    process to import a module writes its bytecode (atomically) into the run's
    folder, and the folder goes with the run."""
    if environ.get("PYTHONDONTWRITEBYTECODE") and not environ.get("PYTHONPYCACHEPREFIX"):
        environ["PYTHONPYCACHEPREFIX"] = os.path.join(folder, "pycache")
        del environ["PYTHONDONTWRITEBYTECODE"]


#: How long the run's end waits for a class-data archive build still running.
WAIT_FOR_ARCHIVE_S = 120

#: The run's folder in RAM, when this process made it (not in pytest-xdist's
#: workers, which inherit ``TMPDIR``).
_RUN_FOLDER: list[str] = []


def run_folder(ram: str) -> str:
    """A new folder of this run's own under ``ram``; :func:`pytest_sessionfinish`
    removes it after a passing run: a whole run's files take gigabytes of memory
    (pytest alone keeps its last three runs' ``tmp_path``s). A failed run's stay for
    a look until the next run starts, which removes every run folder whose process
    has ended."""
    from tests.pids import running

    for name in os.listdir(ram):
        pid = name.split("-")[1] if name.startswith("run-") else ""
        if pid.isdigit() and not running(int(pid)):
            shutil.rmtree(os.path.join(ram, name), ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=ram)
    os.chmod(path, 0o711)  # passable, as the folder above it (see ram_backed_tmp)
    return path


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession whose Python workers use this interpreter."""
    from spark_integration.conf.local_spark import local_spark
    from tests.jvm_archive import wait_for_build

    wait_for_build()  # a JVM started before the archive is whole goes without
    # one retry per task; 2 partitions per operator, as the tests were written for
    # (the default would be 2 per core: spark_integration.planning.resolve.partition_count)
    session = local_spark(
        "sessionstore-tests",
        max_failures=2,
        spark__sessionstore__partitions="2",
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_throttling_server():
    """A moto S3 endpoint answering 20% of requests with ``503 SlowDown`` (and
    counting them, see ``tests.object_stores``), stopped after the session."""
    from tests.object_stores import moto_s3_server

    with moto_s3_server(throttle=0.2) as options:
        yield options


@pytest.fixture(scope="session")
def s3_counting_server():
    """A moto S3 endpoint that counts the requests it receives (see
    ``tests.object_stores.s3_request_counts``), stopped after the session."""
    from tests.object_stores import moto_s3_server

    with moto_s3_server(record=True) as options:
        yield options


def _parallel(config) -> bool:
    """Whether pytest-xdist spreads this run over several processes (``-n``):
    true in its workers and in its controller."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) or bool(
        getattr(config.option, "numprocesses", None)
    )


def pytest_collection_modifyitems(config, items):
    """The tests that read a background job's result (``tests.background``) go last,
    in their order: their jobs get the whole run to finish. Under pytest-xdist
    (``make test`` runs ``--dist loadfile --no-loadscope-reorder``, which deals
    modules out in this order) their modules go first instead, as a worker runs
    such a job in place, and the other modules follow longest first
    (:mod:`tests.schedule`), so the workers' ends come together."""
    from tests.schedule import module_rank, module_seconds

    def reads_a_job(item) -> bool:
        return hasattr(getattr(item, "module", None), "background_jobs")

    if _parallel(config):
        seconds = module_seconds()

        def rank(item) -> tuple[bool, float]:
            # the node id starts with the module's path from the root (the checkout)
            return not reads_a_job(item), module_rank(item.nodeid.split("::")[0], seconds)

        items.sort(key=rank)  # stable: a module's tests keep their order
    else:
        items.sort(key=reads_a_job)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with one worker kept free of the suite's Spark session
    (:class:`tests.schedule.SessionSparkScheduling`); other modes as pytest-xdist
    deals them."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.schedule import SessionSparkScheduling

    return SessionSparkScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    """Under pytest-xdist, a worker other than the first collects after the first
    one, from what it compiled (:mod:`tests.first_collector`)."""
    from tests.first_collector import before_collection

    before_collection()


def pytest_collection_finish(session):
    """Under pytest-xdist, the first worker leaves the flag the others wait for
    (:mod:`tests.first_collector`). Move what collection made (modules, test items,
    their fixtures' definitions) out of the cyclic collector's reach, then start the out-of-process jobs the
    selected tests read (``tests.background``), in the order of their tests,
    beside the tests that come before them.

    Collection leaves hundreds of thousands of objects that live as long as the
    process, and every full collection the tests' allocations set off walks them
    all again: frozen (``gc.freeze``), they are skipped (the engine, store and
    operator modules, three rounds with two workers, alternated: 106-127 CPU-s
    against 109-137). The jobs do not start under pytest-xdist: every worker
    collects every test, and the worker that runs a test runs its job in place
    (the other workers take the other core)."""
    import gc

    from tests.background import start
    from tests.first_collector import after_collection

    after_collection()
    gc.collect()
    gc.freeze()
    if session.config.option.collectonly or _parallel(session.config):
        return
    wanted: dict = {}
    for item in session.items:
        jobs = getattr(getattr(item, "module", None), "background_jobs", None)
        if jobs is not None:
            for key, run in jobs(item).items():
                wanted.setdefault(key, run)
    start(wanted.items())


def pytest_sessionfinish(session, exitstatus):
    """End whatever a background job still runs (a session cut short), let the
    class-data archive's build end (:func:`suite_jvm_options`); then, after
    a passing run, remove the run's folder in RAM (:func:`run_folder`)."""
    from tests.background import stop_all
    from tests.first_collector import at_session_end

    stop_all()
    at_session_end()
    for builder in _ARCHIVE_BUILDS:  # a short run: the archive is for the next one
        try:
            builder.wait(WAIT_FOR_ARCHIVE_S)
        except subprocess.TimeoutExpired:
            builder.kill()
            builder.wait()
    if _RUN_FOLDER and exitstatus == 0:
        shutil.rmtree(_RUN_FOLDER.pop(), ignore_errors=True)
