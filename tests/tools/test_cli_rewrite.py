"""``sessionstore rewrite`` as a subprocess: a module's function, its refusals.

A subprocess, not the test's process: the function's module is imported from the
working directory, as ``python -m`` would, into the process's ``sys.path`` and
``sys.modules``."""

from __future__ import annotations

from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.tools.reader import CheckpointSource, store_rows
from tests.tools.test_cli import spawn as run
from tests.tools.test_rewrite import KEYS, VERSIONS, files, source  # noqa: F401 - fixture


def _totals(uri):
    rows = store_rows(CheckpointSource(uri), "op", "sessions")
    return {(r["key"], r["start"]): r["value"]["total"] for r in rows}


def test_rewrite_with_a_function_of_a_module(source, tmp_path):  # noqa: F811
    before = _totals(source)
    everything = files(source)
    fixes = tmp_path / "work"
    fixes.mkdir()
    (fixes / "fixes.py").write_text(
        "def double(row):\n    row['value']['total'] *= 2\n    return row\n"
        "def stringly(row):\n    row['value']['total'] = 'x'\n    return row\n"
    )
    out = run("rewrite", source, "--operator", "op", "--function", "fixes:double", cwd=fixes)
    assert out.returncode == 2 and "a query seems to hold the checkpoint" in out.stderr
    for spec, message in [
        ("fixes", "give it as MODULE:NAME"),
        ("nowhere:double", "cannot import 'nowhere'"),
        ("fixes:missing", "'fixes' has no function 'missing'"),
        ("fixes:stringly", "aggregate 'total' (sum) holds int values; got str 'x'"),
    ]:
        out = run("rewrite", source, "--operator", "op", "--function", spec, "--force", cwd=fixes)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert message in out.stderr, out.stderr
    assert files(source) == everything
    out = run("rewrite", source, "--operator", "op", "--function", "fixes:double", "--force",
              cwd=fixes)  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = len(KEYS) * (VERSIONS + 1)
    assert out.stdout.strip() == (
        f"rewrote sessions of op: {rows} rows, {rows} changed, 0 deleted; version {VERSIONS} "
        "is a new commit; versions before it are no longer loadable"
    )
    assert _totals(source) == {k: 2 * v for k, v in before.items()}
    assert len(open_filesystem(source).child("op").list("_audit")) == 1
