"""No pickle from a processor checkpoint without an opt-in (docs/security.md).

No release writes pickled processor state, so a ``_metadata`` that records the
``pickle`` serde for a processor store was written by whoever can write the
bucket. The checkpoint here holds, under the pickle serde, key ``a``'s state as a
pickled value and key ``b``'s as a pickle that creates ``marker`` when loaded
(stands for any code). The job (a provider with the operator's own spec, as a
restart builds it), the readers (``dump``, ``get``, the reader library behind
them and the data source) refuse it without the opt-in and create no marker; with
it they read. A reader decides from one read of ``_metadata``: a change between
its check and its restore is refused, not adopted."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal

import msgpack
import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.encoding.keys import encode_key
from sessionstore.encoding.serde import PickleSerde
from sessionstore.errors import PickleRefusedError
from sessionstore.operators.processors import BatchTimes, ProcessorHandle, ProcessorRunner
from sessionstore.tools.reader import open_source, store_rows
from tests.tools.test_cli import run
from tests.tools.test_cli_pickle import Marker

SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "ts", "type": "timestamp_ntz", "nullable": True, "metadata": {}},
        {"name": "amount", "type": "decimal(10,2)", "nullable": True, "metadata": {}},
    ],
}
T1 = datetime(2024, 5, 1, 12, 0, 0, 7)


class Last:
    """Emits the value a key held before the batch and keeps its last row."""

    def init(self, handle):
        self.last = handle.getValueState("last", SCHEMA)

    def handleInputRows(self, key, rows, timerValues):
        before = self.last.get()
        for row in rows:
            self.last.update(row)
        yield key, before

    def close(self):
        pass


def _batch(provider, version, rows):
    handle = provider.get_store(version)
    runner = ProcessorRunner(Last(), ProcessorHandle(handle["processor"], "None"), "None")
    groups = [((k,), None, lambda r=r: iter(r)) for k, r in sorted(rows.items())]
    out = runner.run_batch(groups, BatchTimes(-1, -1)).outputs
    assert handle.commit() == version + 1
    return out


def _tampered(tmp_path):
    """``(uri, marker)`` of the checkpoint described in the module doc."""
    uri, marker = f"file://{tmp_path}/ck", tmp_path / "marker"
    planted = [StoreSpec("processor", "processor", 0, value_serde=PickleSerde())]
    p = StateStoreProvider(uri, "op", 0, planted, str(tmp_path / "writer"))
    assert _batch(p, 0, {"a": [(T1, Decimal("1.50"))]}) == [(("a",), None)]
    h = p.get_store(1)
    h["processor"].write(encode_key("b"), encode_key("last"), Marker(str(marker)))
    assert h.commit() == 2
    p.close()
    metadata = msgpack.unpackb((tmp_path / "ck" / "op" / "_metadata").read_bytes())
    assert metadata["stores"][0]["value_serde"] == "pickle"
    assert not marker.exists()  # planted, never loaded
    return uri, marker


def _job(uri, local, allow_pickle=False):
    """The provider a restarted transform_with_state task builds (the operator's
    spec names no serde)."""
    specs = [StoreSpec("processor", "processor", 0)]
    return StateStoreProvider(uri, "op", 0, specs, str(local), allow_pickle=allow_pickle)


def test_the_job_refuses_a_pickle_recorded_in_metadata_without_the_opt_in(tmp_path):
    uri, marker = _tampered(tmp_path)
    with pytest.raises(PickleRefusedError) as caught:
        _job(uri, tmp_path / "job")
    assert str(caught.value) == (
        f"store 'processor' of {uri}/op is pickled, and unpickling runs code from the "
        "checkpoint; pass allow_pickle=True (StateBackend, or spark.sessionstore.allowPickle) "
        "only if you trust every writer of this checkpoint"
    )
    assert not marker.exists()


def test_with_the_opt_in_the_job_reads_and_keeps_the_pickled_state(tmp_path):
    uri, marker = _tampered(tmp_path)
    p = _job(uri, tmp_path / "job", allow_pickle=True)
    assert _batch(p, 2, {"a": [(T1, Decimal("2.00"))]}) == [(("a",), (T1, Decimal("1.50")))]
    assert not marker.exists()  # only key a was read
    with pytest.raises(TypeError):  # the marker's pickle loads as a file, not a state
        _batch(p, 3, {"b": [(T1, Decimal("3.00"))]})
    assert marker.exists()  # the opt-in does unpickle what is stored
    p.close()


def test_a_task_takes_the_opt_in_from_its_backend(tmp_path):
    """What a Spark task runs (partition_state, the warm providers' service): the
    backend's allow_pickle reaches the provider, and is part of its cache key."""
    from spark_integration import StateBackend
    from spark_integration.execution.context import TaskContext, TaskInfo
    from spark_integration.execution.partition_state import partition_state

    uri, marker = _tampered(tmp_path)
    specs = [StoreSpec("processor", "processor", 0)]
    refused = StateBackend(uri, local_dir=str(tmp_path / "task"))
    with pytest.raises(PickleRefusedError, match="allow_pickle=True"):
        with partition_state(refused, "op", TaskContext(TaskInfo(0, 2, 0)), specs, 1):
            pass
    allowed = StateBackend(uri, local_dir=str(tmp_path / "task"), allow_pickle=True)
    with partition_state(allowed, "op", TaskContext(TaskInfo(0, 2, 0)), specs, 1) as (h, _):
        assert h["processor"].pickled
        assert h["processor"].load(encode_key("a"), [encode_key("last")]) == [
            ((T1, Decimal("1.50")), None)
        ]
    assert not marker.exists()


def test_a_reader_decides_from_one_read_of_metadata(tmp_path):
    """The reader's check sees msgpack; the checkpoint is then switched to pickle
    before the restore: the restore refuses instead of adopting it."""
    uri, marker = _tampered(tmp_path)
    path = tmp_path / "ck" / "op" / "_metadata"
    metadata = msgpack.unpackb(path.read_bytes())
    metadata["stores"][0]["value_serde"] = "msgpack"
    path.write_bytes(msgpack.packb(metadata))
    source = open_source(uri)
    assert source.store_records("op")["processor"]["value_serde"] == "msgpack"  # checked
    metadata["stores"][0]["value_serde"] = "pickle"
    path.write_bytes(msgpack.packb(metadata))
    with pytest.raises(PickleRefusedError, match="store 'processor' of .* is pickled"):
        list(store_rows(source, "op", "processor"))
    assert not marker.exists()


@pytest.mark.parametrize(
    "command",
    [["dump", "{uri}", "--store", "processor"],
     ["get", "{uri}", "--store", "processor", "--key", "b"]],
    ids=lambda c: c[0],
)  # fmt: skip
def test_dump_and_get_refuse_a_pickled_processor_store(tmp_path, command):
    uri, marker = _tampered(tmp_path)
    out = run(*[a.format(uri=uri) for a in command])
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.strip().splitlines() == [
        f"sessionstore: store 'processor' of {uri}/op is pickled, and unpickling runs code "
        "from the checkpoint; pass --allow-pickle only if you trust every writer of this "
        "checkpoint"
    ]
    assert not marker.exists()


def test_with_the_opt_in_get_and_dump_read_the_pickled_processor_store(tmp_path):
    uri, marker = _tampered(tmp_path)
    out = run("get", uri, "--store", "processor", "--key", "a", "--allow-pickle")
    assert out.returncode == 0, out.stderr
    assert [json.loads(line) for line in out.stdout.splitlines()] == [{
        "partition": 0, "key": "a", "state": "last",
        "value": {"value": ["2024-05-01 12:00:00.000007", "1.50"], "expires_ms": None},
    }]  # fmt: skip
    assert not marker.exists()  # get read key a only
    out = run("dump", uri, "--store", "processor", "--allow-pickle")
    assert out.returncode == 0, out.stderr
    assert marker.exists()
