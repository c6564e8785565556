"""Changelog format: round trip, and every kind of damage is named."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.checkpoint.records.changelog import (
    CorruptChangelogError,
    decode_changelog,
    encode_changelog,
    read_changelog_header,
)
from sessionstore.checkpoint.storage.filesystem import open_filesystem
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


def _merged(changelog, limit):
    """The buffers of ``changelog.writes(limit)`` in one, and the largest one's
    accounted size (keys, values and the per-entry cost)."""
    from sessionstore.checkpoint.records.changelog import _ENTRY_COST

    whole, largest, chunks = WriteBuffer(), 0, list(changelog.writes(limit))
    for i, chunk in enumerate(chunks):
        assert not chunk.created or i == 0
        assert not chunk.dropped or i == len(chunks) - 1
        whole.created += chunk.created
        whole.dropped += chunk.dropped
        size = 0
        for cf, entries in chunk.families.items():
            assert not set(entries) & set(whole.families.get(cf, {}))  # each key once
            whole.families.setdefault(cf, {}).update(entries)
            size += sum(len(k) + len(v or b"") + _ENTRY_COST for k, v in entries.items())
        largest = max(largest, size)
    return whole, largest, len(chunks)


_families = st.sampled_from(["s.0", "s.1", "meta", "e.0"])
_writes = st.lists(
    st.tuples(_families, st.binary(max_size=12), st.none() | st.binary(max_size=40)),
    max_size=300,
)


@settings(max_examples=60, deadline=None)
@given(
    writes=_writes,
    created=st.lists(_families, max_size=2, unique=True),
    dropped=st.lists(_families, max_size=2, unique=True),
    limit=st.integers(1, 4000),
)
def test_streamed_writes_add_up_to_the_whole_decode_in_bounded_buffers(
    writes, created, dropped, limit
):
    """Held by invariant 5: a changelog's writes come in buffers of about
    ``limit``, and together they are exactly the writes a
    whole-file decode gives (a drop takes the family's writes)."""
    from sessionstore.checkpoint.records.changelog import Changelog, _Source

    buf = WriteBuffer()
    buf.created.extend(created)
    for cf, key, value in writes:
        buf.put(cf, key, value)
    for cf in dropped:
        buf.drop_family(cf)
    for data in (encode_changelog(buf, "op", 3, 7),):
        header, whole = decode_changelog(data, "x/7.changelog", 7)
        assert whole.created == created and whole.dropped == dropped
        assert whole.families == {cf: e for cf, e in buf.families.items() if cf not in dropped}
        with Changelog(_Source(data), "x/7.changelog", 7) as changelog:
            streamed, largest, n = _merged(changelog, limit)
        assert changelog.header == header
        assert (streamed.created, streamed.families, streamed.dropped) == (
            whole.created, whole.families, whole.dropped,
        )  # fmt: skip
        # sized by the entries before: over by half at most (entries cost 120 to 172)
        assert largest <= limit * 3 // 2 + 172


def test_a_large_changelog_is_read_from_a_file_and_its_damage_still_named(tmp_path):
    """Past INLINE_BYTES a changelog is read from a local file a share at a time:
    a truncated, bit-flipped or miscounted one is refused, naming the file and the
    version, before any write is handed out."""
    import struct
    import zlib

    from sessionstore.checkpoint.records import changelog as module
    from sessionstore.checkpoint.storage.filesystem import open_filesystem

    buf = WriteBuffer()
    for i in range(20_000):
        buf.put("s.0", b"k%06d" % i, b"v" * 50)
    good = encode_changelog(buf, "op", 3, 7)
    assert len(good) > module.INLINE_BYTES // 8
    storage = open_filesystem(str(tmp_path / "remote"))
    (head_len,) = struct.unpack_from(">I", good, 6)
    body_at = 10 + head_len
    miscounted = good[:-16] + struct.pack(">4sQI", b"SSCF", 20_001, zlib.crc32(good[:-16]))
    wrong_shape = good[:body_at] + b"\x92" + good[body_at + 1 : -16]  # [created, families]
    wrong_shape += struct.pack(">4sQI", b"SSCF", 20_000, zlib.crc32(wrong_shape))
    cases = {
        "good": (good, None),
        "truncated": (good[: len(good) // 2], "no footer"),
        "flipped": (good[:5000] + bytes([good[5000] ^ 4]) + good[5001:], "checksum mismatch"),
        "miscounted": (miscounted, "20000 records but the footer counts 20001"),
        "shape": (wrong_shape, "unreadable body"),
    }
    old = module.INLINE_BYTES
    module.INLINE_BYTES = 4096
    try:
        for name, (data, reason) in cases.items():
            storage.write_atomic(f"{name}.changelog", data)
            where = f"s3://b/{name}.changelog"
            if reason is None:
                with module.fetch_changelog(storage, f"{name}.changelog", where, 7, "") as c:
                    streamed, largest, n = _merged(c, 64 * 1024)
                assert streamed.families == buf.families and n > 10
                assert largest < 64 * 1024 + 200
                continue
            with pytest.raises(CorruptChangelogError, match=reason) as err:
                module.fetch_changelog(storage, f"{name}.changelog", where, 7, "")
            assert f"{where} (version 7)" in str(err.value)
    finally:
        module.INLINE_BYTES = old
