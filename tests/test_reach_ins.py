"""No module reads another module's ``_private`` names: what one module needs of
another is public and documented, so a reader changes a private name in one file.

The check parses every module of ``sessionstore/`` and ``spark_integration/`` and
reports, as ``(file, name)``:

* ``from x import _y`` where ``x`` is one of our modules;
* ``m._y`` where ``m`` names one of our imported modules;
* ``obj._y`` on anything but ``self`` or ``cls``, where ``_y`` is not defined in the
  same module (a def, class, assignment, attribute store, argument or import) but
  is defined in another of ours: a private of that other module.

Dunders are public. Other libraries' private names (``os._exit``, a pandas frame's
``_get_column_array``) are outside this rule: it is about our own seams.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("sessionstore", "spark_integration")

#: Reach-ins tolerated as (module, name) pairs: none. An entry must still occur
#: (the list only shrinks), so a tolerated one cannot outlive its reason.
KNOWN: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _ours(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in PACKAGES


def defined_names(tree: ast.AST) -> set[str]:
    """Every name a module defines or binds: what its own code may read as ``obj._y``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


def reach_ins(tree: ast.AST, own_privates: set[str]) -> set[str]:
    """The private names of other modules that ``tree`` reads. ``own_privates`` are
    the private names defined anywhere in our packages."""
    defined = defined_names(tree)
    modules: dict[str, bool] = {}  # a name bound to a module -> whether it is ours
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                modules[bound] = _ours(alias.name)
        elif isinstance(node, ast.ImportFrom):
            ours = node.level > 0 or _ours(node.module)
            for alias in node.names:
                if _private(alias.name):
                    if ours:
                        found.add(alias.name)
                else:  # ``from pkg import module`` binds a module (or a plain name)
                    modules.setdefault(alias.asname or alias.name, ours)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        if not isinstance(node.ctx, ast.Load):
            continue
        owner = node.value
        if isinstance(owner, ast.Name):
            if owner.id in ("self", "cls"):
                continue
            if owner.id in modules and node.attr not in defined:
                if modules[owner.id] and node.attr in own_privates:
                    found.add(node.attr)
                continue
        if node.attr not in defined and node.attr in own_privates:
            found.add(node.attr)
    return found


def _modules() -> dict[str, ast.AST]:
    return {
        str(path.relative_to(ROOT)): ast.parse(path.read_text())
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _project_reach_ins() -> set[tuple[str, str]]:
    trees = _modules()
    own = {n for tree in trees.values() for n in defined_names(tree) if _private(n)}
    return {(path, name) for path, tree in trees.items() for name in reach_ins(tree, own)}


def test_no_module_reads_another_modules_private_names():
    found = _project_reach_ins()
    assert found - KNOWN == set(), "read a public name instead (or make one)"


def test_the_known_list_only_shrinks():
    assert KNOWN - _project_reach_ins() == set(), "gone: remove it from KNOWN"


OTHER = """
class Store:
    def __init__(self):
        self._db = None
        self._grace = 1
def _helper():
    pass
"""


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from sessionstore.x import _helper", {"_helper"}),
        ("from .x import _helper", {"_helper"}),
        ("import sessionstore.x as m\nm._helper()", {"_helper"}),
        ("from sessionstore import x\nx._helper()", {"_helper"}),
        ("def f(table):\n    return table._db.batch()", {"_db"}),
        ("def f(table):\n    return table._grace", {"_grace"}),
        # not reach-ins: own names, self/cls, dunders, other libraries' privates
        (
            "class A:\n    def f(self, other):\n        self._db = 1\n        return other._db",
            set(),
        ),
        ("class A:\n    @classmethod\n    def f(cls):\n        return cls._helper", set()),
        ("def f(x):\n    return x.__dict__", set()),
        ("import os\nos._exit(0)", set()),
        ("from pyspark.sql import types as T\nT._parse_datatype_string('int')", set()),
        ("from _collections import _tuplegetter", set()),
        ("def f(frame):\n    return frame._get_column_array(0)", set()),
    ],
)
def test_the_check_finds_each_form_of_reach_in(source, expected):
    own = {n for n in defined_names(ast.parse(OTHER)) if _private(n)}
    assert reach_ins(ast.parse(source), own) == expected
