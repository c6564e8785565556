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


class _Variables:
    """Value, list and map state with a TTL, and a timer, over composite values."""

    def init(self, handle):
        self.h = handle
        schema = "n long, tags array<struct<k:string,v:long>>"
        self.v = handle.getValueState("v", _Parsed(schema), ttlDurationMs=50)
        self.l = handle.getListState("l", _Parsed(schema), ttlDurationMs=50)
        self.m = handle.getMapState("m", _Parsed("k string"), _Parsed(schema), ttlDurationMs=50)

    def handleInputRows(self, key, rows, tv):
        for r in rows:
            value = (r, [{"k": "x", "v": r}, None])
            self.v.update(value)
            self.l.appendValue(value)
            self.m.updateValue((str(r),), value)
        self.h.registerTimer(500)
        self.h.registerTimer(700)
        return iter([])


class _Parsed:
    """A parsed schema in Spark's JSON form (as the engine's parse_schema gives)."""

    TYPES = {
        "long": "long", "string": "string",
        "array<struct<k:string,v:long>>": {
            "type": "array", "containsNull": True, "elementType": {"type": "struct", "fields": [
                {"name": "k", "type": "string", "nullable": True, "metadata": {}},
                {"name": "v", "type": "long", "nullable": True, "metadata": {}},
            ]},
        },
    }  # fmt: skip

    def __init__(self, text):
        self.text = text

    def jsonValue(self):  # noqa: N802 - PySpark's name
        fields = [part.split(" ", 1) for part in self.text.split(", ")]
        return {"type": "struct", "fields": [
            {"name": n, "type": self.TYPES[t], "nullable": True, "metadata": {}} for n, t in fields
        ]}  # fmt: skip


def test_dump_a_state_variable_and_the_timers_as_sparks_statestore_reader(tmp_path):
    """``--state-var``: one row per value, list element or map entry (``--no-flatten``:
    a list or map per row); ``--timers``: one row per timer (issue 43)."""
    path = tmp_path / "db"
    with StateDB.open(path) as db:
        handle = ProcessorHandle(db.processor_store("processor"), "ProcessingTime")
        runner = ProcessorRunner(_Variables(), handle, "ProcessingTime")
        with db.batch():
            runner.run_batch([(("a",), None, lambda: iter([1, 2]))], BatchTimes(100, -1))

    def dump(*args):
        rows = rows_of(run("dump", str(path), "--store", "processor", *args))
        return [{k: v for k, v in r.items() if k != "partition"} for r in rows]

    one = {"value": [1, [["x", 1], None]], "ttlExpirationMs": 150}
    two = {"value": [2, [["x", 2], None]], "ttlExpirationMs": 150}
    assert dump("--state-var", "v") == [{"key": "a", "value": two}]
    assert dump("--state-var", "l") == [
        {"key": "a", "list_element": one},
        {"key": "a", "list_element": two},
    ]
    assert dump("--state-var", "l", "--no-flatten") == [{"key": "a", "list_value": [one, two]}]
    assert dump("--state-var", "m") == [
        {"key": "a", "user_map_key": ["1"], "user_map_value": one},
        {"key": "a", "user_map_key": ["2"], "user_map_value": two},
    ]
    assert dump("--state-var", "m", "--no-flatten") == [
        {"key": "a", "map_value": [[["1"], one], [["2"], two]]}
    ]
    assert dump("--timers") == [
        {"key": "a", "expiration_timestamp_ms": 500},
        {"key": "a", "expiration_timestamp_ms": 700},
    ]
    out = run("dump", str(path), "--store", "processor", "--state-var", "nope")
    assert out.returncode == 2
    assert "has no state variable 'nope' (variables: ['l', 'm', 'v'])" in out.stderr
