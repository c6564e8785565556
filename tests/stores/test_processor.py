"""The processor store's payloads and declarations (sessionstore.stores.processor):
state is msgpack shaped by each variable's declared schema, declarations are
recorded with the state (a pickle recorded in a checkpoint is refused without an
opt-in: tests/checkpoint/test_processor_pickle.py)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import msgpack

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.records.layout import read_metadata
from sessionstore.encoding.keys import encode_key
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


# ------------------------------------------------------------ schema evolution
def _struct(*fields):
    return {"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields
    ]}  # fmt: skip


V0 = _struct(("a", "integer"), ("b", "string"))
V1 = _struct(("c", "long"), ("b", "string"), ("a", "long"))
V2 = _struct(("b", "string"), ("a", "double"))


class Profile:
    """A value state of ``schema``: emits what each key held; a row ``(value,)``
    stores ``value`` (None: only reads)."""

    def __init__(self, schema):
        self.schema = schema

    def init(self, handle):
        self.state = handle.getValueState("profile", self.schema)

    def handleInputRows(self, key, rows, timerValues):
        held = self.state.get()
        for (value,) in rows:
            if value is not None:
                self.state.update(value)
        yield key[0], held

    def close(self):
        pass


def _run(tmp_path, version, schema, rows, local):
    """One batch on a restarted job (its own local dir) with ``schema``."""
    p = StateStoreProvider(f"file://{tmp_path}/ck", "op", 0,
                           [StoreSpec("processor", "processor", 0)], str(tmp_path / local))  # fmt: skip
    try:
        handle = p.get_store(version)
        store = handle["processor"]
        runner = ProcessorRunner(Profile(schema), ProcessorHandle(store, "None"), "None")
        groups = [((k,), None, lambda r=r: iter(r)) for k, r in sorted(rows.items())]
        out = runner.run_batch(groups, BatchTimes(-1, -1)).outputs
        assert handle.commit() == version + 1
        raw = {k[: -len(encode_key("profile"))]: v for k, v in handle.db.scan_list(store.kv_cf)}
        return out, raw, store.declarations["profile"]
    finally:
        p.close()


def test_rows_of_three_schema_versions_coexist_across_restarts_and_read_as_the_newest(tmp_path):
    """Rows are rewritten lazily: a restart with a new schema rewrites only the keys
    it writes; the others keep their old bytes and read through their recorded
    schema, whichever version wrote them."""
    _run(tmp_path, 0, V0, {k: [((1, k),)] for k in "abc"}, "l0")
    out, raw, record = _run(tmp_path, 1, V1, {"a": [(None,)], "b": [((9, "B", 2),)]}, "l1")
    assert out == [("a", (None, "a", 1)), ("b", (None, "b", 1))]
    assert record["value_schema"] == V1 and record["history"] == [V0]
    assert raw[encode_key("a")][:1] == b"\x92" and raw[encode_key("b")][:1] == b"\x01"
    out, raw, record = _run(tmp_path, 2, V2, {k: [(None,)] for k in "abc"} | {"c": [(("C", 3.5),)]},
                            "l2")  # fmt: skip
    assert out == [("a", ("a", 1.0)), ("b", ("B", 2.0)), ("c", ("c", 1.0))]
    assert record["history"] == [V0, V1]
    assert [raw[encode_key(k)][:1] for k in "abc"] == [b"\x92", b"\x01", b"\x02"]
    # a reader in another process decodes every version by the recorded schemas
    p = StateStoreProvider(f"file://{tmp_path}/ck", "op", 0,
                           [StoreSpec("processor", "processor", 0)], str(tmp_path / "r"))  # fmt: skip
    rows = {r["key"]: r["value"]["value"] for r in p.get_store(3)["processor"].read_rows()}
    assert rows == {"a": ["a", 1.0], "b": ["B", 2.0], "c": ["C", 3.5]}
    p.close()


def test_a_refused_schema_change_fails_before_any_state_changes_and_loses_nothing(tmp_path):
    import pytest

    from sessionstore.errors import StatefulProcessorError

    _run(tmp_path, 0, V1, {"a": [((1, "x", 5),)]}, "l0")
    narrowed = _struct(("c", "integer"), ("b", "string"))
    with pytest.raises(StatefulProcessorError, match="STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION"
                       ) as e:  # fmt: skip
        _run(tmp_path, 1, narrowed, {"a": [(None,)]}, "l1")
    assert "'profile', field 'c' was long and cannot be read as integer" in str(e.value)
    out, _, record = _run(tmp_path, 1, V1, {"a": [(None,)]}, "l2")
    assert out == [("a", (1, "x", 5))] and "history" not in record


def test_kind_and_map_key_schema_changes_are_refused_and_a_deleted_variable_starts_afresh(
    tmp_path,
):
    import pytest

    from sessionstore.errors import StatefulProcessorError

    p = StateStoreProvider(f"file://{tmp_path}/ck", "op", 0,
                           [StoreSpec("processor", "processor", 0)], str(tmp_path / "l"))  # fmt: skip
    handle = p.get_store(0)
    store = handle["processor"]
    store.declare("v", "value", V0)
    store.declare("m", "map", V0, V0)
    with pytest.raises(StatefulProcessorError, match="STATE_STORE_INVALID_VARIABLE_TYPE_CHANGE"):
        store.declare("v", "list", V0)
    with pytest.raises(StatefulProcessorError, match="STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"):
        store.declare("m", "map", V0, V1)
    store.delete_variable(encode_key("v"))
    store.declare("v", "list", V2)  # deleteIfExists, then a new variable of the name
    assert store.declarations["v"]["kind"] == "list" and "history" not in store.declarations["v"]
    # Spark's default threshold: 16 schemas of one variable
    schemas = [_struct(*((f"f{j}", "long") for j in range(i + 1))) for i in range(17)]
    store.declare("w", "value", schemas[0])
    for s in schemas[1:16]:
        store.declare("w", "value", s)
    assert len(store.declarations["w"]["history"]) == 15
    with pytest.raises(StatefulProcessorError,
                       match="STATE_STORE_VALUE_SCHEMA_EVOLUTION_THRESHOLD_EXCEEDED"):  # fmt: skip
        store.declare("w", "value", schemas[16])
    handle.abort()
    p.close()
