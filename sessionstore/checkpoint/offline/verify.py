"""Checking a checkpoint: everything ``sessionstore verify`` reports.

For each partition: every changelog from the oldest snapshot to the latest version
exists (no gap) and passes its checksums, every snapshot downloads with every
file's hash right, and (when the changelogs are sound) the latest version loads,
replayed into a temporary directory, as a new executor would load it: around an
unusable snapshot when older data allows, which is reported as a repair.
Nothing is written to the checkpoint.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sessionstore.checkpoint.partition.provider import StateStoreProvider
from sessionstore.checkpoint.records.changelog import fetch_changelog
from sessionstore.checkpoint.records.generation import state_root
from sessionstore.checkpoint.records.layout import (
    PartitionFiles,
    operators,
    partitions,
    read_changelog_file,
    read_metadata,
)
from sessionstore.checkpoint.records.snapshot import download_snapshot
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from sessionstore.errors import SessionStoreError
from sessionstore.stores.spec import StoreSpec, refuse_pickle

__all__ = ["Verification", "verify_checkpoint", "verify_partition"]

#: ``progress(label, done, total)``: called as long operations advance.
Progress = Callable[[str, int, int], None]


@dataclass
class Verification:
    """What :func:`verify_checkpoint` checked and found."""

    operators: list[str]
    partitions: int = 0
    problems: list[str] = field(default_factory=list)
    #: latest versions that load only by a repair (an older snapshot or version 0
    #: plus the changelogs, around an unusable snapshot), one sentence each
    repairs: list[str] = field(default_factory=list)


def verify_checkpoint(
    checkpoint_uri: str,
    operator_ids: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    allow_pickle: bool = False,
) -> Verification:
    """Check every partition of ``operator_ids`` (default: every operator) of the
    checkpoint at ``checkpoint_uri``. An operator with a pickled store is refused
    before anything is read unless ``allow_pickle``
    (:func:`~sessionstore.stores.spec.refuse_pickle`): the replay opens its stores."""
    root = open_filesystem(checkpoint_uri, storage_options)
    result = Verification(operators(root) if operator_ids is None else list(operator_ids))
    for operator in result.operators:
        try:
            stores = read_metadata(root.child(operator))["stores"]
        except FileNotFoundError:
            continue  # reported by the partitions' checks
        refuse_pickle(stores, f"{checkpoint_uri}/{operator}", allow_pickle)
    for operator in result.operators:
        # the state a rescale on restart moved into a generation is checked there
        state_uri = state_root(checkpoint_uri, operator, storage_options)
        state = root if state_uri == checkpoint_uri else open_filesystem(state_uri, storage_options)
        for partition in partitions(state, operator):
            result.problems += verify_partition(
                state_uri, operator, partition, storage_options, progress, state,
                # each replay decides again from the metadata it reads itself
                allow_pickle=allow_pickle,
                repairs=result.repairs,
            )  # fmt: skip
            result.partitions += 1
    return result


def verify_partition(
    checkpoint_uri: str,
    operator: str,
    partition: int,
    storage_options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    root: Storage | None = None,
    allow_pickle: bool = False,
    repairs: list[str] | None = None,
) -> list[str]:
    """Everything wrong with one partition's checkpoint (empty when it is sound),
    one sentence per problem, naming the partition as ``<operator>/<partition>``.
    A pickled store is refused unless ``allow_pickle`` (see verify_checkpoint); a
    latest version that loads only by a repair is appended to ``repairs``."""
    root = root or open_filesystem(checkpoint_uri, storage_options)
    where = f"{operator}/{partition}"
    files = PartitionFiles(root.child(where))
    changelogs, snapshots = files.changelogs(), files.snapshots()
    problems = []
    latest = max(changelogs | snapshots, default=0)
    base = min(snapshots, default=0)
    for v in range(base + 1, latest + 1):
        if v not in changelogs and v not in snapshots:
            problems.append(f"{where}: changelog of version {v} is missing (gap after {v - 1})")
    for i, v in enumerate(sorted(changelogs)):
        if progress is not None:
            progress(f"{where} changelogs", i, len(changelogs))
        try:  # named as it is stored; a large one read a share at a time
            with tempfile.TemporaryDirectory(prefix="sessionstore-verify-") as spool:
                changelog = read_changelog_file(
                    lambda n, v=v: fetch_changelog(files.storage, n, f"{where}/{n}", v, spool), v
                )
                with changelog:
                    for _ in changelog.writes():
                        pass
        except SessionStoreError as exc:
            problems.append(str(exc))
    sound_changelogs = not problems
    for v in sorted(snapshots):
        with tempfile.TemporaryDirectory(prefix="sessionstore-verify-") as tmp:
            try:
                download_snapshot(files.storage, v, tmp)
            except (SessionStoreError, FileNotFoundError) as exc:
                problems.append(str(exc))
    if sound_changelogs and latest:
        try:
            repaired = _load(
                checkpoint_uri, root, operator, partition, latest, storage_options, progress,
                allow_pickle,
            )  # fmt: skip
        except (SessionStoreError, FileNotFoundError) as exc:
            if not any(str(exc) in p for p in problems):  # each damage named once
                problems.append(f"{where}: replay to version {latest} failed: {exc}")
        else:
            if repairs is not None:
                repairs += [
                    f"{where}: version {latest} loads only by a repair: {r}" for r in repaired
                ]
    return problems


def _load(
    checkpoint_uri: str,
    root: Storage,
    operator: str,
    partition: int,
    version: int,
    storage_options: dict[str, Any] | None,
    progress: Progress | None,
    allow_pickle: bool,
) -> list[str]:
    """Load ``version`` of a partition, with the stores its metadata records, into a
    temporary directory (a restore and replay, as a new executor would do); the
    repairs that took."""
    records = read_metadata(root.child(operator))["stores"]
    specs = [
        StoreSpec.from_record(r, allow_pickle, f"{checkpoint_uri}/{operator}") for r in records
    ]
    with tempfile.TemporaryDirectory(prefix="sessionstore-verify-") as workdir:
        provider = StateStoreProvider(
            checkpoint_uri, operator, partition, specs, workdir,
            storage_options=storage_options, progress=progress,
        )  # fmt: skip
        try:
            provider.get_store(version)
            return list(provider.repairs)
        finally:
            provider.close()
