"""Changelog format: round trip, and every kind of damage is named."""

from __future__ import annotations

import pytest

from sessionstore.checkpoint.changelog import (
    CorruptChangelogError,
    decode_changelog,
    encode_changelog,
    read_changelog_header,
)
from sessionstore.checkpoint.filesystem import open_filesystem
from sessionstore.engine.write_buffer import WriteBuffer


def sample() -> WriteBuffer:
    buf = WriteBuffer()
    buf.created.append("s.3")
    buf.put("s.3", b"k1", b"v1")
    buf.put("s.3", b"k2", b"")
    buf.put("meta", b"stream_time:s", b"\x00" * 8)
    buf.put("s.3", b"gone", None)
    buf.dropped.append("s.1")
    return buf


def test_round_trip():
    data = encode_changelog(sample(), "op", 3, 7)
    header, buf = decode_changelog(data, "x/7.changelog", 7)
    assert header == {"operator": "op", "partition": 3, "version": 7}
    assert buf.created == ["s.3"]
    assert buf.families == {
        "s.3": {b"k1": b"v1", b"k2": b"", b"gone": None},
        "meta": {b"stream_time:s": b"\x00" * 8},
    }
    assert buf.dropped == ["s.1"]
    assert data[:4] == b"SSCL"


@pytest.mark.parametrize(
    "damage,reason",
    [
        (lambda d: d[: len(d) // 2], "no footer"),
        (lambda d: d[:10], "shorter than header and footer"),
        (lambda d: d[:40] + bytes([d[40] ^ 1]) + d[41:], "checksum mismatch"),
        (lambda d: b"XXXX" + d[4:], "bad magic"),
        (lambda d: d[:4] + b"\x00\x09" + d[6:], "unknown changelog format 9"),
    ],
)
def test_damage_is_detected_and_named(damage, reason):
    data = damage(encode_changelog(sample(), "op", 3, 7))
    with pytest.raises(CorruptChangelogError, match=reason) as err:
        decode_changelog(data, "s3://b/op/3/changelog/7.changelog", 7)
    assert "s3://b/op/3/changelog/7.changelog" in str(err.value)
    assert "version 7" in str(err.value)


def test_wrong_version_in_header():
    data = encode_changelog(sample(), "op", 3, 7)
    with pytest.raises(CorruptChangelogError, match="header says version 7"):
        decode_changelog(data, "8.changelog", 8)


def _v1(records, version=7):
    """A format-1 changelog (framed records: no release wrote it), whole and with
    a valid checksum."""
    import struct
    import zlib

    import msgpack

    header = msgpack.packb({"operator": "op", "partition": 3, "version": version})
    parts = [struct.pack(">4sHI", b"SSCL", 1, len(header)), header]
    for record in records:
        body = msgpack.packb(record, use_bin_type=True)
        parts += [struct.pack(">I", len(body)), body]
    data = b"".join(parts)
    return data + struct.pack(">4sQI", b"SSCF", len(records), zlib.crc32(data))


def test_an_unknown_format_is_refused_naming_the_file_and_the_format(tmp_path):
    """Only the format this release writes is read: a whole changelog of another
    (format 1 here, with a valid checksum) is refused by the decoder and by the
    header reader, each naming the file and the format."""
    data = _v1([[0, "s.3", None, None], [1, "s.3", b"k1", b"v1"]])
    with pytest.raises(CorruptChangelogError) as err:
        decode_changelog(data, "s3://b/op/3/changelog/0/7.changelog", 7)
    assert str(err.value).startswith(
        "changelog s3://b/op/3/changelog/0/7.changelog (version 7) is corrupt: unknown "
        "changelog format 1; this sessionstore reads format 2 only"
    )
    storage = open_filesystem(f"file://{tmp_path}/op/3")
    storage.write_atomic("changelog/0/7.changelog", data)
    with pytest.raises(CorruptChangelogError) as err:
        read_changelog_header(storage, "changelog/0/7.changelog")
    assert f"{tmp_path}/op/3/changelog/0/7.changelog" in str(err.value)
    assert "unknown changelog format 1; this sessionstore reads format 2 only" in str(err.value)


def test_new_changelogs_are_format_2_and_count_every_record():
    import struct

    data = encode_changelog(sample(), "op", 3, 7)
    assert struct.unpack_from(">H", data, 4)[0] == 2
    assert struct.unpack_from(">Q", data, len(data) - 12)[0] == 6  # 1 create, 4 writes, 1 drop


def test_a_body_that_does_not_decode_is_named_even_with_a_valid_checksum():
    import struct
    import zlib

    good = encode_changelog(sample(), "op", 3, 7)
    (head_len,) = struct.unpack_from(">I", good, 6)
    data = good[: 10 + head_len] + b"\xc1garbage"  # 0xc1 is never valid msgpack
    data += struct.pack(">4sQI", b"SSCF", 6, zlib.crc32(data))
    with pytest.raises(CorruptChangelogError, match="unreadable body"):
        decode_changelog(data, "x/7.changelog", 7)
