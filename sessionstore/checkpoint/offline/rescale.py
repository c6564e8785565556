"""Rescale on restart: a query restarted with another partition count moves its
operator's state to the new count before its first batch, in place.

The state of a checkpoint lives in its *state root*: the checkpoint root itself
for a checkpoint never rescaled, else a *generation*
``<root>/<operator>/_generations/<id>``, itself a complete checkpoint root in the
usual layout (its own ``<operator>/_metadata``, partitions, event-time files).
The operator's ``_metadata`` at the checkpoint root stays the one object a query
reads first: after a rescale it is a copy of the generation's, plus
:data:`GENERATION_FIELD` naming it.

A rescale (:func:`plan_rescale`, the distributed copy of
:mod:`~sessionstore.checkpoint.offline.repartition` into a new generation,
:func:`commit_rescale`) writes nothing but the new generation until its last
step, which replaces that one ``_metadata`` (an atomic write): a crash before it
leaves the old count loading exactly what it loaded (the half-written
generation is never read, and the next attempt writes another), a crash after it
leaves the new one. Right after the switch the previous state is fenced
(fencing.py: a query of the old count still running cannot commit to it), and
only then deleted, but for its fences (:func:`drop_state`). The generation also
holds the version before, which a batch Spark replays loads (replayable.py).
The new generation has its own checkpoint id, so no local database or pending
snapshot of the old state is ever taken for it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sessionstore.checkpoint.offline.change import (
    ChangeError,
    ChangeTarget,
    moved_since,
    open_change,
)
from sessionstore.checkpoint.offline.fencing import (
    drop_fenced_state,
    fence_state,
    fenced_state_reduced,
    unfence_state,
)
from sessionstore.checkpoint.offline.repartition import (
    RepartitionError,
    RepartitionPlan,
    TargetWriter,
    carry_event_time,
    finish_repartition,
    plan_repartition,
    routed_rows,
)
from sessionstore.checkpoint.offline.replayable import (
    ReplayBase,
    plan_replay_base,
    write_replayable,
)
from sessionstore.checkpoint.partition.identity import CheckpointMismatchError, layout_of
from sessionstore.checkpoint.records.generation import (
    GENERATION_FIELD,
    GENERATION_FORMAT,
    GENERATIONS_DIR,
    generation_root,
    is_generation_name,
    state_root,
)
from sessionstore.checkpoint.records.layout import (
    CHANGE_FIELD,
    EVENT_TIME_DIR,
    read_metadata,
    write_metadata,
)
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from sessionstore.errors import SessionStoreError

__all__ = [
    "RescaleError",
    "RescalePlan",
    "plan_rescale",
    "commit_rescale",
    "drop_state",
    "resume_rescale",
    "FENCE_FIELD",
    "copy_rescale",
    "source_rows",
    "write_targets",
]


log = logging.getLogger(__name__)

#: In the switch (the root's ``_metadata``): the state it replaced, to fence
#: (``{"root", "partitions", "version", "previous"}``, ``previous`` the root's
#: ``_metadata`` before, which a switch taken back restores), so that a start after
#: a crash between the switch and the fences finishes them (:func:`resume_rescale`).
FENCE_FIELD = "fence"


class RescaleError(SessionStoreError, ValueError):
    """A rescale on restart that cannot be done; the checkpoint is unchanged."""


@dataclass(frozen=True)
class RescalePlan:
    """A checked rescale; picklable (its :attr:`copy` ships to Spark tasks)."""

    uri: str
    operator: str
    generation: str
    #: the state as read before the copy (its version and newest commit's time)
    source: ChangeTarget
    #: the copy of the state into the new generation
    copy: RepartitionPlan
    #: the copy of the version before, which a replay of the last batch loads
    #: (replayable.py); None when a source partition no longer has it
    base: ReplayBase | None = None
    storage_options: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def source_root(self) -> str:
        """The checkpoint root of the state being rescaled."""
        return self.source.uri


def plan_rescale(
    uri: str,
    operator: str,
    partitions: int,
    storage_options: dict[str, Any] | None = None,
    allow_pickle: bool = False,
    key_groups: int | None = None,
) -> RescalePlan:
    """Check a rescale of ``operator``'s checkpoint at ``uri`` to ``partitions``
    databases (``key_groups`` partitions in them when given: identity.py) and
    return its plan. Reads only; :class:`RescaleError` says why it cannot be
    done: an offline change is half applied, a partition is at another version
    than the others (a query is running, or stopped in the middle of a batch), the
    key columns' types are not recorded, a store is pickled without opt-in, or the
    format is not this release's."""
    where = f"{uri}/{operator}"
    shape = (
        f"{partitions} partitions" if key_groups in (None, partitions)
        else f"{key_groups} partitions in {partitions} databases"
    )  # fmt: skip
    what = f"cannot rescale {where} to {shape} on restart"
    try:
        metadata = read_metadata(open_filesystem(uri, storage_options).child(operator))
        root = state_root(uri, operator, storage_options, metadata)
        if root != uri:  # a change of a rescaled checkpoint is recorded in its generation
            metadata = read_metadata(open_filesystem(root, storage_options).child(operator))
        if metadata.get(CHANGE_FIELD) is not None:
            raise ChangeError(
                "an offline change is committed but not applied; finish it first "
                "(sessionstore change --resume, docs/rewrite.md)"
            )
        source = open_change(root, operator, storage_options, allow_pickle)
        generation = uuid.uuid4().hex
        copy = plan_repartition(
            root, operator, partitions, generation_root(uri, operator, generation),
            version=source.version, storage_options=storage_options, allow_pickle=allow_pickle,
            key_groups=key_groups,
        )  # fmt: skip
        base = plan_replay_base(copy)
    except (ChangeError, RepartitionError, FileNotFoundError) as exc:
        raise RescaleError(f"{what}: {exc}; the checkpoint is unchanged") from None
    return RescalePlan(uri, operator, generation, source, copy, base, storage_options)


def write_targets(
    plan: RescalePlan, rows: Iterator[tuple[bool, int, str, bytes, bytes]], workdir: str
) -> list[dict[str, Any]]:
    """Write the target partitions of the new generation whose routed rows
    ``(of the version before, target, family, key, value)`` are given (the rows of
    each such target, all of them); returns ``{"partition", "rows"}`` of each."""
    heads: dict[int, TargetWriter] = {}
    bases: dict[int, TargetWriter] = {}
    base = plan.base
    try:
        for before, target, family, key, value in rows:
            writers, copy = (bases, base.plan) if before and base else (heads, plan.copy)
            writer = writers.get(target)
            if writer is None:
                where = os.path.join(workdir, "base" if writers is bases else "head")
                writer = writers[target] = TargetWriter(copy, target, where)
            writer.add(family, key, value)
        if base is None:
            return [heads[t].finish() for t in sorted(heads)]
        done = []
        for target in sorted(heads):
            if target not in bases:  # version 0: the empty state
                bases[target] = TargetWriter(base.plan, target, os.path.join(workdir, "base"))
            done.append(write_replayable(bases[target], heads[target], base.event_time))
        return done
    finally:
        for writer in [*heads.values(), *bases.values()]:
            writer.close()


def source_rows(
    plan: RescalePlan, source: int, workdir: str
) -> Iterator[tuple[bool, int, str, bytes, bytes]]:
    """Every routed row of source partition ``source``: of the version before (when
    the plan copies it, and it is not the empty version 0), then of the version."""
    base = plan.base
    if base is not None and base.plan.version:
        for row in routed_rows(base.plan, source, workdir):
            yield (True, *row)
    for row in routed_rows(plan.copy, source, workdir):
        yield (False, *row)


def copy_rescale(plan: RescalePlan) -> int:
    """Write the new generation in this process (as the Spark job does in tasks):
    every source partition's rows, then every target; returns the rows written."""
    with tempfile.TemporaryDirectory(prefix="sessionstore-rescale-") as workdir:
        sources = os.path.join(workdir, "source")
        rows = (
            row for s in range(plan.copy.source_partitions) for row in source_rows(plan, s, sources)
        )
        done = write_targets(plan, rows, workdir)
    return sum(d["rows"] for d in done)


def commit_rescale(plan: RescalePlan) -> int | None:
    """After every partition of the new generation is written: its event time and
    ``_metadata``, then the switch, the operator's root ``_metadata`` naming the
    generation. Refused (:class:`RescaleError`, nothing switched) when a partition
    committed to the old state meanwhile. Returns the carried event time."""
    if plan.base is not None and plan.base.plan.version:
        carry_event_time(plan.base.plan)  # what a replay of batch V-1 reads
    shared, _ = finish_repartition(plan.copy)
    before = plan.source
    seen = moved_since(before)
    if seen is not None:
        raise RescaleError(
            f"{before.uri}/{plan.operator} was committed to while it was rescaled (it was "
            f"at version {before.version}, now: {seen}): another query holds the "
            "checkpoint; stop it first. Nothing was switched"
        )
    root = open_filesystem(plan.uri, plan.storage_options).child(plan.operator)
    plan = _claim(root, plan)
    previous = read_metadata(root)
    if previous.get(GENERATION_FIELD) == plan.generation and FENCE_FIELD in previous:
        fence = previous[FENCE_FIELD]  # the adopted rescale switched already
        _check_own(plan.uri, plan.operator, fence)
    else:
        target = open_filesystem(plan.copy.target_uri, plan.storage_options)
        fence = {
            "root": plan.source_root,
            "partitions": plan.copy.source_partitions,
            "version": plan.copy.version + 1,
            "previous": {k: v for k, v in previous.items() if k != FENCE_FIELD},
        }
        switch = {
            **read_metadata(target.child(plan.operator)),
            GENERATION_FIELD: plan.generation,
            "format": GENERATION_FORMAT,
            FENCE_FIELD: fence,
        }
        write_metadata(root, switch)  # the switch
    _fence(root, plan.operator, plan.generation, fence, plan.storage_options)
    return shared


def resume_rescale(uri: str, operator: str, storage_options: dict[str, Any] | None = None) -> bool:
    """At a start: finish the fences and the cleanup of a rescale that switched
    ``operator``'s checkpoint at ``uri`` and died before its state before was
    fenced and deleted (one read when there is nothing to finish: the marker of
    that state). :class:`RescaleError` when a query of the old count committed
    there first (the switch is then taken back, as by :func:`commit_rescale`).
    Returns whether there was something to finish. Cleanup errors are logged."""
    root = open_filesystem(uri, storage_options).child(operator)
    try:
        metadata = read_metadata(root)
    except FileNotFoundError:
        return False
    fence, generation = metadata.get(FENCE_FIELD), metadata.get(GENERATION_FIELD)
    if fence is None or generation is None:
        return False
    _check_own(uri, operator, fence)
    if fenced_state_reduced(open_filesystem(fence["root"], storage_options).child(operator)):
        return False
    _fence(root, operator, generation, fence, storage_options)
    try:
        _drop(uri, operator, generation, storage_options)
    except OSError as exc:  # never read again; the next start or rescale retries
        log.warning("sessionstore could not delete the state before the rescale: %s", exc)
    return True


def _check_own(uri: str, operator: str, fence: dict[str, Any]) -> None:
    """A switch's record of the state it replaced, read from the checkpoint, must
    name this checkpoint's root or one of its generations: a start fences and
    deletes there, and never outside its own checkpoint (a bucket writer's
    ``_metadata`` cannot aim it at another)."""
    replaced = str(fence.get("root", "")).rstrip("/")
    prefix = generation_root(uri, operator, "")
    generation = replaced[len(prefix):] if replaced.startswith(prefix) else None
    if replaced != uri.rstrip("/") and not is_generation_name(generation):
        raise RescaleError(
            f"{uri}/{operator}/_metadata names {replaced!r} as the state it replaced, "
            "which is neither this checkpoint nor one of its generations: refused"
        )


def _fence(
    root: Storage,
    operator: str,
    generation: str,
    fence: dict[str, Any],
    options: dict[str, Any] | None,
) -> None:
    """Fence the state just replaced (fencing.py; ``fence``: the switch's record of
    it): a query of the old count that still runs cannot commit its next version
    there. One whose commit landed between the switch and its fence has state the
    copy lacks: the switch is taken back (the root's ``_metadata`` as it was, the
    fences removed) and the rescale refused, nothing lost."""
    state = open_filesystem(fence["root"], options).child(operator)
    version, partitions = int(fence["version"]), int(fence["partitions"])
    taken = fence_state(state, partitions, version, generation)
    if not taken:
        return
    # the fences go first: a crash before the switch is taken back leaves it for
    # the next start's resume_rescale to take back, never a fenced old state named
    fenced = [p for p in range(partitions) if p not in taken]
    unfence_state(state, fenced, version)
    write_metadata(root, fence["previous"])  # the old state stays the one read
    raise RescaleError(
        f"{state.uri.rstrip('/')}: partitions {taken} committed version "
        f"{version} right after the rescale's switch (another query of the old count "
        "runs on the checkpoint): the switch is taken back, nothing is lost; stop "
        "that query first"
    )


def _claim(root: Storage, plan: RescalePlan) -> RescalePlan:
    """One rescale of one state: two drivers that rescale the same source version at
    once both copy, but only the first to create the claim object named after that
    source (its version and the time of its newest commit) switches. Another count is refused (its copy never read); the same count
    adopts the winner's generation, written whole before its claim, and returns
    the plan of that one: a rescale that died between its claim and its switch is
    finished by the next start. Where the store cannot create exclusively, the
    commit check above is the only guard."""
    if not root.exclusive_create:
        return plan
    source = "root" if plan.source_root == plan.uri else plan.source_root.rsplit("/", 1)[-1]
    # the commit of that version too: an erase or rewrite commits it again, and the
    # copy of what it replaced must never be adopted
    name = f"{GENERATIONS_DIR}/{source}-v{plan.source.version}-{plan.source.newest_ns}.claim"
    if root.write_exclusive(name, plan.generation.encode()):
        return plan
    winner = root.read(name).decode(errors="replace")
    if winner == plan.generation:
        return plan
    won = generation_root(plan.uri, plan.operator, winner)
    layout = None
    if is_generation_name(winner):  # never read a path a claim's writer chose
        try:
            layout = layout_of(
                read_metadata(open_filesystem(won, plan.storage_options).child(plan.operator))
            )
        except (FileNotFoundError, CheckpointMismatchError):
            pass
    wanted = (plan.copy.partitions, plan.copy.key_groups or plan.copy.partitions)
    if layout == wanted:  # None for a foreign or empty claim
        return dataclasses.replace(
            plan, generation=winner, copy=dataclasses.replace(plan.copy, target_uri=won)
        )
    shape = "another layout" if layout is None else f"{layout[1]} partitions in {layout[0]} databases"
    raise RescaleError(
        f"{plan.uri}/{plan.operator}: another rescale of version {plan.source.version} "
        f"(generation {winner}) claimed the switch first, to {shape}; "
        f"nothing was switched (if no other rescale runs, that one crashed: delete {name} "
        "and restart)"
    )


def drop_state(plan: RescalePlan) -> None:
    """Delete the state the switch left behind (after :func:`commit_rescale`), only
    when the root's ``_metadata`` names this plan's generation: every other
    generation (the previous one, and any a crashed rescale left half written) and
    the root's partitions and event-time files (its ``_metadata``, now the switch,
    and the operator's other files stay), except the fences of a state a switch
    replaced (fencing.py), which stay for good (one small object per partition
    and rescale). Errors are the caller's to log: what remains is never read."""
    _drop(plan.uri, plan.operator, plan.generation, plan.storage_options)


def _drop(uri: str, name: str, current: str, options: dict[str, Any] | None) -> None:
    """:func:`drop_state` of the switch to generation ``current``."""
    operator = open_filesystem(uri, options).child(name)
    if read_metadata(operator).get(GENERATION_FIELD) != current:
        return  # not this plan's switch (another's won): nothing here is this plan's
    for generation in operator.list_dirs(GENERATIONS_DIR):
        if generation != current:
            state = operator.child(f"{GENERATIONS_DIR}/{generation}/{name}")
            if not drop_fenced_state(state):  # never switched to: no query ran there
                operator.delete_dir(f"{GENERATIONS_DIR}/{generation}")
    # the root's partitions are never read once a generation is named: also those an
    # earlier cleanup left (an erase reaches only the generation)
    if not drop_fenced_state(operator):
        for name in operator.list_dirs():
            if name.isdigit() or name == EVENT_TIME_DIR:
                operator.delete_dir(name)
