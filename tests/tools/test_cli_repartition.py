"""``sessionstore repartition`` on a local path, file:// and S3, run in the test's
process (:func:`tests.tools.cli_runner.run_cli`)."""

from __future__ import annotations

import pytest

from sessionstore.checkpoint.storage.filesystem import open_filesystem
from tests.checkpoint.test_repartition import rows, write_source
from tests.tools.test_cli import run, storage_flags


@pytest.mark.slow
@pytest.mark.parametrize("where", ["path", "file", "s3"])
def test_repartition_and_refusals(where, tmp_path, request):
    if where == "s3":
        base, options = request.getfixturevalue("s3_bucket")
    else:
        base, options = (str(tmp_path) if where == "path" else f"file://{tmp_path}"), None
    source, target = f"{base}/src", f"{base}/dst"
    write_source(source, str(tmp_path / "local"), options, versions=2, m=3)
    flags = storage_flags(options, tmp_path)
    out = run(
        "repartition", source, "--operator", "op", "--partitions", "5", "--to", target, *flags
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("repartitioned op version 2 from 3 to 5 partitions: ")
    assert rows(target, "table", options)[0] == rows(source, "table", options)[0]
    other = f"{base}/other"
    for args, message in [
        (["--operator", "nope", "--to", other], "no operator 'nope'"),
        (["--operator", "op", "--to", other, "--version", "7"], "version 7 of "),
        (["--operator", "op", "--to", target], "exists and is not empty"),
        (["--operator", "op", "--to", other, "--key-types", "string,float"], "'float' cannot"),
    ]:
        out = run("repartition", source, "--partitions", "5", *args, *flags)
        assert out.returncode == 2, out.stdout
        assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
        assert not open_filesystem(other, options).has_files()
