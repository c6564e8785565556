"""What a task reads from its Arrow input and writes to its Arrow output (no Spark
session): keys, and values read back from a store."""

from __future__ import annotations

import pyarrow as pa

from sessionstore.encoding.serde import MsgpackSerde
from spark_integration.execution.inputs import key_values
from spark_integration.execution.output import record_batch


def test_a_composite_key_with_a_null_column_is_a_null_key():
    # operators drop (and count) null keys; a tuple with a None in it is no key
    # the store can hold (the key codec refuses it, failing the task)
    table = pa.table({"a": ["x", None, "y", None], "b": [1, 2, None, None], "v": [0, 0, 0, 0]})
    assert key_values(table, ["a", "b"]) == [("x", 1), None, None, None]
    assert key_values(table, ["a"]) == ["x", None, "y", None]


def test_maps_read_back_from_a_store_are_written_as_maps():
    # a join holds its rows in a store; msgpack gives a map's (key, item) pairs
    # back as lists, which Arrow refuses for a map column
    serde = MsgpackSerde()
    tags = pa.map_(pa.string(), pa.int32())
    schema = pa.schema([
        ("tags", tags), ("nested", pa.struct([("m", tags), ("n", pa.int64())])),
        ("many", pa.list_(tags)), ("n", pa.int64()),
    ])  # fmt: skip
    rows = pa.table(
        {"tags": [[("a", 1), ("b", None)], None, []],
         "nested": [{"m": [("z", 3)], "n": 1}, None, {"m": None, "n": 2}],
         "many": [[[("q", 4)], None], [], None], "n": [1, 2, 3]},
        schema=schema,
    ).to_pylist()  # fmt: skip
    held = [serde.loads(serde.dumps(row)) for row in rows]
    assert held[0]["tags"] == [["a", 1], ["b", None]]  # what Arrow refuses as is
    out = record_batch(schema, {f.name: [row[f.name] for row in held] for f in schema})
    assert out.to_pylist() == rows
