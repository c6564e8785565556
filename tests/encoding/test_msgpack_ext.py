"""The default value serde stores the values of every Spark type a row can hold."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionstore.encoding.msgpack_ext import EXT_DATETIME
from sessionstore.encoding.serde import MsgpackSerde
from sessionstore.encoding.state_values import generic_packb, generic_unpackb

SERDE = MsgpackSerde()
A_ROW = {
    "ad": "x",
    "ts": datetime(2024, 1, 1, 0, 0, 1, 250),
    "utc": datetime(2024, 1, 1, 12, tzinfo=UTC),
    "paris": datetime(2024, 6, 1, 9, 30, tzinfo=timezone(timedelta(hours=2))),
    "day": date(1969, 12, 31),
    "price": Decimal("-12.30"),
    "wait": timedelta(days=-1, microseconds=7),
    "at": time(23, 59, 58, 999_999),
    "nested": [{"when": datetime(1900, 1, 1)}, None, b"\x00"],
}


def test_a_row_of_spark_values_reads_back_as_it_was():
    back = SERDE.loads(SERDE.dumps(A_ROW))
    assert back == A_ROW
    assert back["paris"].utcoffset() == timedelta(hours=2)
    assert back["price"].as_tuple() == Decimal("-12.30").as_tuple()  # the scale kept
    assert type(back["day"]) is date


def test_both_msgpack_forms_write_the_same_extension_bytes():
    # one format for a timestamp whichever store holds it (the generic form
    # reads arrays as tuples, the serde as lists: the bytes are the same)
    assert SERDE.dumps(A_ROW) == generic_packb(A_ROW)
    assert SERDE.dumps(datetime(1970, 1, 1, 0, 0, 0, 1)) == msgpack.packb(
        msgpack.ExtType(EXT_DATETIME, (1).to_bytes(8, "big", signed=True))
    )
    assert generic_unpackb(SERDE.dumps([datetime(2000, 1, 1)])) == (datetime(2000, 1, 1),)


def test_an_unknown_extension_reads_back_as_data():
    raw = msgpack.packb(msgpack.ExtType(42, b"opaque"))
    assert SERDE.loads(raw) == msgpack.ExtType(42, b"opaque")


@pytest.mark.parametrize(
    ("code", "payload"),
    [(1, b"\x01\x02"), (2, b"abc"), (3, b"\x7f" * 8), (4, b"\xff"), (4, b"abc"),
     (5, b""), (6, b"\x7f" * 8)],
)  # fmt: skip
def test_a_malformed_extension_value_is_refused_by_code_and_payload(code, payload):
    # a value this library did not write (a corrupt file, another program's
    # ExtType) is refused, never read as another value
    raw = msgpack.packb([1, msgpack.ExtType(code, payload)])
    with pytest.raises(ValueError, match=rf"malformed msgpack extension {code} value "):
        SERDE.loads(raw)
    with pytest.raises(ValueError, match=rf"malformed msgpack extension {code} value "):
        generic_unpackb(raw)


def test_a_value_of_no_spark_type_is_refused_by_name():
    with pytest.raises(TypeError, match=r"cannot store set \{1\} in state"):
        SERDE.dumps({"x": {1}})
    with pytest.raises(TypeError, match=r"cannot store time datetime.time\(1, 0, tzinfo="):
        SERDE.dumps(time(1, tzinfo=UTC))  # Spark's time has no zone


#: Spark's day-time intervals: int64 microseconds
INTERVALS = st.timedeltas(min_value=timedelta(days=-(10**8)), max_value=timedelta(days=10**8))


@given(st.datetimes(), st.dates(), st.decimals(allow_nan=False, allow_infinity=False), INTERVALS,
       st.times())  # fmt: skip
def test_any_value_round_trips(when, day, number, delta, of_day):
    row = [when, day, number, delta, when.replace(tzinfo=UTC), of_day]
    assert SERDE.loads(SERDE.dumps(row)) == row
