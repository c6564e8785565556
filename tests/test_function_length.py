"""No function of the store, checkpoint and engine layers is over 80 lines: a
longer one does several jobs, each of which deserves a name."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("sessionstore/stores", "sessionstore/checkpoint", "sessionstore/engine")
LIMIT = 80


def test_no_function_is_over_80_lines():
    long = {
        f"{path.relative_to(ROOT)}:{node.name}": node.end_lineno - node.lineno + 1
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > LIMIT
    }
    assert long == {}
