"""No function in ``sessionstore/`` or ``spark_integration/`` is over 80 lines: a
longer one does several jobs, each of which deserves a name. A function that must
be one piece says why in a comment starting ``# one piece:`` inside it."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("sessionstore", "spark_integration")
LIMIT = 80
REASON = "# one piece:"


def long_functions() -> dict[str, int]:
    """Functions over the limit without a stated reason, as ``path:name`` -> lines."""
    long = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                size = node.end_lineno - node.lineno + 1
                body = lines[node.lineno - 1 : node.end_lineno]
                if size > LIMIT and not any(line.strip().startswith(REASON) for line in body):
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = size
    return long


def test_no_function_is_over_80_lines():
    assert long_functions() == {}
