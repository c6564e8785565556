"""Sessions certain to close at the next advance, kept as blocks of sessions.

An emit-on-close operator judged by the time of its last advance (Spark's
watermark) cannot emit the sessions a micro-batch passes until the next advance.
A session that ends before its partition's own close time after the batch
(``stream time - gap - grace``) is certain to close then: the next advance is to a
time at least the partition's own, and no later row can merge with a closed
session. Such a session needs neither a row in the key-ordered segments nor an
entry in the end index (:mod:`sessionstore.stores.end_index`) for the one batch
it waits: the batch writes it here, and the next advance reads it back with its
value and deletes it.

Layout: the column family ``<store>.closing`` of the store's StateDB, written in
the same batch as everything else, so changelogs and snapshots carry it and a
restore brings it back. It holds two kinds of row, told apart by the key:

* **A block** (what a batch writes): the 16-byte key ``00 × 8 ‖ seq`` (``seq`` a
  big-endian uint64 from 0), and as value the msgpack array
  ``[1, ends, starts, keys, values]`` of up to :data:`BLOCK_SESSIONS` sessions in
  (end, start, key) order: ``ends`` and ``starts`` little-endian int64s packed
  into one bin each, ``keys`` the encoded keys and ``values`` the stored value
  bytes (the store's value serde), one bin each. One row per block rather than per
  session: a micro-batch passes thousands of sessions per partition, and a row per
  session costs a RocksDB write, a changelog entry, a scan entry and a delete each
  (the aggregates benchmark in BENCHMARKS.md).
* **A session** (what a repartition writes, routing each session of a block to
  its key's partition, and what checkpoints of earlier versions hold):
  ``end ‖ start ‖ enc(key)`` as the end index (times as in
  :mod:`sessionstore.encoding.session_key`; longer than 16 bytes, as an encoded
  key is never empty) → the value bytes.

Readers see one list of sessions in (end, start, key) order, whichever rows hold
them. A row of neither kind, a block that does not decode as above (its sessions
strictly in that order) or a session kept twice raises ``SessionStoreError``
naming the family and the row: the checkpoint is not what this code wrote.

Example: the session ``[1000, 5000]`` of ``"a"`` (count 2) kept alone is the row
``00 00 00 00 00 00 00 00 ‖ 00 00 00 00 00 00 00 00`` → ``95 01 c4 08 88 13 00 00
00 00 00 00 c4 08 e8 03 00 00 00 00 00 00 91 c4 04 02 61 00 01 91 c4 02 91 02``
(msgpack ``[1, ends, starts, [enc("a")], [bytes of [2]]]``), and written by a
repartition ``80 00 00 00 00 00 13 88 ‖ 80 00 00 00 00 00 03 e8 ‖ 02 61 00 01`` →
``91 02``.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessionstore.arrow_pandas import numpy_of
from sessionstore.encoding.session_key import TIME_SIGN, TIMES_LEN
from sessionstore.errors import SessionStoreError

if TYPE_CHECKING:
    from sessionstore.engine.db import Database

__all__ = ["ClosingSessions", "ClosingEntry", "BLOCK_SESSIONS", "session_rows"]

#: ``(end, start, encoded key, stored value bytes)``, in (end, start, key) order.
ClosingEntry = tuple[int, int, bytes, bytes]
#: Times are stored with the sign bit flipped (``+ 2**63`` modulo ``2**64``).
_SIGN = np.uint64(TIME_SIGN)
#: Sessions per block at most (a block is one RocksDB value and changelog entry).
BLOCK_SESSIONS = 65_536
_BLOCK_TAG = bytes(8)
_SEQ = struct.Struct(">Q")
_FORMAT = 1


def _is_block(cf: str, raw: bytes) -> bool:
    """Whether ``raw`` is a block's key (else a session row's); ``SessionStoreError``
    for a key that is neither."""
    if len(raw) > TIMES_LEN:
        return False
    if len(raw) == TIMES_LEN and raw.startswith(_BLOCK_TAG):
        return True
    raise _foreign(
        cf,
        f"the row {raw.hex()} is neither a closing block (00 x 8 and a sequence number) "
        "nor a session (end, start, key: more than 16 bytes)",
    )


def _foreign(cf: str, what: str) -> SessionStoreError:
    """The error for a row of ``cf`` that this code did not write as it reads."""
    return SessionStoreError(
        f"{cf}: {what}; the checkpoint holds state of another format or a damaged row"
    )


class ClosingSessions:
    """The sessions of a store that close at its next advance, in a StateDB family."""

    def __init__(self, db: Database, store: str) -> None:
        self._db = db
        self._cf = f"{store}.closing"
        db.create_column_family(self._cf)  # nothing to do where it exists (also read-only)

    def add_many(
        self, kbs: list[bytes], starts: np.ndarray, ends: np.ndarray, values: list[bytes]
    ) -> None:
        """Keep the sessions given as columns (encoded keys, starts, ends, value
        bytes) in blocks (one, up to :data:`BLOCK_SESSIONS`), after any block kept."""
        n = len(kbs)
        if not n:
            return
        odd = next((v for v in values if type(v) is not bytes), None)
        if odd is not None or len(values) != n:
            got = (
                f"{len(values)} values for {n} keys"
                if odd is None
                else f"{type(odd).__name__} {odd!r:.80}"
            )
            raise TypeError(
                f"{self._cf}: a kept session's value must be bytes (what the store's value "
                f"serde gives), one per key; got {got}"
            )
        ends = np.asarray(ends, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        order = numpy_of(pc.sort_indices(
            pa.table({"e": ends, "s": starts, "k": pa.array(kbs, pa.binary())}),
            sort_keys=[("e", "ascending"), ("s", "ascending"), ("k", "ascending")],
        ))  # fmt: skip
        ends, starts = ends[order], starts[order]
        picked = order.tolist()
        kbs = [kbs[i] for i in picked]
        values = [values[i] for i in picked]
        with self._db.batch():
            seq = self._next_seq()
            rows = self._db.bulk_writer(self._cf)
            for at in range(0, n, BLOCK_SESSIONS):
                part = slice(at, at + BLOCK_SESSIONS)
                rows[_BLOCK_TAG + _SEQ.pack(seq)] = msgpack.packb(
                    [
                        _FORMAT,
                        ends[part].astype("<i8").tobytes(),
                        starts[part].astype("<i8").tobytes(),
                        kbs[part],
                        values[part],
                    ],
                    use_bin_type=True,
                )
                seq += 1

    def _next_seq(self) -> int:
        # a second keep before the kept ones are taken (no caller does it now) must
        # not overwrite a block: number after the last one
        seqs = [
            _SEQ.unpack_from(raw, 8)[0]
            for raw, _ in self._db.scan_list(self._cf, _BLOCK_TAG, bytes(7) + b"\x01")
            if _is_block(self._cf, raw)
        ]
        return max(seqs) + 1 if seqs else 0

    def all(self) -> list[ClosingEntry]:
        """Every kept session, in (end, start, key) order."""
        return self._entries(self._db.scan_list(self._cf))

    def take_all(self) -> list[ClosingEntry]:
        """:meth:`all`, and forget them (one range read, one pending-write dict)."""
        rows = self._db.scan_list(self._cf)
        entries = self._entries(rows)
        if rows:
            with self._db.batch():
                self._db.bulk_writer(self._cf).update(dict.fromkeys(raw for raw, _ in rows))
        return entries

    def any(self) -> bool:
        """Whether any session is kept."""
        rows = self._db.scan(self._cf)
        try:
            return next(rows, None) is not None
        finally:
            rows.close()

    def _entries(self, rows: list[tuple[bytes, bytes]]) -> list[ClosingEntry]:
        """The sessions of the family's raw rows, in (end, start, key) order."""
        blocks, singles = [], []
        for row in rows:
            (blocks if _is_block(self._cf, row[0]) else singles).append(row)
        if len(blocks) == 1 and not singles:  # the usual case: sorted as written
            return _block_entries(self._cf, *blocks[0])
        entries = _decoded(singles)
        if not blocks:
            return entries
        for raw, value in blocks:
            entries.extend(_block_entries(self._cf, raw, value))
        entries.sort(key=_order)
        for a, b in zip(entries, entries[1:], strict=False):
            if _order(a) == _order(b):
                raise _foreign(self._cf, f"the session {_order(a)!r} is kept twice")
        return entries


def _order(entry: ClosingEntry) -> tuple[int, int, bytes]:
    return entry[0], entry[1], entry[2]


def _block_entries(cf: str, raw: bytes, value: bytes) -> list[ClosingEntry]:
    """The sessions of one block row, as written (checked: see the module doc)."""

    def bad(why: str) -> SessionStoreError:
        return _foreign(cf, f"the closing block {raw.hex()} is not one this code writes ({why})")

    try:
        block = msgpack.unpackb(value, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise bad(f"not msgpack: {exc}") from None
    if (
        not isinstance(block, list)
        or len(block) != 5
        or type(block[0]) is not int
        or block[0] != _FORMAT
    ):
        head = block[:1] if isinstance(block, list) else type(block).__name__
        raise bad(f"expected [{_FORMAT}, ends, starts, keys, values], got {head!r}...")
    _, ends_b, starts_b, kbs, values = block
    n = len(kbs) if isinstance(kbs, list) else -1
    if (
        not isinstance(ends_b, bytes)
        or not isinstance(starts_b, bytes)
        or not isinstance(values, list)
        or n < 0
        or len(ends_b) != 8 * n
        or len(starts_b) != 8 * n
        or len(values) != n
    ):
        raise bad("its columns differ in length or type")
    if not all(type(kb) is bytes and kb for kb in kbs) or not all(
        type(vb) is bytes for vb in values
    ):
        raise bad("a key or value is not bytes")
    ends_a = np.frombuffer(ends_b, dtype="<i8")
    starts_a = np.frombuffer(starts_b, dtype="<i8")
    # strictly increasing (end, start, key): emitted in this order, each once
    later = ends_a[1:] > ends_a[:-1]
    tied = ends_a[1:] == ends_a[:-1]
    later |= tied & (starts_a[1:] > starts_a[:-1])
    tied &= starts_a[1:] == starts_a[:-1]
    for i in np.flatnonzero(tied).tolist():
        later[i] = kbs[i + 1] > kbs[i]
    if not later.all():
        at = int(np.flatnonzero(~later)[0])
        raise bad(f"session {at + 1} does not follow session {at} in (end, start, key) order")
    return list(zip(ends_a.tolist(), starts_a.tolist(), kbs, values, strict=True))


def session_rows(cf: str, raw: bytes, value: bytes) -> list[tuple[bytes, bytes]]:
    """The rows ``end ‖ start ‖ enc(key)`` → value bytes that the family's raw row
    stands for: itself, or each session of a block (what a repartition routes)."""
    if not _is_block(cf, raw):
        return [(raw, value)]
    entries = _block_entries(cf, raw, value)
    if not entries:
        return []
    times = np.empty((len(entries), 2), dtype=">u8")
    times[:, 0] = np.array([e[0] for e in entries], dtype=np.int64).view(np.uint64) ^ _SIGN
    times[:, 1] = np.array([e[1] for e in entries], dtype=np.int64).view(np.uint64) ^ _SIGN
    packed = times.tobytes()
    return [
        (packed[i * TIMES_LEN : (i + 1) * TIMES_LEN] + kb, vb)
        for i, (_, _, kb, vb) in enumerate(entries)
    ]


def _decoded(rows: list[tuple[bytes, bytes]]) -> list[ClosingEntry]:
    """Session rows as entries: the time prefixes unpacked at once."""
    if not rows:
        return []
    raws = [raw for raw, _ in rows]
    times = np.frombuffer(b"".join([raw[:TIMES_LEN] for raw in raws]), dtype=">u8")
    signed = (times.astype(np.uint64) ^ _SIGN).view(np.int64).reshape(-1, 2)
    kbs = [raw[TIMES_LEN:] for raw in raws]
    return list(
        zip(signed[:, 0].tolist(), signed[:, 1].tolist(), kbs, [vb for _, vb in rows], strict=True)
    )
