"""Readers refuse pickled stores (docs/security.md): a checkpoint whose _metadata
names the pickle serde is code from whoever can write it. ``dump``, ``get``,
``verify``, ``stats``, ``restore`` and ``repartition`` exit 2 with one line naming
the store and ``--allow-pickle``, and unpickle nothing; with the opt-in they read.

The refusals run the CLI as subprocesses, one per reader command (the real entry
point of each); the rest runs it in the test's process."""

from __future__ import annotations

import json
import pickle

import msgpack
import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.encoding.serde import BytesSerde
from sessionstore.errors import PickleRefusedError
from sessionstore.stores.spec import refuse_pickle
from tests.tools.test_cli import run, spawn


class Marker:
    """Unpickling this creates the file ``path`` (stands for any code a pickle runs)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _pickled_checkpoint(tmp_path):
    """A checkpoint with a kv store ``s`` recorded with the pickle serde: key ``k1``
    holds ``"hello"``, key ``k2`` a pickle that creates ``marker`` when loaded
    (planted as bytes: the writer never runs it)."""
    uri = f"file://{tmp_path}/ck"
    marker = tmp_path / "marker"
    # written as bytes (a tampered file: the writer never runs the pickle)
    p = StateStoreProvider(uri, "op", 0, [StoreSpec("s", "kv", 0, value_serde=BytesSerde())],
                           str(tmp_path / "local"))  # fmt: skip
    h = p.get_store(0)
    h["s"].put("k1", pickle.dumps("hello"))
    h["s"].put("k2", pickle.dumps(Marker(str(marker))))
    assert h.commit() == 1
    p.close()
    # _metadata records the pickle serde, as a tampered or an old checkpoint would
    path = tmp_path / "ck" / "op" / "_metadata"
    metadata = msgpack.unpackb(path.read_bytes())
    assert metadata["stores"][0]["value_serde"] == "bytes"
    metadata["stores"][0]["value_serde"] = "pickle"
    path.write_bytes(msgpack.packb(metadata))
    return uri, marker


@pytest.mark.parametrize(
    "command",
    [
        ["dump", "{uri}", "--store", "s"],
        ["get", "{uri}", "--store", "s", "--key", "k2"],
        ["verify", "{uri}"],
        ["stats", "{uri}"],
        ["restore", "{uri}", "--operator", "op", "--partition", "0", "--to", "{tmp}/restored"],
        ["repartition", "{uri}", "--operator", "op", "--partitions", "2", "--to", "{tmp}/re",
         "--key-types", "string"],
    ],
    ids=lambda c: c[0],
)  # fmt: skip
def test_a_reader_refuses_a_pickled_store_in_one_line_and_unpickles_nothing(tmp_path, command):
    uri, marker = _pickled_checkpoint(tmp_path)
    args = [a.format(uri=uri, tmp=tmp_path) for a in command]
    out = spawn(*args)  # a subprocess: each reader command's real entry point
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"sessionstore: store 's' of {uri}/op is pickled")
    assert "--allow-pickle" in lines[0]
    assert out.stdout == ""
    assert not marker.exists()


def test_with_the_opt_in_dump_and_get_read_the_pickled_store(tmp_path):
    uri, marker = _pickled_checkpoint(tmp_path)
    out = run("get", uri, "--store", "s", "--key", "k1", "--allow-pickle")
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["value"] for line in out.stdout.splitlines()] == ["hello"]
    assert not marker.exists()  # get read k1 only
    out = run("dump", uri, "--store", "s", "--allow-pickle")
    assert out.returncode == 0, out.stderr
    assert marker.exists()  # the opt-in does unpickle what is stored
    assert run("verify", uri, "--allow-pickle").returncode == 0


def test_refuse_pickle_names_the_store_and_the_option():
    records = [{"name": "a", "value_serde": "msgpack"}, {"name": "b", "value_serde": "pickle"}]
    with pytest.raises(PickleRefusedError) as caught:
        refuse_pickle(records, "s3://bucket/ck/op", option='.option("allowPickle", "true")')
    assert str(caught.value) == (
        "store 'b' of s3://bucket/ck/op is pickled, and unpickling runs code from the "
        'checkpoint; pass .option("allowPickle", "true") only if you trust every writer '
        "of this checkpoint"
    )
    refuse_pickle(records, "x", allow_pickle=True)
    refuse_pickle(records[:1], "x")
    with pytest.raises(PickleRefusedError):
        refuse_pickle([{"name": "k", "key_serde": "pickle"}], "x")
