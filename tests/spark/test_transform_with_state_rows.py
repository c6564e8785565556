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

from spark_integration.execution.runtime import deterministic_order
from spark_integration.operators.transform_with_state.grouping import group_bounds, key_runs
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
