"""Rewrite module paths moved by the re-layout (tools/relayout_map.txt) in files.

Usage: python tools/relayout.py FILE...   (rewrites in place, prints what changed)
then ``ruff check --fix --select I`` to sort the imports it wrote.

Not shipped: a tool for merging branches written against the old module paths.
Dotted names (``a.b.c``, in imports, ``mock.patch`` strings, ``-m`` entry points)
and slashed paths (``a/b/c.py``, in docs) are rewritten; a name is matched whole,
so ``checkpoint.change`` never rewrites ``checkpoint.changelog``.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

MAP = pathlib.Path(__file__).with_name("relayout_map.txt")


def _lines() -> list[tuple[str, str]]:
    pairs = []
    for line in MAP.read_text().splitlines():
        if line.strip() and not line.startswith("#") and "=>" not in line:
            old, new = (part.strip() for part in line.split("->"))
            pairs.append((old, new))
    return pairs


def moves() -> list[tuple[str, str]]:
    """Whole modules: ``old.module -> new.module``."""
    return [(old, new) for old, new in _lines() if ":" not in old]


def symbol_moves() -> dict[tuple[str, str], str]:
    """Names moved to another module: ``old.module:Name -> new.module`` (the module
    path after the module moves)."""
    out = {}
    for old, new in _lines():
        if ":" in old:
            module, name = old.split(":")
            out[(module, name)] = new
    return out


def renames() -> list[tuple[str, str, str]]:
    """Classes renamed in their module: ``module:Old => New``."""
    out = []
    for line in MAP.read_text().splitlines():
        if "=>" in line and not line.startswith("#"):
            old, new = (part.strip() for part in line.split("=>"))
            module, name = old.split(":")
            out.append((module, name, new))
    return out


def _renamed(text: str) -> str:
    """Every use of a renamed class in a file that imports it from its module."""
    for module, old, new in renames():
        if re.search(rf"^\s*from {re.escape(module)} import[^\n]*\b{old}\b", text, re.M) or (
            re.search(rf"^\s*from {re.escape(module)} import \([^)]*\b{old}\b", text, re.M)
        ):
            text = re.sub(rf"\b{old}\b", new, text)
    return text


def _symbols(text: str) -> str:
    """``from old import A, Name`` where Name moved: ``from old import A`` and
    ``from new import Name`` (ruff's isort puts them in order)."""
    table = symbol_moves()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.split("\n")
    nodes = [
        n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.level == 0
    ]
    for node in sorted(nodes, key=lambda n: -n.lineno):
        kept, moved = [], {}
        for alias in node.names:
            new = table.get((node.module, alias.name))
            text_of = alias.name + (f" as {alias.asname}" if alias.asname else "")
            if new is None:
                kept.append(text_of)
            else:
                moved.setdefault(new, []).append(text_of)
        if not moved:
            continue
        indent = " " * node.col_offset
        out = [f"{indent}from {node.module} import {', '.join(kept)}"] if kept else []
        out += [f"{indent}from {new} import {', '.join(names)}" for new, names in moved.items()]
        lines[node.lineno - 1 : node.end_lineno] = out
    return "\n".join(lines)


def _patterns() -> list[tuple[re.Pattern[str], str]]:
    out = []
    for old, new in moves():
        out.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w])"), new))
        old_path, new_path = old.replace(".", "/"), new.replace(".", "/")
        out.append((re.compile(rf"(?<![\w]){re.escape(old_path)}(?=\.py\b)"), new_path))
        # a path named from inside its top package (docs: "checkpoint/commit.py")
        old_tail, new_tail = old_path.split("/", 1)[1], new_path.split("/", 1)[1]
        if old_tail.startswith(("checkpoint/", "planning/", "driver/", "dev/")):
            out.append((re.compile(rf"(?<![\w/]){re.escape(old_tail)}(?=\.py\b)"), new_tail))
    return out


_FROM = re.compile(r"^(\s*)from ([\w.]+) import ([\w, ]+?)\s*$")


def _from_line(line: str, table: dict[str, str]) -> str:
    """``from package import module`` where the module moved: one line per moved
    module, its old name kept as the local name."""
    match = _FROM.match(line)
    if match is None:
        return line
    indent, package, names = match.groups()
    kept, moved = [], []
    for item in (n.strip() for n in names.split(",") if n.strip()):
        name, _, alias = (part.strip() for part in item.partition(" as "))
        new = table.get(f"{package}.{name}")
        if new is None:
            kept.append(item)
            continue
        parent, leaf = new.rsplit(".", 1)
        local = alias or name
        moved.append(
            f"{indent}from {parent} import {leaf}" + (f" as {local}" if local != leaf else "")
        )
    if not moved:
        return line
    if kept:
        moved.insert(0, f"{indent}from {package} import {', '.join(kept)}")
    return "\n".join(moved)


def rewrite(text: str, python: bool = True) -> str:
    table = dict(moves())
    text = "\n".join(_from_line(line, table) for line in text.split("\n"))
    for pattern, new in _patterns():
        text = pattern.sub(new, text)
    return _renamed(_symbols(text)) if python else text


def main(paths: list[str]) -> None:
    for name in paths:
        path = pathlib.Path(name)
        text = path.read_text()
        new = rewrite(text, python=path.suffix == ".py")
        if new != text:
            path.write_text(new)
            print("rewrote", name)


if __name__ == "__main__":
    main(sys.argv[1:])
