"""Key codec: worked byte examples, order, prefix-freedom, round trips and errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionstore.encoding.keys import (
    check_timestamp,
    decode_key,
    decode_keys,
    encode_key,
    encode_str_keys,
    prefix_upper_bound,
)
from sessionstore.encoding.session_key import decode_times, encode_times, session_key, times_of

WORKED = [
    ("a", "02 61 00 01"),
    ("aa", "02 61 61 00 01"),
    ("a\x00", "02 61 00 ff 00 01"),
    (b"\x00", "01 00 ff 00 01"),
    (b"\x00\x00", "01 00 ff 00 ff 00 01"),
    (1, "15 01"),
    (-1, "13 fe"),
    (0, "14"),
    (256, "16 01 00"),
    (("u", 7), "05 02 75 00 01 15 07 00"),
    (True, "27"),
]


@pytest.mark.parametrize("key,hexbytes", WORKED)
def test_worked_examples(key, hexbytes):
    assert encode_key(key).hex(" ") == hexbytes
    assert decode_key(encode_key(key)) == key


def test_timestamps_worked_examples():
    # end first, then start, each sign-flipped
    assert encode_times(0, -1).hex(" ") == "7f ff ff ff ff ff ff ff 80 00 00 00 00 00 00 00"
    assert encode_times(2**63 - 1, -(2**63)) == b"\x00" * 8 + b"\xff" * 8
    assert decode_times(encode_times(-12345, 7)) == (-12345, 7)
    row = session_key(encode_key("u1"), 100, 250)
    assert row.hex(" ") == (
        "02 75 31 00 01 80 00 00 00 00 00 00 fa 80 00 00 00 00 00 00 64"
    )  # the worked example of sessionstore.encoding.session_key
    assert times_of(row) == (100, 250)


@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
def test_time_bytes_sort_by_end_then_start(a, b):
    assert (encode_times(a, b) < encode_times(b, a)) == ((b, a) < (a, b))
    assert decode_times(encode_times(a, b)) == (a, b)


scalar = st.one_of(st.text(), st.binary(), st.integers(min_value=-(2**80), max_value=2**80))
keys = st.one_of(scalar, st.tuples(st.text(max_size=3), st.integers()), st.tuples(scalar, scalar))


@given(st.lists(st.text(), min_size=2, max_size=20))
def test_str_order_is_byte_order(values):
    assert sorted(values) == sorted(values, key=encode_key)


@given(st.lists(st.integers(min_value=-(2**80), max_value=2**80), min_size=2, max_size=20))
def test_int_order_is_byte_order(values):
    assert sorted(values) == sorted(values, key=encode_key)


@given(st.lists(st.binary(), min_size=2, max_size=20))
def test_bytes_order_is_byte_order(values):
    assert sorted(values) == sorted(values, key=encode_key)


@given(st.lists(st.tuples(st.text(max_size=3), st.integers(-300, 300)), min_size=2, max_size=20))
def test_tuple_order_is_byte_order(values):
    assert sorted(values) == sorted(values, key=encode_key)


@given(keys, keys)
def test_prefix_free(a, b):
    ea, eb = encode_key(a), encode_key(b)
    if a != b:
        assert not eb.startswith(ea)
        assert not ea.startswith(eb)


@given(keys)
def test_round_trip(key):
    assert decode_key(encode_key(key)) == key


def test_prefix_collisions_named_in_the_issue():
    assert not encode_key("aa").startswith(encode_key("a"))
    assert not encode_key(b"\x00\x00").startswith(encode_key(b"\x00"))
    assert not encode_key("a\x00").startswith(encode_key("a"))


@pytest.mark.parametrize(
    "key,exc,words",
    [
        (None, TypeError, "None"),
        (1.5, TypeError, "float"),
        ([1, 2], TypeError, "list"),
        ({"a": 1}, TypeError, "dict"),
        (("a", 1.0), TypeError, "float"),
        (("a", None), TypeError, "None"),
    ],
)
def test_bad_keys_name_the_type(key, exc, words):
    with pytest.raises(exc, match=words):
        encode_key(key)


def test_numpy_ints_encode_like_ints():
    np = pytest.importorskip("numpy")
    assert encode_key(np.int64(42)) == encode_key(42)


def test_prefix_upper_bound():
    assert prefix_upper_bound(b"ab") == b"ac"
    assert prefix_upper_bound(b"a\xff") == b"b"
    assert prefix_upper_bound(b"\xff\xff") is None
    assert prefix_upper_bound(encode_key("a")) == b"\x02a\x00\x02"


def test_check_timestamp():
    assert check_timestamp("ts", 5) == 5
    with pytest.raises(ValueError, match=r"ts=9223372036854775808 does not fit"):
        check_timestamp("ts", 2**63)
    with pytest.raises(ValueError, match="does not fit"):
        check_timestamp("ts", -(2**63) - 1)
    with pytest.raises(TypeError, match="float"):
        check_timestamp("ts", 1.0)
    with pytest.raises(TypeError, match="bool"):
        check_timestamp("ts", True)


def test_store_key_encoder_cache_keeps_equal_but_distinct_keys_apart():
    from sessionstore.encoding.serde import key_codec

    encode, decode = key_codec(None)
    assert encode("a") == encode("a") == encode_key("a")
    assert encode(1) != encode(True)
    with pytest.raises(TypeError, match="float"):
        encode(1.0)
    assert decode(encode(True)) is True


def test_decode_keys_equals_decode_key_on_each():
    """The batch decoder (Arrow for plain strings) gives what decode_key gives each
    key, and falls back on every other encoding and on bad bytes alike."""
    plain = [f"user-{i}é" for i in range(100)]
    mixed = [*plain, "a\x00b", "", 7, ("t", 1), b"raw"]
    for keys in (plain, mixed, plain[:3]):
        encoded = [encode_key(k) for k in keys]
        assert decode_keys(encoded) == [decode_key(e) for e in encoded] == keys
    bad = [encode_key(k) for k in plain[:99]] + [b"\x02\xff\xfe\x00\x01"]  # not UTF-8
    with pytest.raises(UnicodeDecodeError):
        decode_keys(bad)


def test_encode_str_keys_equals_encode_key_on_each():
    """Arrow-built encodings of a string column equal encode_key's, for string and
    large_string columns; a column with a zero byte is left to encode_key (None)."""
    import pyarrow as pa

    keys = ["", "a", "é", "user-42", "z" * 300]
    for kind in (pa.string(), pa.large_string()):
        assert encode_str_keys(pa.array(keys, kind)) == [encode_key(k) for k in keys]
        assert encode_str_keys(pa.array([*keys, "a\x00b"], kind)) is None
