"""``run_cli`` gives what a subprocess gives (stdout, stderr, exit status: rich
tables at the same width, a help text, a one-line error) and leaves the test's
process as it found it."""

from __future__ import annotations

import logging
import os
import subprocess

from sessionstore.process import this_process
from tests.tools.cli_runner import run_cli
from tests.tools.test_cli import spawn, write_checkpoint


def test_the_output_and_status_are_those_of_a_subprocess(tmp_path):
    uri = f"file://{tmp_path}/remote"
    write_checkpoint(uri, None, tmp_path / "local")
    for args in (
        ["ls", uri],
        ["dump", uri, "--store", "plans", "--format", "table"],
        ["stats", uri],
        ["dump", "--help"],
        ["dump", uri, "--store", "nope"],
    ):
        # a subprocess each: what run_cli must match
        real, here = spawn(*args), run_cli(*args)
        assert (here.returncode, here.stdout, here.stderr) == (
            real.returncode, real.stdout, real.stderr,
        ), args  # fmt: skip


def test_the_process_is_left_as_it_was(tmp_path, monkeypatch):
    monkeypatch.delenv("SESSIONSTORE_STORAGE_OPTIONS_FILE", raising=False)
    owner, cwd, environ = this_process(), os.getcwd(), dict(os.environ)
    handlers = logging.getLogger().handlers[:]
    out = run_cli("ls", "remote", cwd=tmp_path,
                  env={"SESSIONSTORE_STORAGE_OPTIONS_FILE": str(tmp_path / "none")})  # fmt: skip
    assert out.returncode == 2 and "cannot read storage options file" in out.stderr
    assert this_process() is owner and os.getcwd() == cwd and dict(os.environ) == environ
    assert logging.getLogger().handlers == handlers


def test_os_exit_gives_its_status_and_pytest_goes_on(monkeypatch):
    import sessionstore.tools.cli as cli

    def leave(*args, **kwargs):
        print("sessionstore: no answer", file=cli.sys.stderr)
        os._exit(2)

    monkeypatch.setattr(cli.cli, "main", leave)
    out = run_cli("ls", "s3://bucket/ck")
    assert isinstance(out, subprocess.CompletedProcess)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", "sessionstore: no answer\n")
