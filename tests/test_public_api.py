"""The top-level package: every exported name imports, the names the docs show users
importing are exported, and importing it loads no pyspark."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sessionstore
import sessionstore.operators

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _documented_imports() -> set[str]:
    """Names the docs import from ``sessionstore`` or one of its modules."""
    names = set()
    for doc in DOCS:
        for found in re.finditer(
            r"^\s*from sessionstore[\w.]* import (.+)$", doc.read_text(), re.M
        ):
            names.update(n.strip() for n in found.group(1).split(","))
    return names


def _readme_operators() -> set[str]:
    """The operator classes the README's Operators section lists."""
    text = (ROOT / "README.md").read_text()
    # the section under the "Operators" heading (any level), up to the next heading
    section = re.split(r"\n#+ Operators\n", text, maxsplit=1)[1]
    section = re.split(r"\n#+ ", section, maxsplit=1)[0]
    prose = re.sub(r"```.*?```", "", section, flags=re.S)
    return set(re.findall(r"`([A-Z]\w+)`", prose))


def test_every_exported_name_imports():
    assert len(set(sessionstore.__all__)) == len(sessionstore.__all__)
    for name in sessionstore.__all__:
        assert getattr(sessionstore, name) is not None, name
    namespace: dict = {}
    exec("from sessionstore import *", namespace)
    assert set(sessionstore.__all__) <= set(namespace)


def test_documented_names_are_exported_from_the_top_level():
    operators = _readme_operators()
    assert operators == {
        "SessionWindowAggregator",
        "WindowAggregator",
        "TimeWindows",
        "CountWindowAggregator",
        "TemporalJoin",
        "WindowedJoin",
    }
    documented = _documented_imports() | operators
    assert {"SessionWindows", "StateDB", "StoreSpec"} <= documented  # the parser works
    assert documented - set(sessionstore.__all__) == set()


def test_operators_are_the_same_objects_in_both_packages():
    for name in sessionstore.operators.__all__:
        assert getattr(sessionstore, name) is getattr(sessionstore.operators, name), name
    assert set(sessionstore.operators.__all__) <= set(sessionstore.__all__)


def test_importing_the_package_loads_no_pyspark():
    code = "import sys, sessionstore; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_process_that_unpickles_a_backend_loads_no_state_provider():
    """Spark runs a due source's reader and a Python data source's planning in
    processes of their own, which unpickle the operator's ``StateBackend`` and read
    the checkpoint's records, never its state: neither loads the state provider
    and its stores (about half of such a process's imports of ours)."""
    from spark_integration import StateBackend

    code = (
        "import pickle, sys\n"
        "backend = pickle.loads(sys.stdin.buffer.read())\n"
        "import spark_integration.planning.due_batches\n"
        "loaded = [m for m in sys.modules if m.startswith('sessionstore.stores')\n"
        "          or m == 'sessionstore.checkpoint.partition.provider']\n"
        "print(backend.retain_versions, loaded)\n"
    )
    data = pickle.dumps(StateBackend("file:///tmp/state", retain_versions=5))
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == "5 []"


def test_a_package_imported_alone_still_reaches_its_subpackages():
    """``import sessionstore`` used to import its subpackages, and code written
    against it reaches them as attributes (``sessionstore.checkpoint.StoreSpec``);
    the lazy namespace imports them on first use too, and still no other name."""
    code = (
        "import sessionstore, spark_integration\n"
        "print(sessionstore.checkpoint.StoreSpec is sessionstore.StoreSpec)\n"
        "print(sessionstore.stores.registry.store_class('session').__name__)\n"
        "print(spark_integration.conf.__name__)\n"
        "try:\n"
        "    sessionstore.no_such_name\n"
        "except AttributeError as error:\n"
        "    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "True",
        "SessionStore",
        "spark_integration.conf",
        "module 'sessionstore' has no attribute 'no_such_name'",
    ]


@pytest.mark.parametrize(
    "package", ["sessionstore", "sessionstore.checkpoint", "spark_integration"]
)
def test_a_lazy_package_tells_type_checkers_the_names_it_exports(package):
    """What a lazy ``__init__`` imports for type checkers (``if TYPE_CHECKING:``)
    is exactly its map of public names, from the same modules: the two lists
    cannot drift apart unnoticed."""
    import ast
    import importlib

    module = importlib.import_module(package)
    tree = ast.parse(open(module.__file__).read())
    checked = {
        alias.asname or alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert checked == module._EXPORTS
    assert module.__all__ == list(module._EXPORTS)
