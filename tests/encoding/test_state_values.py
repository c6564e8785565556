"""Processor state values as data (sessionstore.encoding.state_values): encoded from
the declared Spark schema as msgpack, read back as the processor wrote them, and
readable with plain msgpack (no pickle anywhere)."""

from __future__ import annotations

import os
import time
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.encoding.state_values import (
    check_evolution,
    evolver,
    generic_packb,
    generic_unpackb,
    payload_codec,
    value_codec,
)
from sessionstore.errors import StatefulProcessorError


def _field(name, dtype, nullable=True):
    return {"name": name, "type": dtype, "nullable": nullable, "metadata": {}}


def struct(*fields):
    return {"type": "struct", "fields": list(fields)}


INFO = struct(_field("city", "string"), _field("zip", "integer"))
TYPED = struct(
    _field("ts", "timestamp"),
    _field("local", "timestamp_ntz"),
    _field("day", "date"),
    _field("amount", "decimal(10,2)"),
    _field("info", INFO),
    _field("tags", {"type": "array", "elementType": "string", "containsNull": True}),
    _field("scores", {"type": "map", "keyType": "string", "valueType": "double",
                      "valueContainsNull": True}),
    _field("wait", "interval day to second"),
    _field("note", "string"),
)  # fmt: skip
KEY = struct(_field("day", "date"), _field("city", "string"))


@pytest.fixture(autouse=True)
def utc():
    """Timestamps are local time in PySpark; pin the zone for exact bytes."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


VALUE = (
    datetime(2024, 1, 1, 0, 0, 0, 5),
    datetime(2024, 1, 1, 12, 30),
    date(2024, 1, 2),
    Decimal("12.30"),
    ("Paris", 75001),
    ["a", None],
    {"x": 1.5},
    timedelta(seconds=90),
    None,
)
STORED = (
    1_704_067_200_000_005,
    1_704_112_200_000_000,
    19_724,
    "12.30",
    ("Paris", 75001),
    ("a", None),
    {"x": 1.5},
    90_000_000,
    None,
)


def _plain(raw):
    return msgpack.unpackb(raw, use_list=False, strict_map_key=False)


def test_value_list_and_map_payloads_are_plain_msgpack_of_the_schemas_types():
    value = value_codec(TYPED)
    key = value_codec(KEY)
    dumps, loads = payload_codec("value", value)
    raw = dumps((VALUE, None))
    assert _plain(raw) == (STORED, None)
    assert loads(raw) == (VALUE, None)
    dumps, loads = payload_codec("list", value)
    raw = dumps([(VALUE, 7), (VALUE, None)])
    assert _plain(raw) == ((STORED, 7), (STORED, None))
    assert loads(raw) == [(VALUE, 7), (VALUE, None)]
    dumps, loads = payload_codec("map", value, key)
    user_key = (date(1970, 1, 2), "Paris")
    raw = dumps({user_key: (VALUE, 9)})
    assert _plain(raw) == {(1, "Paris"): (STORED, 9)}
    assert loads(raw) == {user_key: (VALUE, 9)}


def test_the_worked_example_of_the_module_doc():
    schema = struct(_field("ts", "timestamp"), _field("amount", "decimal(10,2)"))
    dumps, _ = payload_codec("value", value_codec(schema))
    raw = dumps(((datetime(2024, 1, 1), Decimal("12.30")), None))
    assert raw.hex(" ") == "92 92 cf 00 06 0d d7 10 21 20 00 a5 31 32 2e 33 30 c0"


def test_a_schema_of_native_types_is_packed_as_it_is():
    schema = struct(_field("n", "long"), _field("s", "string"), _field("b", "binary"))
    codec = value_codec(schema)
    assert codec.native
    dumps, loads = payload_codec("list", codec)
    raw = dumps([((1, "x", b"\x00"), None)])
    assert raw == msgpack.packb([[[1, "x", b"\x00"], None]])
    assert loads(raw) == [((1, "x", b"\x00"), None)]


def test_nested_structs_are_built_by_the_engines_maker():
    made = []

    def maker(names):
        return lambda values: made.append(names) or dict(zip(names, values, strict=True))

    codec = value_codec(struct(_field("info", INFO)), maker)
    _, loads = payload_codec("value", codec)
    dumps, _ = payload_codec("value", value_codec(struct(_field("info", INFO))))
    assert loads(dumps(((("Paris", 1),), None))) == (({"city": "Paris", "zip": 1},), None)
    assert made == [["city", "zip"]]


def test_values_without_a_schema_use_the_generic_form():
    aware = datetime(2024, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    value = (datetime(2024, 1, 1), aware, date(2024, 1, 2), Decimal("-0.5"), timedelta(1), None)
    assert value_codec(None) is None
    dumps, loads = payload_codec("value", None)
    raw = dumps((value, 3))
    assert loads(raw) == (value, 3)
    assert loads(raw)[0][1].utcoffset() == timedelta(hours=1)
    assert generic_unpackb(generic_packb((1, "x"))) == (1, "x")
    with pytest.raises(TypeError, match="cannot store object"):
        dumps(((object(),), None))


def test_an_unknown_type_falls_back_to_the_generic_form():
    schema = struct(_field("u", {"type": "udt", "class": "x.Y", "sqlType": "string"}))
    assert value_codec(schema) is None


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(
        st.none() | st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1)),
        st.none() | st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
        st.none() | st.dates(),
        st.none() | st.decimals(allow_nan=False, allow_infinity=False, places=2,
                                min_value=-(10**8), max_value=10**8),
        st.none() | st.tuples(st.none() | st.text(max_size=3), st.none() | st.integers(-5, 5)),
        st.none() | st.lists(st.none() | st.text(max_size=2), max_size=3),
        st.none() | st.dictionaries(st.text(max_size=2), st.none() | st.floats(allow_nan=False)),
        st.none() | st.timedeltas(min_value=timedelta(days=-9999), max_value=timedelta(days=9999)),
        st.none() | st.text(max_size=3),
    ),
    st.none() | st.integers(0, 2**62),
)  # fmt: skip
def test_every_value_reads_back_as_written(value, expiry):
    for kind, payload in (
        ("value", (value, expiry)),
        ("list", [(value, expiry), (value, None)]),
    ):
        dumps, loads = payload_codec(kind, value_codec(TYPED))
        raw = dumps(payload)
        assert loads(raw) == payload
        _plain(raw)  # plain msgpack reads every payload


def test_a_value_its_schema_cannot_hold_is_refused_naming_the_field():
    dumps, _ = payload_codec("value", value_codec(TYPED))
    bad = ("2024-01-01", *VALUE[1:])
    with pytest.raises(TypeError, match=r"state field 'ts' of type 'timestamp' cannot hold str"):
        dumps((bad, None))
    with pytest.raises(TypeError, match=r"a state value of 2 fields for the schema's 9"):
        dumps((VALUE[:2], None))


# ------------------------------------------------------------ schema evolution
OLD = struct(_field("a", "integer"), _field("b", "string"))


def _versions(kind, old, new):
    """(dumps of ``old`` rows, the codec of ``new`` with ``old`` as version 0)."""
    dumps = payload_codec(kind, value_codec(old))[0]
    history = [(value_codec(old), evolver(old, new))]
    return dumps, payload_codec(kind, value_codec(new), None, history)


def test_an_old_row_is_read_by_field_name_into_the_new_schema():
    new = struct(_field("c", "long"), _field("b", "string"), _field("a", "long"))
    old_dumps, (dumps, loads) = _versions("value", OLD, new)
    assert loads(old_dumps(((1, "x"), 5))) == ((None, "x", 1), 5)
    # a row written in the new schema carries its version and reads as written
    raw = dumps(((7, "y", 2), None))
    assert raw[:1] == b"\x01" and loads(raw) == ((7, "y", 2), None)
    old_list, (_, list_loads) = _versions("list", OLD, new)
    assert list_loads(old_list([((1, "x"), None), ((2, None), 9)])) == [
        ((None, "x", 1), None), ((None, None, 2), 9),
    ]  # fmt: skip


def test_widening_converts_and_nested_structs_and_arrays_follow():
    inner_old = struct(_field("n", "integer"), _field("gone", "string"))
    inner_new = struct(_field("extra", "string"), _field("n", "double"))
    old = struct(
        _field("f", "float"),
        _field("s", inner_old),
        _field("xs", {"type": "array", "elementType": inner_old, "containsNull": True}),
    )
    new = struct(
        _field("f", "double"),
        _field("s", inner_new),
        _field("xs", {"type": "array", "elementType": inner_new, "containsNull": True}),
    )
    check_evolution("v", old, new)
    old_dumps, (_, loads) = _versions("value", old, new)
    value, _ = loads(old_dumps(((1.5, (3, "g"), [(4, "h"), None]), None)))
    assert value == (1.5, (None, 3.0), [(None, 4.0), None])
    assert type(value[1][1]) is float
    # nested structs are built by the engine's maker (PySpark's Row), the value a tuple
    from collections import namedtuple

    def make(names):
        return namedtuple("R", names)._make

    history = [(value_codec(old, make), evolver(old, new, make))]
    loads = payload_codec("value", value_codec(new, make), None, history)[1]
    value, _ = loads(old_dumps(((1.5, (3, "g"), [(4, "h"), None]), None)))
    assert type(value) is tuple and value[1]._fields == ("extra", "n")
    assert value[1] == (None, 3.0) and value[2][0]._fields == ("extra", "n")


@pytest.mark.parametrize(
    "old, new, field",
    [
        ("long", "integer", "a"),
        ("double", "float", "a"),
        ("integer", "short", "a"),
        ("integer", "string", "a"),
        ("binary", "string", "a"),
        ("decimal(10,2)", "decimal(12,2)", "a"),
        ("timestamp", "long", "a"),
    ],
)
def test_a_narrowing_or_changed_type_is_refused_naming_variable_field_and_types(old, new, field):
    with pytest.raises(StatefulProcessorError) as e:
        check_evolution("profile", struct(_field("a", old)), struct(_field("a", new)))
    assert e.value.error_class == "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION"
    message = str(e.value)
    assert "'profile'" in message and f"field {field!r} was {old}" in message
    assert f"cannot be read as {new}" in message


def test_a_changed_schema_must_be_nullable():
    new = struct(_field("a", "integer", nullable=False), _field("b", "string"))
    with pytest.raises(StatefulProcessorError) as e:
        check_evolution("profile", OLD, new)
    assert e.value.error_class == "TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE"
    assert "column family profile" in str(e.value) and "field 'a'" in str(e.value)
    check_evolution("profile", new, new)  # unchanged: no evolution, nothing to refuse


_NUMERIC = ["byte", "short", "integer", "long", "float", "double"]
_NAMES = ["a", "b", "c", "d", "e"]


@st.composite
def _evolution(draw):
    """An old schema of numeric and string fields, a new one that keeps some of
    them (some widened), adds others and reorders, and old values."""
    names = draw(st.lists(st.sampled_from(_NAMES), unique=True, min_size=1))
    old_types = {n: draw(st.sampled_from([*_NUMERIC, "string"])) for n in names}
    kept = draw(st.lists(st.sampled_from(names), unique=True))
    new_types = {}
    for n in kept:
        t = old_types[n]
        wider = _NUMERIC[_NUMERIC.index(t) :] if t in _NUMERIC else ["string", "binary"]
        new_types[n] = draw(st.sampled_from(wider))
    added = [n for n in _NAMES if n not in names]
    for n in draw(st.lists(st.sampled_from(added), unique=True)) if added else ():
        new_types[n] = draw(st.sampled_from(_NUMERIC))
    order = draw(st.permutations(list(new_types)))
    value = tuple(
        draw(st.none() | (st.text(max_size=3) if old_types[n] == "string" else
                          st.integers(-100, 100).map(float if old_types[n] in ("float", "double")
                                                     else int)))
        for n in names
    )  # fmt: skip
    old = struct(*(_field(n, old_types[n]) for n in names))
    new = struct(*(_field(n, new_types[n]) for n in order))
    return old, new, value


@settings(max_examples=200, deadline=None)
@given(_evolution())
def test_evolution_matches_a_model_of_avro_resolution_by_name(case):
    old, new, value = case
    check_evolution("v", old, new)
    old_dumps, (_, loads) = _versions("value", old, new)
    by_name = dict(zip([f["name"] for f in old["fields"]], value, strict=True))
    expected = []
    for f in new["fields"]:
        v = by_name.get(f["name"])
        if v is not None and f["type"] in ("float", "double"):
            v = float(v)
        if v is not None and f["type"] == "binary" and isinstance(v, str):
            v = v.encode()
        expected.append(v)
    got, expiry = loads(old_dumps((value, 3)))
    assert got == tuple(expected) and expiry == 3
    assert [type(x) for x in got] == [type(x) for x in expected]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(_NUMERIC), st.sampled_from(_NUMERIC))
def test_numeric_changes_are_accepted_exactly_when_they_widen(old, new):
    widens = _NUMERIC.index(new) >= _NUMERIC.index(old)
    try:
        check_evolution("v", struct(_field("a", old)), struct(_field("a", new)))
    except StatefulProcessorError:
        assert not widens
    else:
        assert widens
