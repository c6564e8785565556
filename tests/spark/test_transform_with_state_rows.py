"""The row API's input rows and key runs (transform_with_state), without a Spark
session: rows made by the per-schema class behave as PySpark's ``Row``, and the
runs of equal keys found by Arrow are those of a plain Python scan."""

from __future__ import annotations

import math
import pickle

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle
from pyspark.sql import Row

from spark_integration.execution.inputs import deterministic_order
from spark_integration.operators.transform_with_state.grouping import (
    group_bounds,
    grouped_rows,
    key_runs,
)
from spark_integration.operators.transform_with_state.rows import row_maker

NAMES = st.lists(
    st.sampled_from(["user", "item", "count", "index", "n", "x_1", "asDict", "a b", "_p"]),
    min_size=1,
    max_size=5,
)
VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=4), st.floats(allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(names=NAMES, data=st.data())
def test_a_row_behaves_as_pysparks_row(names, data):
    values = tuple(data.draw(st.lists(VALUES, min_size=len(names), max_size=len(names))))
    ours = row_maker(names)(values)
    theirs = Row(*names)(*values)
    assert isinstance(ours, Row)
    assert ours == theirs and tuple(ours) == values and hash(ours) == hash(theirs)
    assert repr(ours) == repr(theirs)
    assert ours.asDict() == theirs.asDict() and list(ours.__fields__) == list(theirs.__fields__)
    for name in names:
        assert ours[name] == theirs[name]
        if name.isidentifier():
            attr = getattr(ours, name)
            expected = getattr(theirs, name)
            # a name that is an attribute of Row (count, index, asDict) stays it
            assert attr == expected if not callable(expected) else attr.__name__ == name
    for copy in (pickle.loads(pickle.dumps(ours)), cloudpickle.loads(cloudpickle.dumps(ours))):
        assert copy == theirs and copy.asDict() == theirs.asDict()


def test_a_row_is_read_only_and_names_a_missing_attribute():
    row = row_maker(["user"])(("u",))
    with pytest.raises(Exception, match="READ_ONLY"):
        row.user = "v"
    with pytest.raises(AttributeError, match="nope"):
        row.nope  # noqa: B018


def _python_runs(table, keys):
    cols = [table.column(k).to_pylist() for k in keys]
    return group_bounds(cols[0] if len(keys) == 1 else list(zip(*cols, strict=True)))


KEY_VALUES = {
    "s": (pa.string(), st.text(alphabet="ab", max_size=2)),
    "i": (pa.int64(), st.integers(-2, 2)),
    "f": (pa.float64(), st.sampled_from([0.0, -0.0, 1.5, math.nan, math.inf])),
    "b": (pa.binary(), st.binary(max_size=1)),
}


@settings(max_examples=200, deadline=None)
@given(
    columns=st.lists(st.sampled_from(sorted(KEY_VALUES)), min_size=1, max_size=3, unique=True),
    n=st.integers(0, 30),
    data=st.data(),
)
def test_key_runs_are_those_of_a_python_scan(columns, n, data):
    arrays = {
        c: pa.array(
            data.draw(st.lists(KEY_VALUES[c][1], min_size=n, max_size=n)), type=KEY_VALUES[c][0]
        )
        for c in columns
    }
    table = deterministic_order(pa.table(arrays), columns)
    assert key_runs(table, columns) == _python_runs(table, columns)


#: column types of a batch and their values other than null: those ranked through
#: their distinct values, and a float and a list (Arrow's sort; a list is not
#: sorted by)
BATCH_COLUMNS = {
    "s": (pa.string(), st.text(alphabet="ab\x00é", max_size=3)),
    "ls": (pa.large_string(), st.text(alphabet="xy", max_size=2)),
    "i": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "u8": (pa.uint8(), st.integers(0, 255)),
    "b": (pa.binary(), st.binary(max_size=2)),
    "t": (pa.bool_(), st.booleans()),
    "ts": (pa.timestamp("us", "UTC"), st.integers(-(10**15), 10**15)),
    "f": (pa.float64(), st.sampled_from([0.0, -0.0, 1.5, math.inf])),
    "l": (pa.list_(pa.int64()), st.lists(st.integers(0, 2), max_size=2)),
}
KEY_COLUMNS = ["s", "ls", "i", "u8", "b", "t", "ts"]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.sampled_from(KEY_COLUMNS), min_size=1, max_size=2, unique=True),
    others=st.lists(st.sampled_from(sorted(BATCH_COLUMNS)), max_size=3, unique=True),
    n=st.integers(0, 40),
    data=st.data(),
)
def test_grouped_rows_are_arrow_sorted_rows(keys, others, n, data):
    """The ranked order is the one Arrow's multi-column sort gives (rows equal in
    every sortable column are interchangeable), with the same key runs, and the
    Python values it converts are the columns' own."""
    columns = keys + [c for c in others if c not in keys]
    arrays = {}
    for c in columns:
        kind, values = BATCH_COLUMNS[c]
        if c not in keys:  # keys hold no nulls
            values = st.one_of(st.none(), values)
        arrays[c] = pa.array(data.draw(st.lists(values, min_size=n, max_size=n)), type=kind)
    table = pa.table(arrays)
    # two chunks, as a batch of several record batches
    table = pa.concat_tables([table.slice(0, n // 2), table.slice(n // 2)])
    batch = grouped_rows(table, keys, python_values=True)
    expected = deterministic_order(table, keys)
    sortable = [c for c in columns if c != "l"]
    assert batch.table.select(sortable).equals(expected.select(sortable).combine_chunks())
    assert batch.bounds == key_runs(expected, keys)
    for name, values in batch.values.items():
        assert values == batch.table.column(name).to_pylist()
    assert batch.table.num_rows == n


def test_grouped_rows_do_not_depend_on_arrival_order():
    """The replay-safe promise: any permutation of a batch's rows gives the same
    sorted rows and key runs (a retried task's shuffle may deliver them in
    another order)."""
    import random

    rng = random.Random(5)
    rows = [
        (f"u{rng.randrange(20)}", f"item-{rng.randrange(7)}", rng.randrange(3)) for _ in range(500)
    ]
    first = None
    for _ in range(5):
        rng.shuffle(rows)
        users, items, ns = zip(*rows, strict=True)
        batch = grouped_rows(pa.table({"user": users, "item": items, "n": ns}), ["user"], True)
        got = (batch.table.to_pylist(), batch.bounds, batch.values)
        assert first is None or got == first
        first = got
    assert len(first[1]) == 20


def test_a_batch_in_any_arrival_order_gives_the_same_output_and_state():
    """Through the operator's own task code (ProcessorTester): a processor whose
    list state and output depend on the order it sees rows in gets the same
    output and state from every permutation of each batch, batch after batch."""
    import random

    from spark_integration.testing import ProcessorTester
    from tests.spark.processors import OUT_SCHEMA, RowTracker

    rng = random.Random(11)
    batches = [
        [{"id": f"k{rng.randrange(6)}", "item": f"i{rng.randrange(9)}"} for _ in range(60)]
        for _ in range(3)
    ]
    results = []
    for seed in range(4):
        shuffle = random.Random(seed).shuffle
        with ProcessorTester(RowTracker(), OUT_SCHEMA, key="id") as tester:
            outputs = []
            for rows in batches:
                rows = list(rows)
                shuffle(rows)
                outputs.append(tester.run(pa.Table.from_pylist(rows)))
            results.append((outputs, [tester.state(f"k{i}") for i in range(6)]))
    assert all(r == results[0] for r in results[1:])
    # the list state kept the sorted order's last three items
    assert results[0][1][0]["recent"] and len(results[0][0][0]) == 6


def test_output_rows_read_nested_rows_by_field_name_as_sparks_worker():
    """Spark's worker turns each output row into ``row.asDict(recursive=True)``:
    a ``Row`` nested in a list or map value is read by field name (issue 43), a
    plain tuple by position, a dict by key."""
    from spark_integration.operators.transform_with_state.rows import rows_output

    kv = pa.struct([("key", pa.string()), ("value", pa.string())])
    schema = pa.schema([
        ("id", pa.string()), ("xs", pa.list_(kv)), ("m", pa.map_(pa.string(), kv)), ("s", kv),
    ])  # fmt: skip
    out = rows_output(
        [
            ("a", [Row(value="v", key="k"), None], {"x": Row(value="1", key="2")}, {"value": "w"}),
            Row(s=Row(value="v", key="k"), id="b", xs=[Row(value=None, key="z")], m=None),
        ],
        schema,
    )
    assert out.to_pylist() == [
        {"id": "a", "xs": [{"key": "k", "value": "v"}, None], "m": [("x", {"key": "2", "value": "1"})],
         "s": {"key": None, "value": "w"}},
        {"id": "b", "xs": [{"key": "z", "value": None}], "m": None, "s": {"key": "k", "value": "v"}},
    ]  # fmt: skip
