"""The folder order of the two packages whose folders are layers: a module imports
only from its own folder and the folders listed before it (README, "Layout").

``spark_integration`` is sorted by where code runs: ``conf`` (read everywhere),
``coordinator`` (the driver's server and the client tasks call), ``execution``
(all that runs in a task, never planning), ``planning`` (the driver, once per
operator), ``operators`` (the public API); ``sessionstore/checkpoint`` by concern:
``storage``, ``records``, ``partition``, ``offline``, ``service``. What sits
directly in the package (its ``__init__``, ``datasource``, ``testing``, ``dev``)
is on top."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: package -> its folders, bottom first; then the modules on top of them all.
ORDERS = {
    "spark_integration": (
        ["conf", "coordinator", "execution", "planning", "operators"],
        {"__init__", "datasource", "testing", "dev"},
    ),
    "sessionstore.checkpoint": (
        ["storage", "records", "partition", "offline", "service"],
        {"__init__"},
    ),
}


def _imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)  # lazy and TYPE_CHECKING imports count too
            names += [f"{node.module}.{a.name}" for a in node.names]  # from pkg import module
    return names


def upward_imports(root: pathlib.Path, package: str, folders: list[str], top: set[str]) -> set[str]:
    """Every import in ``package`` (found under ``root``) of a folder listed after
    the importer's own, as ``"file: imported module"``; a part of the package that
    is neither a listed folder nor on top is reported too, so that a new folder
    gets its place in the order."""
    base = root / package.replace(".", "/")
    rank = {name: i for i, name in enumerate(folders)} | {name: len(folders) for name in top}
    found = set()
    for child in base.iterdir():
        part = child.stem if child.suffix == ".py" else child.name
        if (child.suffix == ".py" or (child / "__init__.py").exists()) and part not in rank:
            found.add(f"{child.name}: in no place of the order")
    for path in sorted(base.rglob("*.py")):
        own = rank.get(path.relative_to(base).parts[0].removesuffix(".py"))
        for name in _imports(path):
            if not name.startswith(package + "."):
                continue
            other = rank.get(name[len(package) + 1 :].split(".")[0])
            if own is not None and other is not None and other > own:
                found.add(f"{path.relative_to(root)}: {name}")
    return found


@pytest.mark.parametrize("package", sorted(ORDERS))
def test_every_import_points_down_the_folder_order(package):
    folders, top = ORDERS[package]
    base = ROOT / package.replace(".", "/")
    assert {p.name for p in base.iterdir() if (p / "__init__.py").exists()} >= set(folders)
    assert upward_imports(ROOT, package, folders, top) == set()


def test_execution_never_imports_planning_even_lazily():
    found = [
        (str(path.relative_to(ROOT)), name)
        for path in (ROOT / "spark_integration" / "execution").rglob("*.py")
        for name in _imports(path)
        if name.startswith(("spark_integration.planning", "spark_integration.operators"))
    ]
    assert found == []


def test_the_check_reports_an_upward_import_and_an_unplaced_folder(tmp_path):
    package = tmp_path / "pkg"
    for folder, text in {
        "low": "import pkg.high.thing\n",
        "high": "def f():\n    from pkg.low import x\n",
        "stray": "",
    }.items():
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
        (package / folder / "mod.py").write_text(text)
    (package / "__init__.py").write_text("from pkg import low\n")
    found = upward_imports(tmp_path, "pkg", ["low", "high"], {"__init__"})
    assert found == {"pkg/low/mod.py: pkg.high.thing", "stray: in no place of the order"}
