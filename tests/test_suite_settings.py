"""The suite's own settings (tests/conftest.py): every process the run starts gets
them, the RAM-backed folder for temporary files is taken only when it is safe to, and
children cache bytecode only in the run's folder."""

from __future__ import annotations

import gc
import json
import os
import stat
import subprocess
import sys
import tempfile
import types
import uuid
from pathlib import Path

import pytest

import tests.models
from tests.conftest import (
    FILESYSTEM_CHECKPOINT_FILES,
    RAM_TMP_ROOT,
    SUITE_JVM_OPTIONS,
    SUITE_SPARK_PROPERTIES,
    WORKER_SITE,
    bytecode_cache,
    ram_backed_tmp,
    run_folder,
)
from tests.packaging import checkout_pythonpath


def test_the_run_passes_its_settings_to_every_process_it_starts():
    """pytest_configure's settings are in the environment children inherit (unless
    the caller set its own)."""
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(WORKER_SITE)
    assert os.environ["JDK_JAVA_OPTIONS"]  # the suite's, or the caller's own
    if ram_backed_tmp() is not None and os.environ["TMPDIR"].startswith(RAM_TMP_ROOT):
        assert os.path.basename(os.environ["TMPDIR"]).startswith("run-")
    assert SUITE_JVM_OPTIONS.startswith("-XX:")
    assert gc.get_freeze_count() > 10_000  # what collection made (pytest_collection_finish)


@pytest.mark.slow
def test_the_suites_spark_interprets_expressions(spark):
    """The suite's Spark properties reach the sessions' SQL settings (a SparkConf
    reads Java system properties as its defaults): the expression interpreter, and
    a 100 ms wait of a query that found no new data."""
    if SUITE_SPARK_PROPERTIES not in os.environ["JDK_JAVA_OPTIONS"]:
        pytest.skip("the caller set JDK_JAVA_OPTIONS of its own")
    assert spark.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "false"
    assert spark.conf.get("spark.sql.streaming.pollingDelay") == "100ms"
    manager = spark.conf.get("spark.sql.streaming.checkpointFileManagerClass")
    assert manager == FILESYSTEM_CHECKPOINT_FILES


@pytest.mark.slow
def test_the_suites_session_jvm_has_a_young_generation_of_half_its_heap(spark):
    """SUITE_JVM_OPTIONS reach the session's JVM: the serial collector, with a
    young generation of half the initial heap (the JVM's default is a third, its
    eden then under 30% of the heap)."""
    if SUITE_SPARK_PROPERTIES not in os.environ["JDK_JAVA_OPTIONS"]:
        pytest.skip("the caller set JDK_JAVA_OPTIONS of its own")
    management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    arguments = list(management.getRuntimeMXBean().getInputArguments())
    assert all(option in arguments for option in SUITE_JVM_OPTIONS.split()), arguments
    heap = management.getMemoryMXBean().getHeapMemoryUsage().getInit()
    pools = {p.getName(): p.getUsage().getInit() for p in management.getMemoryPoolMXBeans()}
    assert pools["Eden Space"] > 0.35 * heap, (pools, heap)


@pytest.mark.slow
def test_the_suites_spark_writes_its_checkpoint_files_through_the_filesystem_api(spark, tmp_path):
    """The checkpoint file manager Spark makes for a query's checkpoint (from the
    session's Hadoop settings, as a query does) is the one the suite names
    (tests/conftest.py), and a query restarted on its checkpoint resumes after
    the batch its first run committed through it."""
    if SUITE_SPARK_PROPERTIES not in os.environ["JDK_JAVA_OPTIONS"]:
        pytest.skip("the caller set JDK_JAVA_OPTIONS of its own")
    from tests.spark.streams import json_source, write_json

    checkpoint = tmp_path / "checkpoint"
    jvm = spark.sparkContext._jvm
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    made = manager.create(
        jvm.org.apache.hadoop.fs.Path(str(checkpoint)),
        spark._jsparkSession.sessionState().newHadoopConf(),
    )
    assert made.getClass().getName() == FILESYSTEM_CHECKPOINT_FILES
    for run in range(2):  # a batch a run, each on a file written before it
        write_json(tmp_path / "in", run, [{"n": run}])
        query = (
            json_source(spark, tmp_path / "in", "n long").writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(120)
        assert query.exception() is None
        assert query.lastProgress["batchId"] == run
        assert query.lastProgress["numInputRows"] == 1


needs_tmpfs = pytest.mark.skipif(
    ram_backed_tmp() is None, reason=f"{RAM_TMP_ROOT} is not a tmpfs with room here"
)


@pytest.fixture
def probe():
    """A folder name under the RAM root that no one has taken; removed after."""
    name = f"sessionstore-probe-{uuid.uuid4().hex}"
    yield name
    path = os.path.join(RAM_TMP_ROOT, name)
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        os.rmdir(path)


@needs_tmpfs
def test_the_folder_is_made_for_this_user_alone(probe):
    path = ram_backed_tmp(name=probe)
    assert path == os.path.join(RAM_TMP_ROOT, probe)
    mode = os.lstat(path)
    assert (stat.S_IMODE(mode.st_mode), mode.st_uid) == (0o711, os.geteuid())
    assert ram_backed_tmp(name=probe) == path  # found again, kept


@needs_tmpfs
def test_a_folder_others_can_list_or_write_is_never_used(probe):
    path = os.path.join(RAM_TMP_ROOT, probe)
    os.mkdir(path)
    os.chmod(path, 0o777)
    assert ram_backed_tmp(name=probe) is None
    os.chmod(path, 0o750)
    assert ram_backed_tmp(name=probe) is None


@needs_tmpfs
def test_a_symlink_in_its_place_is_never_followed(probe, tmp_path):
    os.symlink(tmp_path, os.path.join(RAM_TMP_ROOT, probe))
    assert ram_backed_tmp(name=probe) is None


def test_a_root_that_is_no_tmpfs_or_too_full_is_not_taken(tmp_path, probe):
    assert ram_backed_tmp(root=str(tmp_path), name=probe) is None  # not a mount point
    assert ram_backed_tmp(min_free=1 << 62, name=probe) is None
    assert not os.path.exists(os.path.join(RAM_TMP_ROOT, probe))


def test_a_run_folder_is_new_and_the_folders_of_ended_runs_go(tmp_path):
    import subprocess
    import sys

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    gone = tmp_path / f"run-{int(ended.stdout)}-abc"
    kept = tmp_path / f"run-{os.getpid()}-def"  # a run still going: this one
    other = tmp_path / "run-notapid-x"
    for folder in (gone, kept, other):
        (folder / "data").mkdir(parents=True)
    made = run_folder(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([kept.name, other.name, os.path.basename(made)])
    assert os.path.basename(made).startswith(f"run-{os.getpid()}-")
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o711 and os.listdir(made) == []


def test_children_cache_bytecode_in_the_given_folder_only_where_it_was_turned_off(tmp_path):
    """Where the environment turned bytecode off, a child imports a checkout module
    and leaves its bytecode in the cache folder, none beside the source; an
    environment with bytecode on, or a cache of its own, is left as it was."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    base["PYTHONPATH"] = checkout_pythonpath()
    env = {**base, "PYTHONDONTWRITEBYTECODE": "1"}
    bytecode_cache(str(tmp_path), env)
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")
    assert "PYTHONDONTWRITEBYTECODE" not in env
    source = Path(tests.models.__file__).resolve()
    beside = source.parent / "__pycache__"
    before = set(beside.glob("models.*.pyc")) if beside.is_dir() else set()
    subprocess.run(
        [sys.executable, "-c", "import tests.models"], env=env, cwd=tmp_path, check=True,
        timeout=60,
    )  # fmt: skip
    cached = list((tmp_path / "pycache" / source.parent.relative_to("/")).glob("models.*.pyc"))
    assert len(cached) == 1
    after = set(beside.glob("models.*.pyc")) if beside.is_dir() else set()
    assert after == before

    own = {**base, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/elsewhere"}
    bytecode_cache(str(tmp_path), own)
    assert own["PYTHONPYCACHEPREFIX"] == "/elsewhere" and own["PYTHONDONTWRITEBYTECODE"] == "1"
    on = dict(base)
    bytecode_cache(str(tmp_path), on)
    assert on == base


@pytest.mark.slow
def test_the_suites_jvms_can_map_the_class_data_archive(spark):
    """The archive the run made (tests.jvm_archive) is one the suite's JVM maps:
    ``-Xshare:on`` makes a JVM that cannot (another JVM build, another class path)
    fail at start instead of running without it."""
    from tests import jvm_archive

    options = os.environ["JDK_JAVA_OPTIONS"]
    if SUITE_SPARK_PROPERTIES not in options:
        pytest.skip("the caller set JDK_JAVA_OPTIONS of its own")
    archive = jvm_archive.archive_path(f"{SUITE_JVM_OPTIONS} {SUITE_SPARK_PROPERTIES}")
    if not archive.is_file():
        # a run that started a build waited for it (the spark fixture): it made none
        assert jvm_archive.BUILDER_ENV not in os.environ, f"the run's build made no {archive}"
        pytest.skip("no archive: the fast suite makes none")
    assert jvm_archive.options_with(archive) in options
    jvm = spark.sparkContext._jvm.java.lang.System
    java = os.path.join(jvm.getProperty("java.home"), "bin", "java")
    env = {k: v for k, v in os.environ.items() if k != "JDK_JAVA_OPTIONS"}
    args = [java, *SUITE_JVM_OPTIONS.split(), "-Xshare:on", f"-XX:SharedArchiveFile={archive}",
            "-cp", jvm.getProperty("java.class.path"), "-version"]  # fmt: skip
    mapped = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert mapped.returncode == 0, mapped.stderr
    # and one whose class path differs cannot, so the check above can fail
    args[args.index("-cp") + 1] = str(archive.parent)
    other = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert other.returncode != 0


def test_modules_go_out_unrecorded_first_then_longest_first(tmp_path):
    """tests.schedule: a module the file does not name first (it may be long),
    then the recorded ones by their seconds; JUnit reports give each module the
    mean of the runs that ran it, a class's tests counting for its module."""
    from tests.schedule import junit_module_seconds, module_rank, module_seconds, write_seconds

    root = tmp_path / "root"
    (root / "tests" / "spark").mkdir(parents=True)
    for name in ("tests/test_a.py", "tests/spark/test_b.py"):
        (root / name).write_text("")

    def report(name, cases):
        body = "".join(
            f'<testcase classname="{c}" name="t{i}" time="{t}"/>' for i, (c, t) in enumerate(cases)
        )
        (tmp_path / name).write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
        return tmp_path / name

    first = report("1.xml", [("tests.test_a", 1.5), ("tests.test_a.TestX", 2.5),
                             ("tests.spark.test_b", 10.0), ("gone.module", 99.0)])  # fmt: skip
    second = report("2.xml", [("tests.spark.test_b", 20.0)])
    seconds = junit_module_seconds([first, second], root)
    assert seconds == {"tests/test_a.py": 4.0, "tests/spark/test_b.py": 15.0}
    write_seconds(seconds, tmp_path / "s.json")
    recorded = module_seconds(tmp_path / "s.json")
    assert recorded == {"tests/spark/test_b.py": 15.0, "tests/test_a.py": 4.0}
    assert module_seconds(tmp_path / "missing.json") == {}
    modules = ["tests/test_a.py", "tests/new.py", "tests/spark/test_b.py"]
    order = sorted(modules, key=lambda m: module_rank(m, recorded))
    assert order == ["tests/new.py", "tests/spark/test_b.py", "tests/test_a.py"]


class _Worker:
    """A pytest-xdist worker as its scheduler sees it: the tests it is sent, in order."""

    def __init__(self, number: int) -> None:
        self.gateway = types.SimpleNamespace(id=f"gw{number}")
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def _deal(workers: int, collection: list[str], leaving: int = 0) -> dict[str, list[str]]:
    """The tests each of ``workers`` workers runs when
    :class:`tests.schedule.SessionSparkScheduling` deals ``collection``, the workers
    running one test each in turns; the first ``leaving`` workers end after their
    first test (a crashed worker's other tests go back to the queue)."""
    from tests.schedule import SessionSparkScheduling

    config = types.SimpleNamespace(
        getvalue=lambda name: [f"{workers}*popen"],
        option=types.SimpleNamespace(loadscopereorder=False),  # make test's order
    )
    sched = SessionSparkScheduling(config)
    nodes = [_Worker(n) for n in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    ran: dict = {node: [] for node in nodes}

    def run_next(node) -> None:
        index = node.sent[len(ran[node])]
        ran[node].append(collection[index])
        sched.mark_test_complete(node, index)

    for node in nodes[:leaving]:
        run_next(node)
        sched.remove_node(node)
    for _ in range(len(collection)):  # a test a round at least, or the dealing is stuck
        if not sched.has_pending:
            break
        for node in nodes[leaving:]:
            if len(ran[node]) < len(node.sent):
                run_next(node)
    assert not sched.has_pending, "tests left that no worker was sent"
    return {node.gateway.id: ran[node] for node in nodes}


def test_one_worker_of_three_never_starts_the_suites_spark_session():
    """With three workers, the last takes no module that uses the suite's Spark
    session while another worker can; the others take those first, then the rest;
    every test goes out once. Fewer workers deal in the queue's order; a worker left
    alone takes what is left, Spark modules included."""
    from tests.schedule import uses_session_spark

    modules = ["tests/spark/test_a.py", "tests/test_b.py", "tests/spark/test_c.py",
               "tests/test_suite_settings.py", "tests/tools/test_d.py", "tests/test_e.py"]  # fmt: skip
    collection = [f"{m}::test_{i}" for m in modules for i in range(3)]

    def modules_of(ids):
        return list(dict.fromkeys(i.split("::")[0] for i in ids))

    dealt = _deal(3, collection)
    assert sorted(i for ids in dealt.values() for i in ids) == sorted(collection)
    assert not any(uses_session_spark(m) for m in modules_of(dealt["gw2"]))
    for worker in ("gw0", "gw1"):
        spark = [uses_session_spark(m) for m in modules_of(dealt[worker])]
        assert spark == sorted(spark, reverse=True), (worker, dealt[worker])
    assert uses_session_spark("tests/spark/sub/test_x.py")
    assert not uses_session_spark("tests/sparkish/test_x.py")

    two = _deal(2, collection)
    assert sorted(i for ids in two.values() for i in ids) == sorted(collection)
    assert [modules_of(two[w])[0] for w in ("gw0", "gw1")] == modules[:2]  # the queue's order
    alone = _deal(3, collection, leaving=2)
    assert sorted(i for ids in alone.values() for i in ids) == sorted(collection)
    assert any(uses_session_spark(m) for m in modules_of(alone["gw2"]))


def test_only_the_named_modules_use_the_suites_spark_session():
    """A module outside tests.schedule.SESSION_SPARK_MODULES with a function taking
    the ``spark`` fixture (a test or a fixture of its own) would start a session in
    the worker kept free of one."""
    import ast

    from tests.schedule import ROOT, uses_session_spark

    users = set()
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                a.arg == "spark" for a in node.args.args + node.args.kwonlyargs
            ):
                users.add(path.relative_to(ROOT).as_posix())
    assert {"tests/test_suite_settings.py", "tests/spark/test_sessionize.py"} <= users
    assert sorted(m for m in users if not uses_session_spark(m)) == []


def test_the_recorded_seconds_name_only_modules_that_exist():
    """A module renamed or removed since tests/module_seconds.json was written is
    reported, so the file is written again (tests.schedule's doc says how)."""
    from tests.schedule import ROOT, module_seconds

    recorded = module_seconds()
    assert len(recorded) > 100
    missing = sorted(m for m in recorded if not (ROOT / m).is_file())
    assert not missing, f"tests/module_seconds.json names modules that are gone: {missing}"


def test_the_conftest_deals_recorded_modules_out_longest_first():
    """What a pytest-xdist worker collects (the order ``make test`` deals modules
    out in, with ``--no-loadscope-reorder``): the longer recorded module first, the
    order they were given in elsewhere."""
    from tests.schedule import ROOT, module_seconds

    short, long = "tests/test_public_api.py", "tests/checkpoint/test_gc.py"
    recorded = module_seconds()
    assert recorded[long] > recorded[short]

    def collected(**env):
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             "-p", "no:xdist", short, long],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
            # not the caller's PYTEST_ADDOPTS: a --junitxml there would be overwritten
            env={k: v for k, v in {**os.environ, "PYTEST_ADDOPTS": None, **env}.items()
                 if v is not None},  # fmt: skip
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        ids = [line.split("::")[0] for line in run.stdout.splitlines() if "::" in line]
        return list(dict.fromkeys(ids))

    assert collected(PYTEST_XDIST_WORKER="gw0") == [long, short]
    assert collected(PYTEST_XDIST_WORKER=None) == [short, long]


def test_a_spark_python_process_forgets_the_installed_pyspark_archives():
    """A process started as Spark starts its Python processes (the pip-installed
    PySpark's archives and spark-core jar first on ``PYTHONPATH``, after the suite's
    site folder) has
    neither archive on its path nor an importer of one cached, so that
    ``importlib.invalidate_caches()`` reads no archive's directory again."""
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    jars = Path(pyspark.__file__).parent / "jars"
    archives = sorted(str(p) for p in [*lib.glob("*.zip"), *jars.glob("spark-core*.jar")])
    assert str(lib / "pyspark.zip") in archives  # and py4j's, and the spark-core jar
    assert any(p.endswith(".jar") for p in archives)
    site = str(Path(pyspark.__file__).parent.parent)
    code = (
        f"import json, sys; ours = {archives!r}; print(json.dumps([[p for p in sys.path"
        " if p in ours], sorted(p for p in sys.path_importer_cache if p in ours)]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKER_SITE), *archives, site])}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [[], []]  # [on the path, importers cached]


def test_workers_collect_after_the_first_one_and_only_it_leaves_the_flag(tmp_path, monkeypatch):
    import threading
    import time

    from tests import first_collector as fc

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first = {"PYTEST_XDIST_TESTRUNUID": "run1", "PYTEST_XDIST_WORKER": "gw0"}
    other = {**first, "PYTEST_XDIST_WORKER": "gw2"}
    assert fc.flag_path({}) is None and fc.flag_path({"PYTEST_XDIST_TESTRUNUID": "x"}) is None
    flag = fc.flag_path(first)
    assert flag == fc.flag_path(other) == tmp_path / "sessionstore-collected-run1"
    assert fc.flag_path({**first, "PYTEST_XDIST_TESTRUNUID": "run2"}) != flag
    assert fc.is_first(first) and not fc.is_first(other) and not fc.is_first({})
    started = time.monotonic()
    assert not fc.wait_for_first(flag, timeout=0.3)  # no first worker: bounded
    assert time.monotonic() - started >= 0.3
    marker = threading.Timer(0.3, fc.mark_collected, [flag])
    marker.start()
    started = time.monotonic()
    assert fc.wait_for_first(flag, timeout=30)
    assert 0.25 <= time.monotonic() - started < 10
    marker.join()
