"""``sessionstore erase`` on a local path and S3: on the path as subprocesses (the
command's real entry point), on S3 in the test's process
(:func:`tests.tools.cli_runner.run_cli`)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessionstore.checkpoint.storage.filesystem import open_filesystem
from tests.checkpoint.test_erase import ERASED, rows_of_keys
from tests.checkpoint.test_repartition import SPECS, rows, write_source
from tests.tools.test_cli import run as run_in_process
from tests.tools.test_cli import spawn, storage_flags


@pytest.mark.slow
@pytest.mark.parametrize("where", ["path", "s3"])
def test_erase_from_a_parquet_file_and_refusals(where, tmp_path, request):
    if where == "s3":
        base, options = request.getfixturevalue("s3_bucket")
    else:
        base, options = str(tmp_path), None
    uri = f"{base}/ckpt"
    run = spawn if where == "path" else run_in_process  # on the path, erase's real entry point
    write_source(uri, str(tmp_path / "local"), options, versions=3, m=2)
    flags = storage_flags(options, tmp_path)
    keys = str(tmp_path / "keys.parquet")
    columns = list(zip(*ERASED, strict=True))
    pq.write_table(pa.table({"user": list(columns[0]), "n": list(columns[1])}), keys)
    before = {s.name: rows(uri, s.name, options)[0] for s in SPECS}
    # just committed: taken as held by a query
    out = run("erase", uri, "--operator", "op", "--keys-from", keys, *flags)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "a query seems to hold the checkpoint" in out.stderr
    assert {s.name: rows(uri, s.name, options)[0] for s in SPECS} == before
    for args, message in [
        (["--operator", "nope", "--keys-from", keys], "no operator 'nope'"),
        (["--operator", "op", "--key", "a"], "keyed by 2 columns"),
        (["--operator", "op"], "no key to erase"),
    ]:
        out = run("erase", uri, "--force", *args, *flags)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert message in out.stderr, out.stderr
    out = run("erase", uri, "--operator", "op", "--keys-from", keys, "--force", *flags)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == [s.name for s in SPECS]
    assert all(line.endswith(" rows erased") and " 0 rows" not in line for line in lines[:-1])
    assert lines[-1].startswith("erased 3 keys (sha256 ")
    assert "version 3 is a new commit; versions before it are no longer loadable" in lines[-1]
    if options is None:  # the object scan reads a local checkpoint
        assert rows_of_keys(uri, ERASED) == []
    for spec in SPECS:
        after = rows(uri, spec.name, options)[0]
        assert after == [r for r in before[spec.name] if r["key"] not in ERASED], spec.name
    assert len(open_filesystem(uri, options).child("op").list("_audit")) == 1
