"""Bootstrapping an operator: its version 0 built from a history, before its first
micro-batch, as an offline change (change.py) of a checkpoint without state.

A query started on a fresh Spark checkpoint runs batch 0, which loads version 0 of
each partition and reads the shared event time "after batch -1". A bootstrap
therefore makes the history **batch -1**: each partition's state after the history
(built by the operator's own task, elsewhere) becomes that partition's version 0,
a snapshot (load.py restores version 0 from it), and the largest event time of
the history is recorded in ``_metadata`` (:data:`BOOTSTRAP_FIELD`), which batch 0
reads instead of "none" (``StateStoreProvider.initial_event_time``).

It commits as every offline change does: each partition's database staged as a
snapshot under ``_changes/<id>``, then ``_metadata`` written with the change record
(the commit point: from then on every provider refuses the operator until it is
applied), then applied (manifests in place, a new checkpoint id). A crash before
the commit point leaves the checkpoint without state (the staging is deleted by
the next run), after it :func:`finish_pending` finishes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import msgpack

from sessionstore.checkpoint.offline.change import (
    DEFAULT_QUIET_S,
    ChangeError,
    ChangeTarget,
    CheckpointBusyError,
    abandon_change,
    check_idle,
    commit_change,
    finish_change,
    open_change,
    pending_change,
)
from sessionstore.checkpoint.partition.lineage import new_commit_id
from sessionstore.checkpoint.records.layout import (
    BOOTSTRAP_FIELD,
    CHANGE_FIELD,
    CHANGES_DIR,
    CHECKPOINT_ID_FIELD,
    COMMIT_KEY,
    IDENTITY_KEY,
    KEY_GROUPS_FIELD,
    KEY_TYPES_FIELD,
    LAST_COMMIT_KEY,
    METADATA,
    VERSION_KEY,
    PartitionFiles,
    encode_version,
    read_metadata,
)
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.stores.state_db import StateDB

__all__ = [
    "BOOTSTRAP_KIND",
    "open_bootstrap",
    "finish_pending",
    "committed_state",
    "version_zero",
    "check_metadata",
    "commit_bootstrap",
    "moved_since_open",
    "check_staged",
]

#: The ``kind`` of a bootstrap's audit record.
BOOTSTRAP_KIND = "bootstrap"
#: The ``_metadata`` fields a bootstrap and the query must agree on.
_SHAPE = ("format", "operator_id", "num_partitions", "stores", KEY_TYPES_FIELD, KEY_GROUPS_FIELD)


def committed_state(target: ChangeTarget) -> str | None:
    """What committed state the operator of ``target`` holds (``"partition 1 is at
    version 3"``), None when none of its partitions holds any."""
    storage = target.storage()
    for p in range(target.partitions):
        files = PartitionFiles(storage.child(str(p)))
        latest = files.latest()
        if latest or 0 in files.snapshots():
            return f"partition {p} is at version {latest}"
    return None


def finish_pending(
    uri: str, operator: str, storage_options: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """Apply the change the operator's ``_metadata`` records as committed but not
    applied (a bootstrap, or any change, killed after its commit point); its
    record, None when there was none."""
    storage = open_filesystem(uri, storage_options).child(operator)
    record = pending_change(storage)
    if record is not None:
        finish_change(storage, record)
    return record


def open_bootstrap(
    uri: str,
    operator: str,
    partitions: int,
    storage_options: dict[str, Any] | None = None,
    quiet_s: float = DEFAULT_QUIET_S,
) -> ChangeTarget:
    """The operator ``operator`` of ``partitions`` partitions at ``uri``, checked to
    be bootstrappable: no partition holds committed state (a query that holds the
    checkpoint commits: :class:`~sessionstore.checkpoint.offline.change.CheckpointBusyError`
    while its last commit is younger than ``quiet_s``), not bootstrapped already.
    Reads only; :class:`ChangeError` names what is wrong."""
    storage = open_filesystem(uri, storage_options).child(operator)
    where = f"{uri}/{operator}"
    try:
        recorded = read_metadata(storage)
    except FileNotFoundError:
        recorded = {}
    count = max(partitions, recorded.get("num_partitions") or 0)
    # the _metadata read here: the commit point refuses one written since (moved_since_open)
    target = ChangeTarget(uri, operator, recorded, count, 0, storage_options)
    held = committed_state(target)
    if held is not None:
        latest = {PartitionFiles(storage.child(str(p))).latest() for p in range(count)}
        if len(latest) > 1:
            raise CheckpointBusyError(
                f"{where} holds committed state at versions {sorted(latest)}: a query is "
                "running, or stopped in the middle of a batch"
            )
        if max(latest) > 0:  # a query's commits: a recent one says it holds the checkpoint
            check_idle(open_change(uri, operator, storage_options), quiet_s)
        raise ChangeError(
            f"{where} already holds committed state ({held}): a bootstrap builds an "
            "operator's state before its first micro-batch. Use a new checkpoint location "
            "(or operator name), or delete this one first"
        )
    if recorded.get(BOOTSTRAP_FIELD) is not None:
        raise ChangeError(f"{where} was bootstrapped already ({recorded[BOOTSTRAP_FIELD]})")
    return replace(target, partitions=partitions)


def version_zero(db_path: str, out_dir: str) -> tuple[str, str]:
    """Make the local database at ``db_path`` (a partition's state after the
    history, at whatever version its scratch checkpoint gave it) version 0 of a new
    commit, and take its RocksDB checkpoint into ``out_dir/snapshot`` (for
    :func:`~sessionstore.checkpoint.offline.change.stage_database`). Returns
    ``(snapshot directory, commit id)``."""
    commit = new_commit_id()
    db = StateDB.open(db_path)
    try:
        with db.batch():
            db.put_meta(VERSION_KEY, encode_version(0))
            db.put_meta(COMMIT_KEY, commit.encode("ascii"))
            # the scratch copy's owner and timings belong to no checkpoint
            db.put_meta(IDENTITY_KEY, None)
            db.put_meta(LAST_COMMIT_KEY, None)
        os.makedirs(out_dir, exist_ok=True)
        snapshot = os.path.join(out_dir, "snapshot")
        db.checkpoint(snapshot)
    finally:
        db.close()
    return snapshot, commit


def check_metadata(target: ChangeTarget, metadata: dict[str, Any]) -> dict[str, Any]:
    """The ``_metadata`` the bootstrap commits: ``metadata`` (what the operator's
    task records, its checkpoint id dropped), refused (:class:`ChangeError`, naming
    the field and both values) where a ``_metadata`` already at the checkpoint
    records another shape."""
    wanted = {k: v for k, v in metadata.items() if k != CHECKPOINT_ID_FIELD}
    try:
        recorded = read_metadata(target.storage())
    except FileNotFoundError:
        return wanted
    for name in _SHAPE:
        if recorded.get(name) is not None and recorded.get(name) != wanted.get(name):
            raise ChangeError(
                f"{target.uri}/{target.operator}/{METADATA} records {name} "
                f"{recorded.get(name)!r}, but the bootstrapped operator has "
                f"{wanted.get(name)!r}: bootstrap with the query's own arguments, or into "
                "a new checkpoint location"
            )
    return {**{k: v for k, v in recorded.items() if k != CHECKPOINT_ID_FIELD}, **wanted}


def moved_since_open(seen: dict[str, Any]) -> Callable[[ChangeTarget], str | None]:
    """What the operator shows, at the commit point, that it did not when
    :func:`open_bootstrap` read ``_metadata`` as ``seen`` (None: nothing): committed
    state, a change another command committed, or a ``_metadata`` written since (a
    query started on the location: its partitions write it before they load the
    empty version 0 and commit on top of it)."""

    def moved(target: ChangeTarget) -> str | None:
        held = committed_state(target)
        if held is not None:
            return held
        try:
            now = read_metadata(target.storage())
        except FileNotFoundError:
            now = {}
        change = now.get(CHANGE_FIELD)
        if change is not None:
            return f"committed change {change.get('id')}, not applied"
        if now.get(BOOTSTRAP_FIELD) is not None:
            return f"bootstrapped by another run ({now[BOOTSTRAP_FIELD]})"
        if now.get(CHECKPOINT_ID_FIELD) != seen.get(CHECKPOINT_ID_FIELD):
            return (
                f"its {METADATA} was written by a query that started on it (checkpoint id "
                f"{seen.get(CHECKPOINT_ID_FIELD)} then, {now.get(CHECKPOINT_ID_FIELD)} now)"
            )
        return None

    return moved


def check_staged(target: ChangeTarget, change_id: str, commits: list[str]) -> None:
    """Refuse (:class:`ChangeError`) a staging whose manifest of a partition names
    another commit than ``commits`` (what the tasks whose output Spark used
    staged): another attempt of that task (speculative, or a zombie) staged after
    it. A partition not staged at all is left to the commit's own check."""
    staged = target.storage().child(CHANGES_DIR).child(change_id)
    for p, commit in enumerate(commits):
        try:
            manifest = msgpack.unpackb(staged.read(f"{p}.manifest"), raw=False)
        except FileNotFoundError:
            continue
        found = manifest.get("commit") if isinstance(manifest, dict) else None
        if found != commit:
            raise ChangeError(
                f"bootstrap {change_id} of {target.uri}/{target.operator}: partition {p} "
                f"was staged by another attempt (commit {found}) than the one whose output "
                f"was used (commit {commit}); nothing was committed: run it again"
            )


def commit_bootstrap(
    target: ChangeTarget,
    change_id: str,
    commits: list[str],
    metadata: dict[str, Any],
    event_time: int | None,
    audit: dict[str, Any],
) -> dict[str, Any]:
    """Commit and apply the bootstrap ``change_id`` whose partitions are staged
    with ``commits``: ``_metadata`` becomes ``metadata`` with the bootstrap record
    (the history's ``event_time``, which batch 0 starts from, and ``commits``).
    Abandoned when the operator moved since ``target`` was checked
    (:func:`moved_since_open`: a query or another bootstrap started meanwhile), or
    when a partition's staging is not the commit given (:func:`check_staged`)."""
    moved = moved_since_open(target.metadata)
    try:
        check_staged(target, change_id, commits)
    except BaseException:
        abandon_change(target, change_id)
        raise
    # the commits: a load of version 0 refuses a snapshot that holds another one
    record = {"event_time": event_time, "change": change_id, "commits": list(commits)}
    target = replace(target, metadata={**metadata, BOOTSTRAP_FIELD: record})
    audit = {"kind": BOOTSTRAP_KIND, **audit}
    return commit_change(target, change_id, commits, audit, moved=moved)
