"""The release as a user installs it: ``make dist``'s wheel in a fresh virtualenv
(not editable, this source tree nowhere on the path) runs the CLI, the README's
stores example and a ``sessionize`` query.

The wheel is built once per session (or taken from ``SESSIONSTORE_WHEEL``, as
``make cluster-test`` does with ``dist/``'s), the virtualenv once per session too,
and the ``sessionize`` query run once in it: a background job (``tests.background``)
started when the suite's collection selects these tests, so the build, the install
and the query's Spark run beside the tests before them.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests import background
from tests.packaging import ROOT, build_dist, clean_env, make_venv, wheel_files, wheel_from_env

pytestmark = pytest.mark.slow

STORES_HEADING = "### Stores"


def build(tag: str) -> tuple[Path | None, Path]:
    """``(sdist or None, wheel)``: built unless ``SESSIONSTORE_WHEEL`` names one."""
    wheel = wheel_from_env()
    if wheel is not None:
        return None, wheel
    return build_dist(background.scratch("dist"))


def install(tag: str) -> Path:
    """A fresh virtualenv with the wheel and its ``spark`` extra: its ``python``."""
    _, wheel = background.result("dist", build)
    # no pip of its own and no byte-compiling at install: nothing here needs them
    return make_venv(background.scratch("venv") / "env", [f"{wheel}[spark]"], own_pip=False)



def query(tag: str) -> tuple[str, Path]:
    """The ``sessionize`` query run on the installed wheel: its stdout and folder."""
    python, folder = background.result("dist-venv", install), background.scratch("wheel-query")
    out = run(
        python, ["-c", SESSIONIZE, str(folder)], folder,
        PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python),
        SPARK_LOCAL_IP="127.0.0.1",
    )  # fmt: skip
    return out, folder


def background_jobs(item: pytest.Item) -> dict:
    """The build, the virtualenv and the query, started at collection."""
    return {"dist": build, "dist-venv": install, "dist-query": query}


@pytest.fixture(scope="session")
def dist() -> tuple[Path | None, Path]:
    """``(sdist or None, wheel)``: built unless ``SESSIONSTORE_WHEEL`` names one."""
    return background.result("dist", build)


@pytest.fixture(scope="session")
def installed(dist) -> Path:
    """A fresh virtualenv with the wheel and its ``spark`` extra: its ``python``."""
    return background.result("dist-venv", install)


def run(python: Path, args: list[str], cwd: Path, **env: str) -> str:
    """Run ``python args`` (or a script of its venv) where no source tree is on the
    path; return its stdout, failing with its stderr."""
    proc = subprocess.run(
        [str(python), *args], capture_output=True, text=True, timeout=600, cwd=cwd,
        env=clean_env(**env),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_wheel_holds_only_the_packages_the_console_script_and_metadata(dist):
    sdist, wheel = dist
    names = wheel_files(wheel)
    (info,) = {n.split("/")[0] for n in names if ".dist-info/" in n}
    assert info == "sessionstore-0.1.0.dist-info"
    assert {n.split("/")[0] for n in names} == {"sessionstore", "spark_integration", info}
    assert "sessionstore/tools/cli.py" in names and "spark_integration/operators/sessionize.py" in names
    assert not [n for n in names if n.endswith((".pyc", ".so")) or "/tests/" in n]
    # every module of the source tree, nothing else
    source = {
        str(p.relative_to(ROOT))
        for package in ("sessionstore", "spark_integration")
        for p in (ROOT / package).rglob("*.py")
    }
    assert {n for n in names if not n.startswith(info)} == source
    with __import__("zipfile").ZipFile(wheel) as archive:
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        metadata = archive.read(f"{info}/METADATA").decode()
    assert "[console_scripts]\nsessionstore = sessionstore.tools.cli:main" in entry_points
    assert "Requires-Python: <3.14,>=3.11" in metadata
    for version in ("3.11", "3.12", "3.13"):
        assert f"Classifier: Programming Language :: Python :: {version}" in metadata
    assert "Provides-Extra: spark" in metadata
    if sdist is not None:  # built here: make dist's two artefacts
        assert sdist.name == "sessionstore-0.1.0.tar.gz"


def test_installed_wheel_runs_the_cli_from_site_packages(installed, tmp_path):
    where = run(
        installed,
        ["-c", "import sessionstore, spark_integration; "
               "print(sessionstore.__file__); print(spark_integration.__file__)"],
        tmp_path,
    )  # fmt: skip
    site = installed.parent.parent / "lib"
    for line in where.split():
        assert Path(line).is_relative_to(site), where  # the installed copy, not the tree
    assert str(ROOT) not in where
    helptext = run(installed.parent / "sessionstore", ["--help"], tmp_path)
    for command in ("ls", "dump", "get", "verify", "restore", "stats"):
        assert re.search(rf"^\s+{command}\b", helptext, re.M), helptext


def readme_stores_example() -> tuple[str, list[str]]:
    """The README's stores example, each expression statement that a ``# result``
    comment follows turned into a print of its repr, and those results in order."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(STORES_HEADING) :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    lines = block.splitlines()
    expected = []
    tree = ast.parse(block)
    printed: dict[int, tuple[int, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant):
            after = lines[node.end_lineno] if node.end_lineno < len(lines) else ""
            if after.strip().startswith("# "):
                source = ast.get_source_segment(block, node)
                printed[node.lineno] = (node.end_lineno, f"print(repr({source}))")
    out = []
    skip_to = 0
    for number, line in enumerate(lines, start=1):
        if number <= skip_to:
            continue
        if number in printed:
            end, call = printed[number]
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + call)
            expected.append(lines[end].strip()[2:])
            skip_to = end
        else:
            out.append(line)
    assert expected, "the README's stores example shows no results"
    return "\n".join(out), expected


def test_readme_stores_example_runs_on_the_installed_wheel(installed, tmp_path):
    script, expected = readme_stores_example()
    out = run(installed, ["-c", script], tmp_path)
    assert out.splitlines() == expected


SESSIONIZE = """
import json, sys
from spark_integration import StateBackend, sessionize
from spark_integration.conf.local_spark import local_spark

spark = local_spark("wheel-check")
clicks = spark.createDataFrame(
    [("alice", 0, 5), ("bob", 60_000, 2), ("alice", 1_200_000, 7), ("alice", 4_000_000, 1)],
    "user string, ts long, amount long",
)
out = sessionize(clicks, key="user", timestamp="ts", gap="30 minutes",
                 aggregations={"clicks": "count", "spent": ("sum", "amount")}, emit="update",
                 backend=StateBackend("file://" + sys.argv[1] + "/ckpt",
                                      local_dir=sys.argv[1] + "/local"),
                 name="wheel_sessions")
print("RESULT " + json.dumps(sorted(list(r) for r in out.collect())))
spark.stop()
"""


def test_sessionize_batch_query_runs_on_the_installed_wheel(installed):
    out, tmp_path = background.result("dist-query", query)
    (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert json.loads(line[len("RESULT ") :]) == [
        ["alice", 0, 1_200_000, 2, 12, "upsert"],
        ["alice", 4_000_000, 4_000_000, 1, 1, "upsert"],
        ["bob", 60_000, 60_000, 1, 2, "upsert"],
    ]
    # the tasks ran the installed code too (Spark's Python workers: PYSPARK_PYTHON)
    assert (tmp_path / "ckpt" / "wheel_sessions").is_dir()
