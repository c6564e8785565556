"""Changelog files: every write of one committed version, checkable end to end.

Layout (all integers big-endian)::

    "SSCL" ‖ format u16 ‖ header length u32 ‖ header (msgpack map: operator,
    partition, version, and optionally stats: per store its stream time and
    estimated key count, so ``sessionstore ls`` reads a few hundred bytes per
    partition instead of restoring it)
    records: length u32 ‖ msgpack [op, family, key, value]   (repeated)
    "SSCF" ‖ record count u64 ‖ crc32 u32 of every byte before this footer

Ops: 0 create family, 1 put, 2 delete, 3 drop family, in the order a commit
applies them (creates, writes, drops). The explicit magic and format version mean
a reader never has to guess a format from its bytes (Spark had bugs of that kind:
SPARK-51922, SPARK-52553). A torn, truncated or bit-flipped file fails the length,
count or checksum test, and the error names the file, the version and the problem.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack

from sessionstore.errors import SessionStoreError
from sessionstore.write_buffer import WriteBuffer

__all__ = [
    "encode_changelog",
    "decode_changelog",
    "read_changelog_header",
    "CorruptChangelogError",
    "FORMAT",
]

MAGIC = b"SSCL"
FOOTER_MAGIC = b"SSCF"
FORMAT = 1
_HEAD = struct.Struct(">4sHI")
_LEN = struct.Struct(">I")
_FOOT = struct.Struct(">4sQI")

CREATE, PUT, DELETE, DROP = 0, 1, 2, 3


class CorruptChangelogError(SessionStoreError):
    """A changelog file that cannot be trusted."""

    def __init__(self, path: str, version: int | None, reason: str) -> None:
        self.path, self.version, self.reason = path, version, reason
        super().__init__(
            f"changelog {path} (version {version}) is corrupt: {reason}; restore from an "
            "earlier snapshot or re-run the batch that wrote it"
        )


def encode_changelog(
    buf: WriteBuffer,
    operator: str,
    partition: int,
    version: int,
    stats: dict[str, Any] | None = None,
) -> bytes:
    """Serialise the writes of one commit (``stats`` goes into the header)."""
    pack = msgpack.Packer(use_bin_type=True).pack
    head = {"operator": operator, "partition": partition, "version": version}
    if stats is not None:
        head["stats"] = stats
    header = pack(head)
    parts = [_HEAD.pack(MAGIC, FORMAT, len(header)), header]
    count = 0

    def add(record: list[Any]) -> None:
        nonlocal count
        body = pack(record)
        parts.append(_LEN.pack(len(body)))
        parts.append(body)
        count += 1

    for cf in buf.created:
        add([CREATE, cf, None, None])
    for cf, entries in buf.families.items():
        for key, value in entries.items():
            add([PUT, cf, key, value] if value is not None else [DELETE, cf, key, None])
    for cf in buf.dropped:
        add([DROP, cf, None, None])
    body = b"".join(parts)
    return body + _FOOT.pack(FOOTER_MAGIC, count, zlib.crc32(body))


def read_changelog_header(storage: Any, rel: str, guess: int = 4096) -> dict[str, Any]:
    """The header of the changelog at ``rel``, read with one or two ranged reads
    (the records and footer are not read, so nothing is checksummed)."""
    data = storage.read(rel, guess)
    where = f"{storage.uri.rstrip('/')}/{rel}"
    if len(data) < _HEAD.size:
        raise CorruptChangelogError(where, None, f"only {len(data)} bytes")
    magic, fmt, head_len = _HEAD.unpack_from(data)
    if magic != MAGIC or fmt != FORMAT:
        raise CorruptChangelogError(where, None, f"bad magic {magic!r} or format {fmt}")
    if _HEAD.size + head_len > len(data):
        data = storage.read(rel, _HEAD.size + head_len)
    try:
        return msgpack.unpackb(data[_HEAD.size : _HEAD.size + head_len], raw=False)
    except Exception as exc:
        raise CorruptChangelogError(where, None, f"unreadable header: {exc}") from None


def decode_changelog(
    data: bytes, path: str, version: int | None = None
) -> tuple[dict, WriteBuffer]:
    """``(header, writes)`` of a changelog; :class:`CorruptChangelogError` if damaged."""

    def corrupt(reason: str) -> CorruptChangelogError:
        return CorruptChangelogError(path, version, reason)

    if len(data) < _HEAD.size + _FOOT.size:
        raise corrupt(f"only {len(data)} bytes, shorter than header and footer")
    magic, fmt, head_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise corrupt(f"bad magic {magic!r}, not a sessionstore changelog")
    if fmt != FORMAT:
        raise corrupt(f"format {fmt}, this sessionstore reads format {FORMAT}")
    foot_at = len(data) - _FOOT.size
    foot_magic, count, crc = _FOOT.unpack_from(data, foot_at)
    if foot_magic != FOOTER_MAGIC:
        raise corrupt("no footer: the file is truncated or torn")
    if zlib.crc32(data[:foot_at]) != crc:
        raise corrupt("checksum mismatch: the content was altered")
    try:
        header = msgpack.unpackb(data[_HEAD.size : _HEAD.size + head_len], raw=False)
    except Exception as exc:
        raise corrupt(f"unreadable header: {exc}") from None
    if version is not None and header.get("version") != version:
        raise corrupt(f"header says version {header.get('version')}")
    buf = WriteBuffer()
    pos, seen = _HEAD.size + head_len, 0
    unpack = msgpack.unpackb
    while pos < foot_at:
        (size,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        if pos + size > foot_at:
            raise corrupt(f"record {seen} runs past the end of the records")
        op, cf, key, value = unpack(data[pos : pos + size], raw=False)
        pos += size
        seen += 1
        if op == PUT:
            buf.families.setdefault(cf, {})[key] = value
        elif op == DELETE:
            buf.families.setdefault(cf, {})[key] = None
        elif op == CREATE:
            buf.created.append(cf)
        elif op == DROP:
            buf.families.pop(cf, None)
            buf.dropped.append(cf)
        else:
            raise corrupt(f"unknown op {op} in record {seen - 1}")
    if seen != count:
        raise corrupt(f"{seen} records but the footer counts {count}")
    return header, buf
