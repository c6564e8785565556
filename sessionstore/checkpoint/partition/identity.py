"""Which checkpoint a partition's state belongs to: the operator's ``_metadata``.

A checkpoint is known by the ``checkpoint_id`` in its operator's ``_metadata`` (a
random id written when the checkpoint is created, or with the first commit of a
checkpoint written before ids existed), not by the spelling of its URI. A local
database records the id and the location of the copy it came from; it is used
only by a provider of that same checkpoint at that same place, so two checkpoints
sharing a ``local_dir`` and an operator name never read each other's state. Remote
snapshots and changelogs carry no owner: whatever is downloaded from a checkpoint
belongs to it, which is what lets a checkpoint be reached by any spelling of its
URI, or copied to another folder or bucket.

A checkpoint deleted and created again at its URI is another incarnation, with
another id. A provider is checked when it is built and confirmed again (one read
of ``_metadata``) at the first load of each run of its query
(:meth:`CheckpointIdentity.confirm`), and a pending snapshot is published only
if the checkpoint holds its commit, read right before its manifest is written
(maintenance.py): the state of an old
incarnation is never served, replayed onto or uploaded into a new one, however
long the process that holds it lives (invariant 9 of DESIGN.md).

``_metadata`` also records the stores and the partition count: a restart with
other stores or another count is refused (:class:`CheckpointMismatchError`).

**Partitions and slabs.** A key's partition is ``pmod(hash(key), K)``, Spark's
own hash (``repartition(K, keys)``). The partitions are kept in ``S``
databases, *slabs*, with ``S`` dividing ``K``: slab ``s`` holds the partitions
``s, s + S, s + 2S, ...``, so the slab of a key is ``pmod(hash(key), S)``. A
checkpoint of ``K`` partitions in ``S`` slabs is therefore, file for file, the
checkpoint of ``S`` partitions: every slab has its own versions, changelogs,
snapshots, lineage and fences, and everything that reads or writes a
checkpoint's partitions reads or writes its slabs. ``_metadata`` records ``S`` as
``num_partitions`` and, when it differs, ``K`` as ``key_groups`` (absent: one
partition per slab, ``K = S``, as every checkpoint with one database per
partition). What ``K`` adds is the name of a row's partition for the tools
(``sessionstore dump --partition``, the data source) and the count a rescale
keeps; a restart with another ``K`` or on a larger cluster rescales.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import msgpack

from sessionstore.checkpoint.records.generation import GENERATION_FIELD, GENERATIONS_DIR
from sessionstore.checkpoint.records.layout import (
    BOOTSTRAP_FIELD,
    CHANGE_FIELD,
    CHECKPOINT_ID_FIELD,
    IDENTITY_KEY,
    KEY_GROUPS_FIELD,
    KEY_TYPES_FIELD,
    METADATA,
    LocalPartition,
    PartitionFiles,
    read_metadata,
    write_metadata,
)
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from sessionstore.encoding.serde import PickleSerde
from sessionstore.errors import SessionStoreError
from sessionstore.stores.base import check_store_name
from sessionstore.stores.spec import StoreSpec, refuse_pickle

if TYPE_CHECKING:
    from sessionstore.stores.state_db import StateDB

__all__ = [
    "FORMAT",
    "PICKLE_OPTION",
    "CheckpointIdentity",
    "CheckpointMismatchError",
    "CheckpointPartition",
    "check_partition_count",
    "recorded_partitions",
    "recorded_layout",
    "layout_of",
    "with_recorded_intervals",
]

#: The checkpoint format this release writes (recorded in ``_metadata``).
FORMAT = 1
#: How a job opts in to a checkpoint whose ``_metadata`` records the pickle serde.
PICKLE_OPTION = "allow_pickle=True (StateBackend, or spark.sessionstore.allowPickle)"


class CheckpointMismatchError(SessionStoreError, ValueError):
    """The checkpoint was written with other stores or another partition count."""


def check_partition_count(where: str, recorded: int | None, wanted: int | None) -> None:
    """``CheckpointMismatchError`` naming both counts when ``wanted`` differs from the
    count ``recorded`` in the ``_metadata`` at ``where`` (either may be None:
    nothing to compare)."""
    if wanted is not None and recorded is not None and recorded != wanted:
        raise CheckpointMismatchError(
            f"{where} was written with {recorded} partitions, but this query has "
            f"{wanted}; the partition count is fixed for the life of a checkpoint"
        )


def recorded_partitions(
    checkpoint_uri: str, operator_id: str, storage_options: dict[str, Any] | None = None
) -> int | None:
    """The count of databases (slabs, see the module doc) recorded in operator
    ``operator_id``'s ``_metadata`` under ``checkpoint_uri``: None when the
    operator has no checkpoint yet, or one whose first writer did not give a
    count. One read of one small object."""
    layout = recorded_layout(checkpoint_uri, operator_id, storage_options)
    return None if layout is None else layout[0]


def recorded_layout(
    checkpoint_uri: str, operator_id: str, storage_options: dict[str, Any] | None = None
) -> tuple[int, int] | None:
    """``(slabs, partitions)`` recorded in operator ``operator_id``'s ``_metadata``
    under ``checkpoint_uri`` (:func:`layout_of`); None as
    :func:`recorded_partitions`. One read of one small object."""
    check_store_name(operator_id)
    try:
        recorded = read_metadata(
            open_filesystem(checkpoint_uri, storage_options).child(operator_id)
        )
    except FileNotFoundError:
        return None
    return layout_of(recorded)


def layout_of(metadata: dict[str, Any]) -> tuple[int, int] | None:
    """``(slabs, partitions)`` of an operator's ``_metadata``: its
    ``num_partitions``, and its ``key_groups`` or, absent, the same count (one
    partition per database); None when it records no count.
    :class:`CheckpointMismatchError` when ``key_groups`` is not a positive multiple
    of ``num_partitions``."""
    slabs = metadata.get("num_partitions")
    if type(slabs) is not int:
        return None
    partitions = metadata.get(KEY_GROUPS_FIELD, slabs)
    if type(partitions) is not int or partitions < 1 or slabs < 1 or partitions % slabs:
        raise CheckpointMismatchError(
            f"_metadata records {partitions!r} partitions in {slabs!r} slabs: the partition "
            "count must be a positive multiple of the slab count"
        )
    return slabs, partitions


def with_recorded_intervals(
    specs: list[StoreSpec], recorded: list[dict[str, Any]] | None, allow_pickle: bool = False
) -> list[StoreSpec] | None:
    """``specs`` with the checkpoint's segment intervals where either side leaves
    the interval open (``segment_interval_ms`` None), and, only with
    ``allow_pickle``, with its ``pickle`` value serde where a processor store's spec
    leaves the serde open, if the specs differ in nothing else; or None.

    No release writes pickled processor state: a ``_metadata`` that records it was
    written by hand or by whoever can write the bucket, and adopting it would
    unpickle (run) what they stored. So only a job that opted in explicitly
    (``allow_pickle``) adopts it (docs/security.md).

    An interval is fixed for a store's life. Checkpoints written before operators
    chose their stores' interval recorded None: a query restarted on a newer
    release keeps the interval its stores were created with. And a reader that does
    not name an interval (the CLI, a notebook) takes the recorded one.
    """
    if not recorded or len(recorded) != len(specs):
        return None
    adopted = []
    for spec, record in zip(specs, recorded, strict=True):
        interval = record.get("segment_interval_ms")
        if interval is None or spec.segment_interval_ms is None:
            spec = replace(spec, segment_interval_ms=interval)
        if (
            allow_pickle and spec.kind == "processor" and spec.value_serde is None
            and record.get("value_serde") == PickleSerde.name
        ):  # fmt: skip
            spec = replace(spec, value_serde=PickleSerde())
        if spec.describe() != record:
            return None
        adopted.append(spec)
    return adopted


def _unnamed_pickles(
    specs: list[StoreSpec], recorded: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The store records of ``recorded`` that name the pickle serde where the spec
    of that store does not (the caller chose no pickle there)."""
    described = [s.describe() for s in specs]
    chosen = {d["name"] for d in described if PickleSerde.name in (d["key_serde"], d["value_serde"])}
    return [
        r for r in recorded or ()
        if isinstance(r, dict) and r.get("name") not in chosen
    ]  # fmt: skip


def _half_applied(operator: Storage, change: dict[str, Any]) -> str:
    return (
        f"{operator.uri}/{METADATA} records a change ({change.get('id')}) that is "
        "committed but not applied (the command that made it was interrupted): run "
        "`sessionstore erase` on it again, or the bootstrap that made it, to finish it "
        "(docs/rewrite.md)"
    )


class CheckpointIdentity:
    """The ``_metadata`` of an operator as one partition's provider sees it: checked
    (and completed) once per incarnation, and the checkpoint id its local state is
    owned by.

    ``operator`` is the operator's storage, ``remote`` the partition's.
    ``allow_pickle``: a processor store recorded with the pickle serde is adopted
    (else refused with :class:`~sessionstore.errors.PickleRefusedError`, decided
    from the one read of ``_metadata`` that :meth:`check` makes).
    """

    def __init__(
        self,
        operator: Storage,
        remote: Storage,
        files: PartitionFiles,
        operator_id: str,
        key_types: list[str] | None,
        allow_pickle: bool = False,
        partition: int | None = None,
        key_groups: int | None = None,
    ) -> None:
        self._operator, self._remote, self._files = operator, remote, files
        #: the partition count when it differs from the slab count (module doc)
        self._key_groups = key_groups
        self._partition = partition
        self._operator_id = operator_id
        self._allow_pickle = allow_pickle
        #: Spark types of the key columns the operator partitions by, recorded in
        #: ``_metadata`` for a repartition (see repartition.py)
        self._key_types = None if key_types is None else list(key_types)
        self._location = remote.location
        #: the recorded checkpoint id (None: a checkpoint of a release before ids)
        self.checkpoint_id: str | None = None
        #: the shared event time batch 0 starts from: the history's, when version 0
        #: was bootstrapped (offline/bootstrap.py), else None
        self.initial_event_time: int | None = None
        #: version 0 was bootstrapped: it is its snapshot, never the empty state
        self.bootstrapped = False
        #: the commit the bootstrap staged as this partition's version 0 (None: not
        #: bootstrapped, or the partition is not known): its snapshot must hold it
        self.bootstrap_commit: str | None = None
        #: the specs and partition count :meth:`check` was given (for :meth:`confirm`)
        self._wanted: tuple[list[StoreSpec], int | None] = ([], None)

    def check(self, specs: list[StoreSpec], num_partitions: int | None) -> list[StoreSpec]:
        """Check ``specs`` and ``num_partitions`` against ``_metadata`` (writing it,
        id included, for a new checkpoint; adding fields an older release left out);
        returns the specs to use (the recorded intervals adopted where left open).
        :class:`CheckpointMismatchError` when they differ. :meth:`confirm` checks
        them again when the checkpoint turns out to be another incarnation."""
        self._wanted = (list(specs), num_partitions)
        try:
            recorded = read_metadata(self._operator)
        except FileNotFoundError:
            recorded = None
        return self._check(recorded, specs, num_partitions)

    def _check(
        self, recorded: dict[str, Any] | None, specs: list[StoreSpec], num_partitions: int | None
    ) -> list[StoreSpec]:
        """:meth:`check` against ``recorded`` (None: there is no ``_metadata``)."""
        wanted = {
            "format": FORMAT,
            "operator_id": self._operator_id,
            "num_partitions": num_partitions,
            "stores": [s.describe() for s in specs],
        }
        if self._key_types is not None:
            wanted[KEY_TYPES_FIELD] = self._key_types
        if self._key_groups is not None and self._key_groups != num_partitions:
            wanted[KEY_GROUPS_FIELD] = self._key_groups
        bootstrap = None if recorded is None else recorded.get(BOOTSTRAP_FIELD)
        self.bootstrapped = bootstrap is not None
        self.initial_event_time = None if bootstrap is None else bootstrap.get("event_time")
        commits = None if bootstrap is None else bootstrap.get("commits")
        known = isinstance(commits, list) and self._partition in range(len(commits))
        self.bootstrap_commit = commits[self._partition] if known else None
        if recorded is None:
            if self._files.latest():
                # _metadata is written first when a checkpoint is born and last by
                # a repartition: state without it is an unfinished copy
                raise CheckpointMismatchError(
                    f"{self._remote.uri} holds committed state but {self._operator.uri} has "
                    f"no {METADATA}: an incomplete checkpoint (a repartition or a copy that "
                    "did not finish); delete it and make it again"
                ) from None
            # a new checkpoint: its id is born with its metadata
            self._write_id(wanted)
            return specs
        self.checkpoint_id = recorded.get(CHECKPOINT_ID_FIELD)
        where = f"{self._operator.uri}/{METADATA}"
        change = recorded.get(CHANGE_FIELD)
        if change is not None:  # committed, not yet applied: neither old nor new state
            raise CheckpointMismatchError(_half_applied(self._operator, change))
        if recorded.get(GENERATION_FIELD) is not None:
            raise CheckpointMismatchError(
                f"{where} was rescaled: its state is in "
                f"{self._operator.where(GENERATIONS_DIR)}/{recorded[GENERATION_FIELD]}, a "
                "checkpoint root of its own (docs/rescale.md); open that root"
            )
        if recorded.get("format") != FORMAT:
            raise CheckpointMismatchError(
                f"{where} has checkpoint format {recorded.get('format')}; this sessionstore "
                f"writes format {FORMAT}"
            )
        if recorded.get("stores") != wanted["stores"]:
            adopted = with_recorded_intervals(specs, recorded.get("stores"), self._allow_pickle)
            if adopted is None:
                # a pickle the specs do not name: refused as such (the opt-in named)
                refuse_pickle(
                    _unnamed_pickles(specs, recorded.get("stores")), self._operator.uri,
                    self._allow_pickle, PICKLE_OPTION,
                )  # fmt: skip
                raise CheckpointMismatchError(
                    f"{where} was written with stores {recorded.get('stores')}, but this query "
                    f"uses {wanted['stores']}; use a new checkpoint location for a changed operator"
                )
            specs = adopted  # equal to the record read above: no second read decides
        self._complete(recorded, where, num_partitions)
        return specs

    def _complete(self, recorded: dict[str, Any], where: str, num_partitions: int | None) -> None:
        """Check the partition count; record it and the key types where an earlier
        writer did not. A bootstrapped operator's key types must be the query's:
        Spark hashes an int and a long key apart, so the query would route a key to
        another partition than the one its bootstrapped state is in."""
        old_n = recorded.get("num_partitions")
        check_partition_count(where, old_n, num_partitions)
        layout = layout_of(recorded)
        if None not in (layout, self._key_groups) and layout[1] != self._key_groups:
            raise CheckpointMismatchError(
                f"{where} was written with {layout[1]} partitions (in {layout[0]} slabs), but "
                f"this query has {self._key_groups}; a rescale changes the count "
                "(docs/rescale.md)"
            )
        recorded_types = recorded.get(KEY_TYPES_FIELD)
        if self.bootstrapped and None not in (recorded_types, self._key_types):
            if recorded_types != self._key_types:
                raise CheckpointMismatchError(
                    f"{where} was bootstrapped from keys of Spark types {recorded_types}, but "
                    f"this query's keys are {self._key_types}: Spark routes them to other "
                    "partitions; bootstrap from a history whose key columns have the "
                    "stream's types (docs/rewrite.md)"
                )
        missing = {}
        if old_n is None and num_partitions is not None:
            missing["num_partitions"] = num_partitions
            if self._key_groups not in (None, num_partitions):
                missing[KEY_GROUPS_FIELD] = self._key_groups
        if recorded.get(KEY_TYPES_FIELD) is None and self._key_types is not None:
            missing[KEY_TYPES_FIELD] = self._key_types  # checkpoints from before they were
        if missing:
            write_metadata(self._operator, {**recorded, **missing})

    def _write_id(self, metadata: dict[str, Any]) -> None:
        """Record ``metadata`` with a new checkpoint id and take the id recorded.

        Partitions starting together may each write one: the last write wins, and
        reading it back leaves few of them believing a lost id. One that does has
        its local database refused once (see :meth:`owns`); nothing else follows.
        """
        new = {**metadata, CHECKPOINT_ID_FIELD: uuid.uuid4().hex}
        write_metadata(self._operator, new)
        self.checkpoint_id = read_metadata(self._operator).get(CHECKPOINT_ID_FIELD)

    def adopt(self) -> bool:
        """Give a checkpoint written before checkpoint ids existed its id, at its
        first commit by this release (before the changelog upload, the commit
        point). True if it has one now."""
        recorded = read_metadata(self._operator)
        if recorded.get(CHECKPOINT_ID_FIELD) is None:
            self._write_id(recorded)
        else:
            self.checkpoint_id = recorded[CHECKPOINT_ID_FIELD]
        return self.checkpoint_id is not None

    def confirm(self) -> list[StoreSpec] | None:
        """Whether the checkpoint is still the incarnation this identity checked, by
        one read of ``_metadata``: None if it is. Else (the checkpoint was deleted
        and created again, or is being created again now; or the id this partition
        believed at the checkpoint's birth lost the race) the recorded
        ``_metadata`` is checked as :meth:`check` does (written, with a new id, if
        there is none), its id taken, and the specs to use returned: from then on a
        local database or a pending snapshot of the old incarnation is not owned."""
        try:
            recorded = read_metadata(self._operator)
        except FileNotFoundError:
            recorded = None
        if recorded is not None and recorded.get(CHECKPOINT_ID_FIELD) == self.checkpoint_id:
            change = recorded.get(CHANGE_FIELD)
            if change is not None:  # an offline change committed, not yet applied
                raise CheckpointMismatchError(_half_applied(self._operator, change))
            return None
        specs, num_partitions = self._wanted
        return self._check(recorded, specs, num_partitions)

    def _record_of(self, checkpoint_id: str | None) -> bytes:
        return msgpack.packb([checkpoint_id, self._location])

    @property
    def record(self) -> bytes:
        """What a local database (or a pending snapshot) of this partition records
        as its owner: the checkpoint id and the location of this copy."""
        return self._record_of(self.checkpoint_id)

    def owns(self, db: StateDB) -> bool:
        """Whether the local database ``db`` holds state of this checkpoint's copy.
        A database without a record (left by an earlier release) is not trusted."""
        owner = db.get_meta(IDENTITY_KEY)
        return owner is not None and self.is_own(owner)

    def is_own(self, record: bytes) -> bool:
        """Whether the owner ``record`` (of a local database or a pending snapshot)
        is this checkpoint's copy.

        On a mismatch the recorded id is read again: partitions that created the id
        together may have believed another one for a moment, and another provider
        of this partition may have restored the database since under the id that
        won."""
        if record != self.record:
            try:
                self.checkpoint_id = read_metadata(self._operator).get(CHECKPOINT_ID_FIELD)
            except FileNotFoundError:  # the checkpoint is gone: nothing here is its state
                return False
        return record == self.record


@dataclass(frozen=True)
class CheckpointPartition:
    """One partition of a checkpoint, as the provider's parts share it: its remote
    storage and files, its local paths and the identity of its checkpoint."""

    remote: Storage
    files: PartitionFiles
    local: LocalPartition
    identity: CheckpointIdentity
