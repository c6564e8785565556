"""The pandas API's input and output conversions (transform_with_state_in_pandas),
without a Spark session: a key's DataFrames are the chunks Spark's worker makes,
timestamps are Spark's naive nanoseconds of the session time zone and back, and
integer columns for decimal fields are coerced only when asked."""

from __future__ import annotations

from decimal import Decimal

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_integration.operators.transform_with_state import frames


def _sparks_chunks(n: int, max_records: int, max_bytes: int, average: float) -> list[int]:
    """The chunk sizes of a key's ``n`` rows by Spark 4.3's worker loop."""
    sizes, rows = [], 0
    for _ in range(n):
        rows += 1
        if rows >= max_records or rows * average >= max_bytes:
            sizes.append(rows)
            rows = 0
    return sizes + ([rows] if rows else [])


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 40),
    max_records=st.integers(1, 50),
    max_bytes=st.one_of(st.just(2**31 - 1), st.integers(1, 400)),
    width=st.integers(1, 5),
)
def test_a_keys_chunks_are_those_of_sparks_worker(n, max_records, max_bytes, width):
    table = pa.table({"id": ["k"] * n, "s": ["x" * width] * n})
    conf = frames.PandasConf(max_records=max_records, max_bytes=max_bytes)
    frame = frames.spark_pandas(table, None)
    chunks = list(frames.pandas_slices(frame, conf.chunk_rows(table))(0, n)())
    average = table.nbytes / n
    assert [len(c) for c in chunks] == _sparks_chunks(n, max_records, max_bytes, average)
    assert pd.concat(chunks)["s"].tolist() == frame["s"].tolist()


@pytest.mark.parametrize(
    "value, expected",
    [
        ("67108864b", 67108864),
        ("64m", 64 * 2**20),
        ("1024", 1024),
        ("1g", 2**30),
        ("8g", 2**31 - 1),
    ],
)
def test_byte_sizes_read_as_spark_writes_them(value, expected):
    assert frames.byte_size(value) == expected


def test_a_bad_byte_size_is_named():
    with pytest.raises(ValueError, match="'64 parsecs'"):
        frames.byte_size("64 parsecs")


def test_timestamps_are_naive_nanoseconds_of_the_session_zone_and_back():
    utc = pa.timestamp("us", tz="UTC")
    table = pa.table({"t": pa.array([20_000_000, None], utc), "n": [1, 2]})
    frame = frames.spark_pandas(table, "America/New_York")
    assert str(frame["t"].dtype) == "datetime64[ns]"
    assert (frame["t"].astype("int64") // 10**9).tolist()[0] == 20 - 5 * 3600
    # what a handler returns naive is read in the session zone
    schema = pa.schema([("t", utc)])
    assert frames.concat_columns([frame[["t"]]], schema) is None  # datetimes: the pandas path
    localized = frames.localized(frame[["t"]], schema, "America/New_York")
    assert pa.Table.from_pandas(localized, schema=schema).column("t").equals(table.column("t"))


def test_int_columns_for_decimal_fields_are_coerced_only_when_asked():
    schema = pa.schema([("id", pa.string()), ("amount", pa.decimal128(10, 2))])
    frame = pd.DataFrame({"id": ["a"], "amount": [200]})
    coerced = frames.ints_as_decimals(frame, schema)
    assert coerced["amount"].tolist() == [Decimal(200)]
    assert frame["amount"].tolist() == [200]  # the handler's frame is not changed
    table = frames.concat_columns([coerced], schema)
    assert table.column("amount").to_pylist() == [Decimal("200.00")]
    floats = pd.DataFrame({"id": ["a"], "amount": [2.5]})
    assert frames.ints_as_decimals(floats, schema) is floats
