"""Lineage: which attempt's commit a version holds, and the fence that keeps one.

Every commit gets a unique id (:func:`new_commit_id`). Its changelog header
records it (:data:`COMMIT_FIELD`) and the id of the version it was built on
(:data:`PARENT_FIELD`); the local database holds the id of its version under the
meta key ``COMMIT_KEY`` (layout.py), written in the commit's batch, so a replay
and a snapshot carry it too; a manifest names the commit whose state it holds.
A load checks each link (:func:`check_continues`): a changelog applied to a
state it was not built on is refused, never mixed in.

**The fence** (:func:`publish`): two attempts of one batch (a speculative copy, a
zombie on an executor Spark gave up on, a retry after a crash) may each commit
the same version, possibly with different writes. The first to publish wins; a
later one *adopts* the winner: it drops its own writes, applies the winner's
changelog and reports the version as committed, so it neither fails nor replaces
what others may already have built on. Who is first:

* on a local filesystem, whoever links its changelog to the name first
  (``link`` refuses an existing name: exact, no extra cost);
* on an object store, the driver's coordinator when the caller gives an arbiter
  (:data:`CommitArbiter`; one round trip to the driver, no storage request): it
  grants the first claim of (partition, version) and names it to later ones. A
  winner that never uploads (it died after its claim) is superseded after
  :data:`CLAIM_WAIT_S`, so a retry never waits forever. The winner still writes by
  the store's conditional create where there is one, so that a superseded winner
  uploading late adopts rather than overwrites; where there is none, it looks
  before writing as below, and starts no request later than half the wait after
  its grant (else its commit fails, and the task's retry claims again);
* on S3 and GCS without an arbiter (it is unreachable: Spark Connect, or turned
  off), the store's conditional create (S3 ``If-None-Match: *``, GCS
  ``ifGenerationMatch=0``; conditional_create.py, the ``s3`` and ``gcs`` extras):
  whoever's create the store accepts first wins, exact, at the cost of the PUT
  that publishes anyway; a refused one reads the winner's changelog and adopts it;
* on any other object store without an arbiter (HDFS, a custom ``pyarrow.fs``
  filesystem, S3 or GCS without their client), look before writing: a changelog of
  the version already there, built on the same parent, wins. Two attempts whose
  uploads overlap may both miss each other; the later object stays, and
  :func:`check_continues` then refuses to replay the next version onto the other
  one's state (an error naming both ids, never a silent mix). Planning says so
  once per checkpoint location (:func:`warn_unfenced`).

A changelog already at the name that was built on another parent (a leftover of
an abandoned lineage, or of a release without lineage, or a damaged one) is
replaced: on S3 and GCS only if it is still the version read (``If-Match:
<ETag>``, ``ifGenerationMatch=<generation>``), so two attempts that find one
leftover at once are fenced too. A retried request whose first attempt landed
meets its own commit at the name and keeps it: no retry ends in an unconditional
write over another commit.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from sessionstore.checkpoint.records.changelog import (
    CorruptChangelogError,
    decode_changelog,
    read_changelog_header,
)
from sessionstore.checkpoint.records.fence import FencedError, fenced_by
from sessionstore.checkpoint.records.layout import changelog_name, read_changelog_file
from sessionstore.checkpoint.storage.filesystem import Storage
from sessionstore.engine.write_buffer import WriteBuffer
from sessionstore.errors import SessionStoreError
from sessionstore.process import this_process

__all__ = [
    "COMMIT_FIELD",
    "PARENT_FIELD",
    "CLAIM_WAIT_S",
    "CommitArbiter",
    "LineageError",
    "Winner",
    "new_commit_id",
    "check_continues",
    "publish",
    "warn_unfenced",
    "SnapshotRecord",
    "write_snapshot_record",
    "read_snapshot_record",
]

log = logging.getLogger(__name__)

#: Changelog header fields: this commit's id and the id of the version it continues.
COMMIT_FIELD = "commit"
PARENT_FIELD = "parent"
#: How long a loser waits for the winner's changelog to appear before it asks the
#: arbiter to let it supersede a winner that never uploaded.
CLAIM_WAIT_S = 30.0
_POLL_S = (0.05, 1.0)

#: ``arbiter(version, commit, parent, supersede)``: the id of the commit that wins
#: ``version`` (``commit`` if the caller's claim won), or None when the arbiter
#: cannot be asked. ``supersede`` names a winner the caller waited for in vain.
CommitArbiter = Callable[[int, str, "str | None", "str | None"], "str | None"]


class LineageError(SessionStoreError):
    """A changelog or snapshot applied to a state it was not built on."""

    def __init__(self, where: str, version: int, expected: str | None, found: str | None) -> None:
        self.where, self.version, self.expected, self.found = where, version, expected, found
        super().__init__(
            f"{where} (version {version}) continues commit {found} but the state it would "
            f"be applied to is commit {expected}: two attempts of one batch both "
            "committed; it is never mixed in"
        )


@dataclass(frozen=True)
class Winner:
    """The commit another attempt published first: what a loser adopts. ``tag``:
    the stored version read (``Storage.read_tagged``), for a conditional replace."""

    header: dict[str, Any]
    writes: WriteBuffer
    tag: str | None = None


def new_commit_id() -> str:
    """A unique id for one commit (32 hex digits)."""
    return uuid.uuid4().hex


def check_continues(
    header: dict[str, Any], commit_before: str | None, where: str, version: int
) -> None:
    """:class:`LineageError` unless the changelog whose ``header`` this is was built
    on ``commit_before`` (unknown on either side, as in checkpoints written before
    lineage, passes)."""
    parent = header.get(PARENT_FIELD)
    if parent is not None and commit_before is not None and parent != commit_before:
        raise LineageError(where, version, commit_before, parent)


def _stored(storage: Storage, version: int) -> Winner | None:
    """The changelog of ``version`` at its name, None when there is none; a
    damaged one is there but no one's commit (an empty header), so it is replaced."""
    name = changelog_name(version)
    try:
        data, tag = storage.read_tagged(name)
    except FileNotFoundError:
        return None
    generation = fenced_by(data)
    if generation is not None:
        raise FencedError(
            f"{storage.where(name)}: version {version} is fenced: this checkpoint was "
            f"rescaled to another partition count (generation {generation}) after the "
            "query committing here planned it, and its state moved there; this commit "
            "is refused. Stop the query of the old count; restarted, it uses the "
            "rescaled state (docs/rescale.md)"
        )
    try:
        header, writes = decode_changelog(data, storage.where(name), version)
    except CorruptChangelogError as exc:
        log.warning("sessionstore: replacing a damaged changelog: %s", exc)
        return Winner({}, WriteBuffer(), tag)
    return Winner(header, writes, tag)


def _rival(found: Winner | None, commit: str, parent: str | None) -> Winner | None:
    """``found`` if it is another attempt's commit of the same version on the same
    parent (the one to adopt), else None (nothing there, ours, or a leftover)."""
    if found is None or found.header.get(COMMIT_FIELD) in (None, commit):
        return None
    return found if found.header.get(PARENT_FIELD) == parent else None


def publish(
    storage: Storage,
    version: int,
    data: bytes,
    commit: str,
    parent: str | None,
    arbiter: CommitArbiter | None = None,
    wait_s: float | None = None,
) -> Winner | None:
    """Publish ``data``, the changelog of ``version`` by commit ``commit`` built on
    ``parent``, unless another attempt's commit of that version wins (see the module
    doc): None when ours is the committed version, else the winner to adopt.
    ``wait_s`` (default :data:`CLAIM_WAIT_S`): how long to wait for a winner's
    changelog before superseding it."""
    name = changelog_name(version)
    granted = None
    if arbiter is not None and not storage.local:
        decided = _claim(storage, version, commit, parent, arbiter, wait_s)
        if isinstance(decided, Winner):
            return decided
        if decided is _OURS:
            granted = time.monotonic()
    if storage.exclusive_create:
        # a superseded winner uploading late meets the name taken here, and adopts
        try:
            return _create(storage, name, version, data, commit, parent)
        except NotImplementedError:  # the store turned out not to implement it: look
            pass
    if granted is not None:
        storage = _before_supersession(storage, name, version, granted, wait_s)
    # no fence at the store: look before writing, even after a granted claim (the
    # claim of another attempt whose reply was lost looks too)
    found = _stored(storage, version)
    if found is not None and found.header.get(COMMIT_FIELD) == commit:
        return None  # ours, landed by an attempt whose reply was lost
    rival = _rival(found, commit, parent)
    if rival is not None:
        return rival
    storage.write_atomic(name, data)
    return None


def _before_supersession(
    storage: Storage, name: str, version: int, granted: float, wait_s: float | None
) -> Storage:
    """``storage`` whose requests start within half the claim wait of the grant:
    where the store cannot fence, a winner superseded after the wait would
    overwrite its successor's changelog. Past that, the commit fails (the task's
    retry claims again)."""
    half = (CLAIM_WAIT_S if wait_s is None else wait_s) / 2
    left = granted + half - time.monotonic()
    if left <= 0:
        raise OSError(
            f"cannot write {storage.where(name)}: the claim of version {version} was "
            f"granted more than {half:g} s ago, and another attempt may supersede it; "
            "not written (a retry of the task claims again)"
        )
    return storage.within(left)


def _create(
    storage: Storage, name: str, version: int, data: bytes, commit: str, parent: str | None
) -> Winner | None:
    """Publish by an exclusive create: the first writer of the name wins. A
    leftover of another lineage at the name is replaced only if it is still the
    version read (S3 ``If-Match``, GCS ``ifGenerationMatch``; a local file is
    replaced as is), so two attempts that find it at once are fenced as well;
    nothing is ever written unconditionally over another commit."""
    refused = 0
    while not storage.write_exclusive(name, data):
        found = _stored(storage, version)
        if found is not None and found.header.get(COMMIT_FIELD) == commit:
            return None  # ours: a retried request whose first attempt landed
        rival = _rival(found, commit, parent)
        if rival is not None:
            return rival
        if found is not None and _replace(storage, name, data, found):
            return None
        # nothing there (the other conditional write under way, S3's 409, failed)
        # or the leftover changed before our replacement: look and try again, as
        # long as the retry policy would try a transient error
        refused += 1
        if refused >= storage.retry.max_attempts:
            raise OSError(
                f"cannot write {storage.where(name)}: the store refused to write it "
                f"{refused} times, yet found no other commit of it there"
            )
        time.sleep(storage.retry.delay(refused))
    return None


def _replace(storage: Storage, name: str, data: bytes, leftover: Winner) -> bool:
    """Replace ``leftover`` (a changelog of another lineage, or damaged) by
    ``data``: True if done, False if it changed meanwhile."""
    if storage.local or leftover.tag is None:
        storage.write_atomic(name, data)
        return True
    return storage.replace_if(name, data, leftover.tag)


#: What :func:`_claim` returns when the caller's claim won, or the arbiter is
#: unreachable.
_OURS, _UNREACHABLE = object(), object()


def _claim(
    storage: Storage,
    version: int,
    commit: str,
    parent: str | None,
    arbiter: CommitArbiter,
    wait_s: float | None,
) -> Winner | object:
    """Ask ``arbiter`` who wins ``version``: the winner's changelog once it is
    stored, :data:`_OURS` or :data:`_UNREACHABLE`."""
    wait_s = CLAIM_WAIT_S if wait_s is None else wait_s
    supersede, waited, pause = None, time.monotonic(), _POLL_S[0]
    while True:
        decided = arbiter(version, commit, parent, supersede)
        if decided is None:
            return _UNREACHABLE
        if decided == commit:
            return _OURS
        found = _stored(storage, version)
        if found is not None and found.header.get(COMMIT_FIELD) == decided:
            return found
        if time.monotonic() - waited > wait_s:
            log.warning(
                "sessionstore: commit %s of version %d of %s never appeared; "
                "superseding it", decided, version, storage.uri,
            )  # fmt: skip
            supersede, waited = decided, time.monotonic()
        else:
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])


#: The once-per-process event of :func:`warn_unfenced`, by checkpoint location
#: (:mod:`sessionstore.process`).
UNFENCED_WARNING = "unfenced"


def warn_unfenced(storage: Storage) -> bool:
    """At planning: one warning per process and checkpoint location when
    ``storage`` cannot fence two attempts of one batch at the store (no conditional
    create: HDFS, other ``pyarrow.fs`` stores, S3 or GCS without their extra),
    naming the risk. Returns whether it warned."""
    gap = storage.fence_gap()
    if gap is None or not this_process().first_time(UNFENCED_WARNING, storage.location):
        return False
    half = CLAIM_WAIT_S / 2
    warnings.warn(
        f"sessionstore: {storage.uri} cannot fence two attempts of one micro-batch at "
        f"the store ({gap}). The risk: two attempts of a batch (a speculative copy, a "
        "zombie task, a retry) whose uploads of one partition's changelog overlap both "
        "publish it, the later replacing the other; later loads of that partition then "
        "fail with LineageError (they never mix the two) until the checkpoint is "
        "restored by hand. The driver's coordinator narrows this to an attempt whose "
        f"claim reply is lost or whose upload starts over {half:g} s after its claim. "
        "A store with conditional writes closes it: S3 or GCS with the sessionstore[s3] "
        "or sessionstore[gcs] extra, or a local filesystem (docs/durability.md, Lineage).",
        stacklevel=3,
    )
    return True


# ------------------------------------------------------- pending local snapshots
@dataclass(frozen=True)
class SnapshotRecord:
    """Whose a pending local snapshot is: the identity of the checkpoint copy whose
    state it holds (the local database's ``checkpoint_identity``) and the commit."""

    identity: bytes
    commit: str | None


def write_snapshot_record(path: str, record: SnapshotRecord) -> None:
    """Write ``record`` beside a pending snapshot (after the snapshot is whole: a
    snapshot without a record is never uploaded)."""
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
        f.write(msgpack.packb({"identity": record.identity, "commit": record.commit}))
    os.replace(tmp, path)


def read_snapshot_record(path: str) -> SnapshotRecord | None:
    """The record at ``path``, or None when there is none or it is unreadable."""
    try:
        with open(path, "rb") as f:
            raw = msgpack.unpackb(f.read(), raw=False)
        identity, commit = raw["identity"], raw["commit"]
    except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException):
        return None
    if not isinstance(identity, bytes) or not (commit is None or isinstance(commit, str)):
        return None
    return SnapshotRecord(identity, commit)


def stored_commit(remote: Storage, version: int) -> str | None:
    """The commit of ``version`` in the checkpoint as it is now: the header of its
    changelog (one ranged read), None if there is none or it is unreadable."""
    try:
        header = read_changelog_file(
            lambda name: read_changelog_header(remote, name, guess=2048), version
        )
    except (FileNotFoundError, CorruptChangelogError):
        return None
    return header.get(COMMIT_FIELD)
