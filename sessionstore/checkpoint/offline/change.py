"""Offline changes to an operator's checkpoint: every partition's latest version V
rewritten row by row (``sessionstore erase``, ``sessionstore.rewrite``), as a new
commit of V that replaces the retained history.

Why version V and not V+1: a query restarted on the checkpoint runs its next batch
V and loads version V (Spark's batch id picks the version), so the changed state
must be version V. It is a new commit of it: a new commit id per partition
(:func:`~sessionstore.checkpoint.partition.lineage.new_commit_id`), recorded in the database
and named by the manifest, which the query's next changelog names as its parent.

The protocol (docs/rewrite.md):

1. **Check** (nothing written): the operator exists, every partition's latest
   version is the same V and loadable, no query holds the checkpoint
   (:func:`check_idle`), no change is half applied (one is, first: finish it).
2. **Stage** (nothing a query or reader sees): each partition's version V is
   loaded through the provider, its rows go through the change into a new local
   database (every partition's is built before any is uploaded, so a change that
   refuses a row writes nothing), which is uploaded as a snapshot by the provider's own
   :func:`~sessionstore.checkpoint.records.snapshot.upload_snapshot` (content named by
   sha256, checked on every restore), except that the manifest goes to
   ``_changes/<id>/<p>.manifest`` instead of ``<p>/snapshot/<V>.manifest``.
   Content files nobody references are invisible.
3. **Commit point**: after checking again that no partition committed since,
   ``_metadata`` is written (one atomic write) with the ``change`` record. From
   then on every provider refuses the checkpoint (``CheckpointMismatchError``:
   a half-applied change) until it is applied.
4. **Apply** (:func:`finish_change`, idempotent, so a rerun after a crash rolls
   forward): per partition, the staged manifest becomes ``snapshot/<V>.manifest``,
   every changelog and every other snapshot is deleted (the versions before V are
   no longer loadable: the erased rows must not survive in them), content files
   the new manifest does not use are deleted, the event time batch V reads is
   written where a partition without changelog V has it; the audit record; last,
   ``_metadata`` without the record and with a new ``checkpoint_id``, so that no
   local database or pending snapshot of the old state is ever used again
   (docs/durability.md, Checkpoint identity).

A crash before 3 leaves the old state (a rerun deletes the staging); after it,
the new one once a rerun (of any change command) finished it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import Any

import msgpack

from sessionstore.checkpoint.partition.lineage import new_commit_id
from sessionstore.checkpoint.partition.provider import FORMAT, StateStoreProvider
from sessionstore.checkpoint.records.event_time import MissingEventTimeError, durable_event_time
from sessionstore.checkpoint.records.layout import (
    AUDIT_DIR,
    CHANGE_FIELD,
    CHANGELOG_DIR,
    CHANGES_DIR,
    CHECKPOINT_ID_FIELD,
    COMMIT_KEY,
    FILES_DIR,
    IDENTITY_KEY,
    INITIAL_STATE_DIR,
    LAST_COMMIT_KEY,
    SNAPSHOT_DIR,
    VERSION_KEY,
    PartitionFiles,
    changelog_name,
    database_in,
    encode_version,
    event_time_name,
    manifest_name,
    operators,
    read_metadata,
    write_metadata,
)
from sessionstore.checkpoint.records.snapshot import referenced, upload_snapshot
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from sessionstore.encoding.ints import INT64
from sessionstore.engine.db import META_CF
from sessionstore.errors import SessionStoreError
from sessionstore.stores.spec import StoreSpec, record_of_family, refuse_pickle
from sessionstore.stores.state_db import StateDB

__all__ = [
    "CHANGE_FIELD",
    "moved_since",
    "CHANGES_DIR",
    "AUDIT_DIR",
    "DEFAULT_QUIET_S",
    "ChangeError",
    "partition_answers",
    "CheckpointBusyError",
    "FamilyChange",
    "Prepare",
    "ChangeTarget",
    "open_change",
    "check_idle",
    "run_change",
    "begin_change",
    "stage_partition",
    "stage_database",
    "abandon_change",
    "commit_change",
    "finish_change",
    "pending_change",
]

#: A checkpoint whose newest commit is younger than this is taken as held by a
#: running query (seconds).
DEFAULT_QUIET_S = 120.0
_CHUNK = 65_536
#: Meta entries a new commit does not carry over: the copy's identity and the last
#: commit's timings belong to the old local database; version and commit are set.
_LOCAL_META = frozenset({VERSION_KEY, IDENTITY_KEY, LAST_COMMIT_KEY, COMMIT_KEY})

#: ``change(store record, family suffix, rows) -> rows``: what one chunk of raw
#: ``(key, value)`` rows of the column family ``<store>.<suffix>`` becomes.
FamilyChange = Callable[[dict[str, Any], str, list[tuple[bytes, bytes]]], list[tuple[bytes, bytes]]]


#: ``prepare(partition, stores by name)``: called with a partition's stores at the
#: changed version (read-only) before its rows go through the change.
Prepare = Callable[[int, dict[str, Any]], None]


class ChangeError(SessionStoreError, ValueError):
    """A change that cannot be made as asked (nothing visible was written)."""


class CheckpointBusyError(ChangeError):
    """A query seems to hold the checkpoint: it committed recently, or during the change."""


def partition_answers(rows: Iterable[dict[str, Any]], partitions: int) -> list[dict[str, Any]]:
    """The answers of a change's job of one task per partition (dicts with a
    ``partition`` and an ``error``), in partition order: the first error raised as
    a :class:`ChangeError`, and one answer for each of the ``partitions`` asked."""
    answers = sorted(rows, key=lambda r: r["partition"])
    errors = [r["error"] for r in answers if r["error"] is not None]
    if errors:
        raise ChangeError(errors[0])
    if [r["partition"] for r in answers] != list(range(partitions)):
        raise ChangeError(f"the job answered for partitions {[r['partition'] for r in answers]}")
    return answers


@dataclass(frozen=True)
class ChangeTarget:
    """The operator a change rewrites, checked (see :func:`open_change`)."""

    uri: str
    operator: str
    metadata: dict[str, Any]
    partitions: int
    version: int
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    allow_pickle: bool = False
    #: the newest modification time (ns) of a partition's latest changelog or manifest
    newest_ns: int | None = None

    def storage(self) -> Storage:
        """The operator's directory."""
        return open_filesystem(self.uri, self.storage_options).child(self.operator)


def pending_change(operator_storage: Storage) -> dict[str, Any] | None:
    """The committed, not yet applied change of an operator, or None."""
    try:
        return read_metadata(operator_storage).get(CHANGE_FIELD)
    except FileNotFoundError:
        return None


def _stamp(part: Storage, rel: str) -> int | None:
    """The modification time (ns) of the file ``rel`` below ``part``, None if absent."""
    folder, _, name = rel.rpartition("/")
    stamp = part.stamps(folder).get(name)
    return None if stamp is None else stamp[1]


def _latest(storage: Storage, partition: int) -> tuple[int, list[int], int | None]:
    """``(latest, loadable, modification time of the latest's newest object)``."""
    part = storage.child(str(partition))
    files = PartitionFiles(part)
    latest = files.latest()
    if not latest:
        return latest, [], None
    names = (changelog_name(latest), manifest_name(latest))
    stamps = [s for s in (_stamp(part, rel) for rel in names) if s is not None]
    return latest, files.loadable(), max(stamps, default=None)


def open_change(
    uri: str,
    operator: str,
    storage_options: dict[str, Any] | None = None,
    allow_pickle: bool = False,
) -> ChangeTarget:
    """Check that ``operator`` at ``uri`` can be changed and return it. Reads only;
    :class:`ChangeError` names what is wrong."""
    root = open_filesystem(uri, storage_options)
    storage = root.child(operator)
    try:
        metadata = read_metadata(storage)
    except FileNotFoundError:
        known = ", ".join(operators(root)) or "none"
        raise ChangeError(f"no operator {operator!r} in {uri} (operators: {known})") from None
    where = f"{uri}/{operator}"
    if metadata.get("format") != FORMAT:
        raise ChangeError(
            f"{where} has checkpoint format {metadata.get('format')}; this sessionstore "
            f"changes format {FORMAT}"
        )
    refuse_pickle(metadata.get("stores") or [], where, allow_pickle)
    count = metadata.get("num_partitions")
    if not count:
        raise ChangeError(f"{where} records no partition count; run the query once first")
    seen = {p: _latest(storage, p) for p in range(count)}
    versions = {latest for latest, _, _ in seen.values()}
    if len(versions) != 1:
        spread = ", ".join(f"{p}: {v[0]}" for p, v in seen.items())
        raise ChangeError(
            f"the partitions of {where} are not at one version ({spread}): a query is "
            "running, or stopped in the middle of a batch; let it finish a batch first"
        )
    version = versions.pop()
    if version == 0:
        raise ChangeError(f"{where} has no committed version to change")
    for p, (_, loadable, _) in seen.items():
        if version not in loadable:
            raise ChangeError(f"version {version} of {where} is not loadable in partition {p}")
    newest = max((s for _, _, s in seen.values() if s is not None), default=None)
    return ChangeTarget(uri, operator, metadata, count, version, storage_options,
                        allow_pickle, newest)  # fmt: skip


def check_idle(target: ChangeTarget, quiet_s: float, now_ns: int | None = None) -> None:
    """Refuse (:class:`CheckpointBusyError`) when the newest commit of any partition
    is younger than ``quiet_s`` seconds: a query that holds the checkpoint commits
    every micro-batch. A query with a trigger longer than ``quiet_s`` is not seen
    this way; the check before the commit point still stops a change when any
    partition committed meanwhile (docs/rewrite.md)."""
    if target.newest_ns is None:
        return
    now_ns = time.time_ns() if now_ns is None else now_ns
    age = (now_ns - target.newest_ns) / 1e9
    if age < quiet_s:
        raise CheckpointBusyError(
            f"{target.uri}/{target.operator} committed version {target.version} {age:.0f} s "
            f"ago (less than {quiet_s:g} s): a query seems to hold the checkpoint. Stop it "
            "first; --force changes it anyway (see docs/rewrite.md for what that risks)"
        )


# ------------------------------------------------------------------ staging
class _StagedManifest:
    """A partition's storage for :func:`upload_snapshot` that writes the manifest
    to the change's staging folder instead of ``snapshot/``: the content goes
    where the snapshot will use it, and nothing becomes loadable."""

    def __init__(self, partition: Storage, manifest: str, staging: Storage, name: str) -> None:
        self._partition, self._manifest = partition, manifest
        self._staging, self._name = staging, name

    def write_atomic(self, rel: str, data: bytes) -> None:
        if rel == self._manifest:
            self._staging.write_atomic(self._name, data)
        else:
            self._partition.write_atomic(rel, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._partition, name)


def _family_records(target: ChangeTarget, source: Any, where: str) -> dict[str, dict]:
    """Each family of ``source`` but ``meta`` -> the record of its store, in the
    source's order; :class:`ChangeError` for a family of no store of ``target``."""
    records = {r["name"]: r for r in target.metadata["stores"]}
    return {
        family: record_of_family(family, records, where, ChangeError)
        for family in source.column_families()
        if family != META_CF
    }


def _copy_rows(source: Any, out: StateDB, change: FamilyChange, families: dict[str, dict]) -> None:
    for family, record in families.items():
        suffix = family.partition(".")[2]
        out.create_column_family(family)
        rows = source.scan(family)
        while chunk := list(islice(rows, _CHUNK)):
            kept = change(record, suffix, chunk)
            if kept:
                with out.batch():
                    out.bulk_writer(family).update(dict(kept))


def _build_partition(
    target: ChangeTarget,
    partition: int,
    change: FamilyChange,
    workdir: str,
    prepare: Prepare | None,
) -> tuple[str, str]:
    """Build ``partition``'s changed version in ``workdir`` (nothing written to the
    checkpoint); returns ``(its RocksDB checkpoint directory, its commit id)``."""
    specs = [StoreSpec.from_record(r, target.allow_pickle) for r in target.metadata["stores"]]
    where = f"{target.uri}/{target.operator}/{partition}"
    source_dir = os.path.join(workdir, f"source-{partition}")
    provider = StateStoreProvider(
        target.uri, target.operator, partition, specs, source_dir,
        storage_options=target.storage_options,
    )  # fmt: skip
    out_dir = os.path.join(workdir, f"changed-{partition}")
    commit = new_commit_id()
    try:
        handle = provider.get_store(target.version)
        if prepare is not None:  # rows as a reader sees them, in the read-only batch
            prepare(partition, handle.stores)
        handle.abort()  # opening stores may write into the batch: read what is committed
        # every family of the source, each checked for its store before anything
        # is created, then created in the open (one options write for all)
        families = _family_records(target, handle.db, where)
        out = StateDB.open(database_in(out_dir), families=families)
        try:
            _copy_rows(handle.db, out, change, families)
            with out.batch():
                for key, value in handle.db.scan(META_CF):
                    if key not in _LOCAL_META:
                        out.put_meta(key, value)
                out.put_meta(VERSION_KEY, encode_version(target.version))
                out.put_meta(COMMIT_KEY, commit.encode())
            snapshot = os.path.join(out_dir, "snapshot")
            out.checkpoint(snapshot)
        finally:
            out.close()
    finally:
        provider.close()
        shutil.rmtree(source_dir, ignore_errors=True)
    return snapshot, commit


def _stage_partition(
    target: ChangeTarget, partition: int, built: tuple[str, str], change_id: str
) -> str:
    """Stage ``partition``'s built version (step 2): its content uploaded, its
    manifest into the change's folder; returns its commit id."""
    snapshot, commit = built
    storage = target.storage()
    part = storage.child(str(partition))
    staged = _StagedManifest(
        part, manifest_name(target.version),
        storage.child(CHANGES_DIR).child(change_id), f"{partition}.manifest",
    )  # fmt: skip
    upload_snapshot(staged, snapshot, target.version, commit=commit)  # type: ignore[arg-type]
    shutil.rmtree(os.path.dirname(snapshot), ignore_errors=True)
    return commit


def _event_time(target: ChangeTarget) -> int | None:
    """The operator's event time after batch V-1 (what batch V reads), which the
    deleted changelogs of V carried; None when there is none."""
    try:
        return durable_event_time(target.storage(), target.version - 1, target.partitions)
    except MissingEventTimeError:
        return None


def moved_since(target: ChangeTarget) -> str | None:
    """What the checkpoint shows now (``"version V"``, or why it cannot be opened)
    when any partition of ``target`` committed since it was read; None when none did."""
    try:
        again = open_change(target.uri, target.operator, target.storage_options,
                            target.allow_pickle)  # fmt: skip
    except ChangeError as exc:
        return str(exc)
    if (again.version, again.newest_ns) != (target.version, target.newest_ns):
        return f"version {again.version}"
    return None


def _check_unchanged(
    target: ChangeTarget, moved: Callable[[ChangeTarget], str | None] = moved_since
) -> None:
    """Refuse the commit point when any partition committed since ``target`` was read
    (``moved``: what the checkpoint shows instead, None when nothing moved)."""
    seen = moved(target)
    if seen is not None:
        raise CheckpointBusyError(
            f"{target.uri}/{target.operator} was committed to while the change ran (it "
            f"was at version {target.version}, now: {seen}): a query holds the "
            "checkpoint; nothing was changed"
        )


def begin_change(target: ChangeTarget) -> str:
    """A new change id for ``target``, the staging a run that died before its
    commit point left deleted first (step 2 begins). Refused
    (:class:`CheckpointBusyError`) when a change is committed and not applied: it
    was committed after this one was checked, and its staging is what applies it."""
    storage = target.storage()
    pending = pending_change(storage)
    if pending is not None:
        raise CheckpointBusyError(
            f"{target.uri}/{target.operator}: change {pending.get('id')} is committed and "
            "not applied (another command committed it after this one was checked); "
            "nothing was changed: run this command again, which finishes it first"
        )
    for leftover in storage.list_dirs(CHANGES_DIR):
        storage.delete_dir(f"{CHANGES_DIR}/{leftover}")
    return uuid.uuid4().hex


def stage_partition(
    target: ChangeTarget,
    partition: int,
    change: FamilyChange,
    change_id: str,
    prepare: Prepare | None = None,
) -> str:
    """Build and stage one partition of the change ``change_id`` (step 2, for a
    task of a Spark job: one per partition); returns its commit id."""
    with tempfile.TemporaryDirectory(prefix="sessionstore-change-") as workdir:
        built = _build_partition(target, partition, change, workdir, prepare)
        return _stage_partition(target, partition, built, change_id)


def stage_database(
    target: ChangeTarget, partition: int, snapshot_dir: str, commit: str, change_id: str
) -> str:
    """Stage ``partition``'s new version of the change ``change_id`` from a RocksDB
    checkpoint directory built elsewhere (a bootstrap builds it from rows, not from
    the version before; ``snapshot_dir`` records version ``target.version`` and
    ``commit``, and its parent folder is removed); returns ``commit``."""
    return _stage_partition(target, partition, (snapshot_dir, commit), change_id)


def abandon_change(target: ChangeTarget, change_id: str) -> None:
    """Delete the staging of a change that stops before its commit point."""
    target.storage().delete_dir(f"{CHANGES_DIR}/{change_id}")


def commit_change(
    target: ChangeTarget,
    change_id: str,
    commits: list[str],
    audit: dict[str, Any],
    moved: Callable[[ChangeTarget], str | None] = moved_since,
) -> dict[str, Any]:
    """Commit (step 3) and apply (step 4) the change ``change_id`` whose
    partitions are staged with ``commits``; returns its record. Abandoned (and
    :class:`CheckpointBusyError`) when a partition committed since ``target`` was
    read (``moved``, by default :func:`moved_since`, says what it shows instead)."""
    try:
        _check_unchanged(target, moved)
    except BaseException:
        abandon_change(target, change_id)
        raise
    staged = target.storage().child(CHANGES_DIR).child(change_id)
    missing = [p for p in range(target.partitions) if not staged.exists(f"{p}.manifest")]
    if missing:
        # another change's begin deleted this one's staging (two changes at once):
        # committing would name manifests that are gone and block the operator
        raise ChangeError(
            f"change {change_id} of {target.uri}/{target.operator} lost its staged "
            f"partitions {missing[:5]} (another change ran at the same time); "
            "nothing was committed: run it again"
        )
    record = {
        "id": change_id,
        "version": target.version,
        "partitions": target.partitions,
        "commits": commits,
        "event_time": _event_time(target),
        "time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "audit": audit,
    }
    storage = target.storage()
    write_metadata(storage, {**target.metadata, CHANGE_FIELD: record})  # the commit point
    finish_change(storage, record)
    return record


def run_change(
    target: ChangeTarget,
    change: FamilyChange,
    audit: dict[str, Any],
    progress: Callable[[str, int, int], None] | None = None,
    prepare: Prepare | None = None,
) -> dict[str, Any]:
    """Stage, commit and apply ``change`` to every partition of ``target`` (steps
    2-4; :func:`open_change` and :func:`check_idle` first). ``audit`` (no user data:
    counts and hashes) is recorded with the change. Returns the change record.

    Every partition is built locally before anything is uploaded, so a change that
    raises (a rewrite's refused row) writes nothing to the checkpoint. ``prepare``
    sees each partition's stores before its rows are copied."""
    report = progress or (lambda label, done, total: None)
    change_id = begin_change(target)
    commits = []
    try:
        with tempfile.TemporaryDirectory(prefix="sessionstore-change-") as workdir:
            built = []
            for p in range(target.partitions):
                report("partitions", p, target.partitions)
                built.append(_build_partition(target, p, change, workdir, prepare))
            for p, done in enumerate(built):
                commits.append(_stage_partition(target, p, done, change_id))
            report("partitions", target.partitions, target.partitions)
    except BaseException:
        abandon_change(target, change_id)
        raise
    return commit_change(target, change_id, commits, audit)


def _apply_partition(storage: Storage, record: dict[str, Any], partition: int) -> None:
    version = record["version"]
    part = storage.child(str(partition))
    staged = storage.child(CHANGES_DIR).child(record["id"]).read(f"{partition}.manifest")
    part.write_atomic(manifest_name(version), staged)
    part.delete_dir(CHANGELOG_DIR)
    for name in part.list(SNAPSHOT_DIR):
        if name != manifest_name(version).split("/")[-1]:
            part.delete(f"{SNAPSHOT_DIR}/{name}")
    used = referenced(msgpack.unpackb(staged, raw=False))
    for name in part.list(FILES_DIR):
        if name not in used:
            part.delete(f"{FILES_DIR}/{name}")
    if record.get("event_time") is not None:
        storage.write_atomic(
            event_time_name(version - 1, partition), INT64.pack(record["event_time"])
        )


def finish_change(storage: Storage, record: dict[str, Any]) -> None:
    """Apply the committed change ``record`` to the operator at ``storage`` (step 4;
    idempotent: a rerun after a crash repeats what was done and finishes)."""
    for partition in range(record["partitions"]):
        _apply_partition(storage, record, partition)
    # a transform_with_state initial state copy holds rows of the old state
    storage.delete_dir(INITIAL_STATE_DIR)
    stamp = record["time"].replace(":", "").replace("-", "").replace(".", "")
    audit = {k: record[k] for k in ("id", "time", "version")} | record["audit"]
    storage.write_atomic(
        f"{AUDIT_DIR}/{stamp}-{record['id']}.json", json.dumps(audit, sort_keys=True).encode()
    )
    metadata = read_metadata(storage)
    metadata.pop(CHANGE_FIELD, None)
    metadata[CHECKPOINT_ID_FIELD] = uuid.uuid4().hex
    write_metadata(storage, metadata)
    storage.delete_dir(f"{CHANGES_DIR}/{record['id']}")
