"""The processor store's payloads and declarations (sessionstore.stores.processor):
state is msgpack shaped by each variable's declared schema, declarations are
recorded with the state, and a store an earlier release wrote with pickle still
loads, pickled, in the job that wrote it (docs/security.md)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import msgpack

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.layout import read_metadata
from sessionstore.encoding.keys import encode_key
from sessionstore.encoding.serde import PickleSerde
from sessionstore.operators.processors import BatchTimes, ProcessorHandle, ProcessorRunner

SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "ts", "type": "timestamp_ntz", "nullable": True, "metadata": {}},
        {"name": "amount", "type": "decimal(10,2)", "nullable": True, "metadata": {}},
    ],
}
ITEM = {"type": "struct", "fields": [{"name": "item", "type": "string", "nullable": True,
                                      "metadata": {}}]}  # fmt: skip


class Keeper:
    """Keeps the last (ts, amount) per key and counts items in a map."""

    def init(self, handle):
        self.last = handle.getValueState("last", SCHEMA)
        self.items = handle.getMapState("items", ITEM, SCHEMA)

    def handleInputRows(self, key, rows, timerValues):
        before = self.last.get()
        for ts, amount, item in rows:
            self.last.update((ts, amount))
            self.items.updateValue((item,), (ts, amount))
        yield key, before, sorted(self.items.keys())

    def close(self):
        pass


def _batch(provider, version, rows):
    handle = provider.get_store(version)
    store = handle["processor"]
    runner = ProcessorRunner(Keeper(), ProcessorHandle(store, "None"), "None")
    groups = [((k,), None, lambda r=r: iter(r)) for k, r in sorted(rows.items())]
    out = runner.run_batch(groups, BatchTimes(-1, -1)).outputs
    assert handle.commit() == version + 1
    return out, store, handle.db


T1, T2 = datetime(2024, 5, 1, 12, 0, 0, 7), datetime(2024, 5, 2)


def test_payloads_are_schema_msgpack_and_declarations_are_recorded(tmp_path):
    uri = f"file://{tmp_path}/ck"
    p = StateStoreProvider(uri, "op", 0, [StoreSpec("processor", "processor", 0)],
                           str(tmp_path / "local"))  # fmt: skip
    _batch(p, 0, {"a": [(T1, Decimal("1.50"), "x")]})
    out, store, db = _batch(p, 1, {"a": [(T2, Decimal("2.00"), "y")]})
    assert out == [(("a",), (T1, Decimal("1.50")), [("x",), ("y",)])]
    assert not store.pickled
    assert store.declarations["last"] == {
        "format": 1, "kind": "value", "value_schema": SCHEMA, "key_schema": None,
    }  # fmt: skip
    assert store.declarations["items"]["key_schema"] == ITEM
    raw = dict(db.scan_list(store.kv_cf))
    assert msgpack.unpackb(raw[encode_key("a") + encode_key("last")]) == [
        [1_714_608_000_000_000, "2.00"],
        None,
    ]
    assert read_metadata(p.operator_storage)["stores"][0]["value_serde"] == "msgpack"
    p.close()
    # a new process (a reader, a restarted job) decodes with the recorded declarations
    p = StateStoreProvider(uri, "op", 0, [StoreSpec("processor", "processor", 0)],
                           str(tmp_path / "other"))  # fmt: skip
    store = p.get_store(2)["processor"]
    rows = sorted(store.read_rows(), key=lambda r: r["state"] or "")
    assert [r["value"] for r in rows if r["state"] == "last"] == [
        {"value": [T2, Decimal("2.00")], "expires_ms": None}
    ]
    p.close()


def test_a_store_written_with_pickle_still_loads_pickled_in_the_job_that_wrote_it(tmp_path):
    """An earlier release recorded the processor store's serde as pickle: the job,
    restarted on this release with its default spec, adopts the recorded serde, reads
    its state and keeps writing pickle (readers refuse the checkpoint; see
    tests/tools/test_cli_pickle.py)."""
    uri = f"file://{tmp_path}/ck"
    old = [StoreSpec("processor", "processor", 0, value_serde=PickleSerde())]
    p = StateStoreProvider(uri, "op", 0, old, str(tmp_path / "local"))
    _batch(p, 0, {"a": [(T1, Decimal("1.50"), "x")]})
    p.close()
    assert read_metadata(p.operator_storage)["stores"][0]["value_serde"] == "pickle"
    new = [StoreSpec("processor", "processor", 0)]
    p = StateStoreProvider(uri, "op", 0, new, str(tmp_path / "local2"))  # a restore
    out, store, db = _batch(p, 1, {"a": [(T2, Decimal("2.00"), "y")]})
    assert out == [(("a",), (T1, Decimal("1.50")), [("x",), ("y",)])]
    assert store.pickled
    raw = dict(db.scan_list(store.kv_cf))[encode_key("a") + encode_key("last")]
    assert raw[:1] == b"\x80"  # still a pickle: the job's own checkpoint, its own format
    p.close()
