"""The rescale's copy of a checkpoint whose last batch Spark may run again.

Spark replays batch V-1 when its driver died after every partition committed
version V but before Spark recorded the batch in its commit log: the replay
loads version V-1 and commits V again. A rescale of version V therefore writes
each target partition as a run at the new count would have left it: the snapshot
of version V-1 (the rescaled V-1, commit P), changelog V (commit X built on P:
the rows that differ between the rescaled V-1 and the rescaled V) and the
snapshot of V (commit X). A query that continues loads V from its snapshot; a
replay loads V-1 and, committing V, meets changelog V built on the same parent
and adopts it (lineage.py), exactly as after such a crash without a rescale. Both ids are derived from the target
partition's location, so two attempts of one target task write the same objects.

A version V-1 that some source partition can no longer load (its changelogs
pruned) leaves the copy of V alone: a snapshot of V, with nothing to replay.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sessionstore.checkpoint.offline.repartition import (
    RepartitionError,
    RepartitionPlan,
    TargetWriter,
    plan_repartition,
)
from sessionstore.checkpoint.partition.lineage import COMMIT_FIELD, PARENT_FIELD
from sessionstore.checkpoint.records.changelog import encode_changelog
from sessionstore.checkpoint.records.deadlines import DUE_PROCESSING_FIELD
from sessionstore.checkpoint.records.event_time import (
    EVENT_TIME_FIELD,
    MissingEventTimeError,
    durable_event_time,
)
from sessionstore.checkpoint.records.layout import changelog_name
from sessionstore.engine.write_buffer import WriteBuffer
from sessionstore.stores.state_db import StateDB

__all__ = ["ReplayBase", "plan_replay_base", "write_replayable"]


@dataclass(frozen=True)
class ReplayBase:
    """The copy of version V-1 beside a copy of V; picklable."""

    #: the copy of version V-1 (version 0: the empty state, no row to route)
    plan: RepartitionPlan
    #: the operator's shared event time after batch V-1 (changelog V's header)
    event_time: int | None


def plan_replay_base(copy: RepartitionPlan) -> ReplayBase | None:
    """The copy of version ``copy.version - 1`` into ``copy``'s target, None when a
    source partition cannot load that version any more. Reads only."""
    base = copy.version - 1
    if base == 0:
        plan = dataclasses.replace(copy, version=0)
    else:
        try:
            plan = plan_repartition(
                copy.source_uri, copy.operator, copy.partitions, copy.target_uri,
                version=base, key_types=list(copy.key_types),
                storage_options=copy.storage_options,
                target_storage_options=copy.target_storage_options,
                allow_pickle=copy.allow_pickle,
            )  # fmt: skip
        except RepartitionError:
            return None  # V-1 pruned somewhere: no replay to serve
    try:
        shared = durable_event_time(copy.source(), copy.version - 1, copy.source_partitions)
    except MissingEventTimeError:
        shared = None
    return ReplayBase(plan, shared)


def _commit_id(plan: RepartitionPlan, partition: int) -> str:
    """The id of the commit of ``plan.version`` in target ``partition``: the same
    for every attempt of the task that writes it."""
    where = f"{plan.target_uri}/{plan.operator}/{partition}@{plan.version}"
    return uuid.uuid5(uuid.NAMESPACE_URL, where).hex


def write_replayable(
    base: TargetWriter, head: TargetWriter, event_time: int | None
) -> dict[str, Any]:
    """Write one target partition from its writer of version V-1 (``base``) and of
    V (``head``): the snapshot of V-1 (none for version 0, the empty state),
    changelog V, and the snapshot of V (its manifest naming changelog V's commit).
    Returns ``{"partition", "rows"}`` (the rows of V)."""
    plan, partition = head.plan, head.partition
    parent = _commit_id(base.plan, partition) if base.plan.version else None
    commit = _commit_id(plan, partition)
    changes = _changes(base.seal(parent), head.seal(commit))
    fields = {
        COMMIT_FIELD: commit,
        PARENT_FIELD: parent,
        EVENT_TIME_FIELD: event_time,
        DUE_PROCESSING_FIELD: 0,  # no deadline recorded: due at once, as a snapshot
    }
    data = encode_changelog(changes, plan.operator, partition, plan.version, fields=fields)
    if base.plan.version:
        base.upload(parent)
    else:
        base.close()
    # after the snapshot it continues: a changelog of V is never without its base
    plan.target().child(str(partition)).write_atomic(changelog_name(plan.version), data)
    return head.upload(commit)  # and V itself, the snapshot a continuing query loads


def _changes(old: StateDB, new: StateDB) -> WriteBuffer:
    """The writes that bring ``old`` to ``new``: families created and dropped,
    rows put and deleted (both scanned once, in key order)."""
    buf = WriteBuffer()
    before, after = set(old.column_families()), set(new.column_families())
    buf.created = sorted(after - before)
    buf.dropped = sorted(before - after)
    for family in sorted(after):
        rows = old.scan(family) if family in before else iter(())
        entries = dict(_differences(rows, new.scan(family)))
        if entries:
            buf.family_for_bulk_write(family).update(entries)
    return buf


def _differences(
    old: Iterator[tuple[bytes, bytes]], new: Iterator[tuple[bytes, bytes]]
) -> Iterator[tuple[bytes, bytes | None]]:
    """``(key, value)`` for every row of ``new`` that ``old`` lacks or holds with
    another value, ``(key, None)`` for every row only ``old`` has; both sorted."""
    end = (None, None)
    a, b = next(old, end), next(new, end)
    while a[0] is not None or b[0] is not None:
        if b[0] is None or (a[0] is not None and a[0] < b[0]):
            yield a[0], None
            a = next(old, end)
        elif a[0] is None or b[0] < a[0]:
            yield b
            b = next(new, end)
        else:
            if a[1] != b[1]:
                yield b
            a, b = next(old, end), next(new, end)
