"""Credentials stay off command lines and out of what is shown (docs/security.md):
the CLI reads storage options from a file (``--storage-options-file`` or
``$SESSIONSTORE_STORAGE_OPTIONS_FILE``), warns when a secret is given with
``--storage-option``, and every shown or logged form of the options masks
credentials, ``proxy_options`` and ``external_id`` included."""

from __future__ import annotations

import json
import os

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.storage.filesystem import redact, secret_values
from tests.tools.cli_runner import run_cli
from tests.tools.test_cli import run, spawn

SPECS = [StoreSpec("s", "kv", 0)]


def _written(uri, options, local):
    p = StateStoreProvider(uri, "op", 0, SPECS, str(local), storage_options=options)
    h = p.get_store(0)
    h["s"].put("k", "v")
    assert h.commit() == 1
    p.close()


def test_a_secret_on_the_command_line_is_warned_about_by_name_only(tmp_path):
    uri = f"file://{tmp_path}/ck"
    _written(uri, None, tmp_path / "local")
    # a subprocess: the claim is about a real command line (what ps shows)
    out = spawn("ls", uri, "--storage-option=secret_key=hunter2", "--storage-option=region=x",
                "--storage-option=external_id=ext-0042")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "sessionstore: warning: --storage-option external_id, secret_key puts a secret on the "
        "command line, which other local users can read (ps); give it in a "
        "--storage-options-file (or $SESSIONSTORE_STORAGE_OPTIONS_FILE) or the environment "
        "instead"
    ]
    assert "hunter2" not in out.stderr + out.stdout


def test_options_from_a_file_or_its_environment_variable_reach_the_store(s3_bucket, tmp_path):
    """Every option (the endpoint too) only in the file: the read works only if the
    file was used."""
    uri, options = s3_bucket
    _written(uri, options, tmp_path / "local")
    path = tmp_path / "s3.options"
    path.write_text("# the test endpoint\n" + "".join(f"{k} = {v}\n" for k, v in options.items()))
    os.chmod(path, 0o600)
    out = run("get", uri, "--store", "s", "--key", "k", "--storage-options-file", str(path))
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    assert [json.loads(line)["value"] for line in out.stdout.splitlines()] == ["v"]
    out = run_cli("get", uri, "--store", "s", "--key", "k",
                  env={"SESSIONSTORE_STORAGE_OPTIONS_FILE": str(path)})  # fmt: skip
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    assert [json.loads(line)["value"] for line in out.stdout.splitlines()] == ["v"]


def test_a_bad_line_of_the_options_file_is_named_by_number_not_text(tmp_path):
    path = tmp_path / "options"
    path.write_text("# credentials\n\nregion=x\nsecret_key hunter2\n")
    out = run("ls", f"file://{tmp_path}", "--storage-options-file", str(path))
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"sessionstore: {path}, line 4: a storage option is KEY=VALUE"
    ]
    out = run("ls", f"file://{tmp_path}", "--storage-options-file", str(tmp_path / "none"))
    assert out.returncode == 2
    assert "cannot read storage options file" in out.stderr


PROXY = {"scheme": "http", "host": "proxy.corp", "port": 3128, "username": "svc",
         "password": "pr0xy-pass"}  # fmt: skip


@pytest.mark.parametrize("proxy", [PROXY, "http://svc:pr0xy-pass@proxy.corp:3128"])
def test_proxy_options_and_external_id_are_masked_wherever_options_are_shown(tmp_path, proxy):
    from spark_integration.conf.backend import StateBackend

    options = {"region": "eu-west-1", "proxy_options": proxy, "external_id": "ext-0042",
               "role_arn": "arn:aws:iam::1:role/r", "secret_key": "s3cr3t"}  # fmt: skip
    assert redact(options) == {
        "region": "eu-west-1", "proxy_options": "***", "external_id": "***",
        "role_arn": "arn:aws:iam::1:role/r", "secret_key": "***",
    }  # fmt: skip
    shown = repr(StateBackend("s3://bucket/ck", storage_options=options))
    provider = StateStoreProvider(f"file://{tmp_path}/ck", "op", 0, SPECS, str(tmp_path / "l"),
                                  storage_options=options)  # fmt: skip
    shown += repr(provider) + repr(provider.storage_options)
    for secret in ("pr0xy-pass", "ext-0042", "s3cr3t"):
        assert secret not in shown
    # what a storage's error messages mask: each credential, a proxy's user and password
    masked = set(secret_values(options))
    if isinstance(proxy, dict):
        assert masked == {"svc", "pr0xy-pass", "ext-0042", "s3cr3t"}
    else:
        assert masked == {proxy, "ext-0042", "s3cr3t"}
