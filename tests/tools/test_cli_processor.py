"""The CLI dumps a StatefulProcessor's state: one row per key and variable, in
shapes JSON, CSV and Parquet take (map keys are tuples in the store)."""

from __future__ import annotations

import pyarrow.parquet as pq

from sessionstore import StateDB
from sessionstore.operators.processors import BatchTimes, ProcessorHandle, ProcessorRunner
from tests.tools.test_cli_local import rows_of, run


class _Writer:
    def init(self, handle):
        self.h = handle
        self.v = handle.getValueState("v", "n long")
        self.m = handle.getMapState("m", "k string", "x long", ttlDurationMs=50)

    def handleInputRows(self, key, rows, tv):
        for r in rows:
            self.v.update((r,))
            self.m.updateValue((str(r),), (r,))
        self.h.registerTimer(500)
        return iter([])


def test_dump_a_processor_store_as_jsonl_and_parquet(tmp_path):
    path = tmp_path / "db"
    with StateDB.open(path) as db:
        store = db.processor_store("processor")
        runner = ProcessorRunner(
            _Writer(), ProcessorHandle(store, "ProcessingTime"), "ProcessingTime"
        )
        with db.batch():
            runner.run_batch([(("a",), None, lambda: iter([1, 2]))], BatchTimes(100, -1))
    rows = rows_of(run("dump", str(path), "--store", "processor"))
    assert [(r["key"], r["state"], r["value"]) for r in rows] == [
        ("a", "m", [
            {"key": ["1"], "value": [1], "expires_ms": 150},
            {"key": ["2"], "value": [2], "expires_ms": 150},
        ]),
        ("a", "v", {"value": [2], "expires_ms": None}),
        ("a", None, [500]),  # the key's timers
    ]  # fmt: skip
    out = tmp_path / "state.parquet"
    assert run("dump", str(path), "--store", "processor", "--format", "parquet",
               "--output", str(out)).returncode == 0  # fmt: skip
    table = pq.read_table(out)
    assert table.column("state").to_pylist() == ["m", "v", None]
    assert table.column("value").to_pylist()[1] == '{"value": [2], "expires_ms": null}'


class _Lists:
    """A list without a TTL (held as bare values) and one with a TTL (pairs)."""

    def init(self, handle):
        self.plain = handle.getListState("plain", "item string")
        self.timed = handle.getListState("timed", "item string", ttlDurationMs=1_000)

    def handleInputRows(self, key, rows, tv):
        for r in rows:
            self.plain.appendValue((r,))
            self.timed.appendValue((r,))
        return iter([])


def test_dump_and_get_show_a_list_in_either_stored_form(tmp_path):
    from sessionstore import StateStoreProvider, StoreSpec

    uri = f"file://{tmp_path}/ck"
    provider = StateStoreProvider(uri, "op", 0, [StoreSpec("processor", "processor", 0)],
                                  str(tmp_path / "local"))  # fmt: skip
    for version, items in enumerate([["x"], ["y", "z"]]):
        handle = provider.get_store(version)
        runner = ProcessorRunner(
            _Lists(), ProcessorHandle(handle["processor"], "ProcessingTime"), "ProcessingTime"
        )
        runner.run_batch([(("a",), None, lambda i=items: iter(i))], BatchTimes(100, -1))
        handle.commit()
    provider.close()
    expected = [
        ("a", "plain", [{"value": [x], "expires_ms": None} for x in "xyz"]),
        ("a", "timed", [{"value": [x], "expires_ms": 1_100} for x in "xyz"]),
    ]
    for command in ("dump", "get"):
        key = ["--key", "a"] if command == "get" else []
        rows = rows_of(run(command, uri, "--operator", "op", "--store", "processor", *key))
        assert [(r["key"], r["state"], r["value"]) for r in rows] == expected
