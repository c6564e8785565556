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
leaves the new one. The previous state is deleted only after the switch
(:func:`drop_state`). The new generation has its own checkpoint id, so no local
database or pending snapshot of the old state is ever taken for it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from sessionstore.checkpoint.offline.change import (
    ChangeError,
    ChangeTarget,
    moved_since,
    open_change,
)
from sessionstore.checkpoint.offline.repartition import (
    RepartitionError,
    RepartitionPlan,
    finish_repartition,
    plan_repartition,
)
from sessionstore.checkpoint.records.generation import (
    GENERATION_FIELD,
    GENERATION_FORMAT,
    GENERATIONS_DIR,
    generation_root,
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
]


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
) -> RescalePlan:
    """Check a rescale of ``operator``'s checkpoint at ``uri`` to ``partitions``
    and return its plan. Reads only; :class:`RescaleError` says why it cannot be
    done: an offline change is half applied, a partition is at another version
    than the others (a query is running, or stopped in the middle of a batch), the
    key columns' types are not recorded, a store is pickled without opt-in, or the
    format is not this release's."""
    where = f"{uri}/{operator}"
    what = f"cannot rescale {where} to {partitions} partitions on restart"
    try:
        metadata = read_metadata(open_filesystem(uri, storage_options).child(operator))
        if metadata.get(CHANGE_FIELD) is not None:
            raise ChangeError(
                "an offline change is committed but not applied; finish it first "
                "(sessionstore change --resume, docs/rewrite.md)"
            )
        root = state_root(uri, operator, storage_options, metadata)
        source = open_change(root, operator, storage_options, allow_pickle)
        generation = uuid.uuid4().hex
        copy = plan_repartition(
            root, operator, partitions, generation_root(uri, operator, generation),
            version=source.version, storage_options=storage_options, allow_pickle=allow_pickle,
        )  # fmt: skip
    except (ChangeError, RepartitionError, FileNotFoundError) as exc:
        raise RescaleError(f"{what}: {exc}; the checkpoint is unchanged") from None
    return RescalePlan(uri, operator, generation, source, copy, storage_options)


def commit_rescale(plan: RescalePlan) -> int | None:
    """After every partition of the new generation is written: its event time and
    ``_metadata``, then the switch, the operator's root ``_metadata`` naming the
    generation. Refused (:class:`RescaleError`, nothing switched) when a partition
    committed to the old state meanwhile. Returns the carried event time."""
    shared, _ = finish_repartition(plan.copy)
    before = plan.source
    seen = moved_since(before)
    if seen is not None:
        raise RescaleError(
            f"{before.uri}/{plan.operator} was committed to while it was rescaled (it was "
            f"at version {before.version}, now: {seen}): another query holds the "
            "checkpoint; stop it first. Nothing was switched"
        )
    target = open_filesystem(plan.copy.target_uri, plan.storage_options).child(plan.operator)
    metadata = read_metadata(target)
    root = open_filesystem(plan.uri, plan.storage_options).child(plan.operator)
    _claim(root, plan)
    switch = {**metadata, GENERATION_FIELD: plan.generation, "format": GENERATION_FORMAT}
    write_metadata(root, switch)  # the switch
    return shared


def _claim(root: Storage, plan: RescalePlan) -> None:
    """One rescale of one state: two drivers that rescale the same source version at
    once both copy, but only the first to create the claim object named after that
    source switches (the other is refused, its copy never read). Where the store
    cannot create exclusively, the commit check above is the only guard."""
    if not root.exclusive_create:
        return
    source = "root" if plan.source_root == plan.uri else plan.source_root.rsplit("/", 1)[-1]
    name = f"{GENERATIONS_DIR}/{source}-v{plan.source.version}.claim"
    if root.write_exclusive(name, plan.generation.encode()):
        return
    winner = root.read(name).decode(errors="replace")
    if winner != plan.generation:
        raise RescaleError(
            f"{plan.uri}/{plan.operator}: another rescale of version {plan.source.version} "
            f"(generation {winner}) claimed the switch first; nothing was switched (if "
            f"no other rescale runs, that one crashed: delete {name} and restart)"
        )


def drop_state(plan: RescalePlan) -> None:
    """Delete the state the switch left behind (after :func:`commit_rescale`), only
    when the root's ``_metadata`` names this plan's generation: every other
    generation (the previous one, and any a crashed rescale left half written) and
    the root's partitions and event-time files (its ``_metadata``, now the switch,
    and the operator's other files stay). Errors are the caller's to log: what
    remains is never read."""
    operator = open_filesystem(plan.uri, plan.storage_options).child(plan.operator)
    if read_metadata(operator).get(GENERATION_FIELD) != plan.generation:
        return  # not this plan's switch (another's won): nothing here is this plan's
    for generation in operator.list_dirs(GENERATIONS_DIR):
        if generation != plan.generation:
            operator.delete_dir(f"{GENERATIONS_DIR}/{generation}")
    # the root's partitions are never read once a generation is named: also those an
    # earlier cleanup left (an erase reaches only the generation)
    for name in operator.list_dirs():
        if name.isdigit() or name == EVENT_TIME_DIR:
            operator.delete_dir(name)
