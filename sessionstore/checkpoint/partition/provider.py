"""StateStoreProvider: versioned state per (operator, partition), durable in object storage.

Modelled on Spark's RocksDB state store provider with changelog checkpointing.
Version N is the state after micro-batch N; version 0 is empty, or a snapshot
when the operator was bootstrapped (offline/bootstrap.py). The provider is
the composition of one part per job, each in its own module:

* identity.py: which checkpoint the state belongs to (``_metadata``, checked once
  and confirmed at the first load of each run; the checkpoint id a local database
  and a pending snapshot must record to be used);
* load.py: loading a version (the local copy as is, caught up by replaying
  changelogs, or restored from a snapshot, around an unusable one);
* commit.py: the handle collecting the next version and the commit protocol (the
  changelog upload is the commit point), with its metrics;
* maintenance.py: snapshot uploads, pruning and the orphan sweep.

Files and meta keys, remote and local: see layout.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sessionstore.checkpoint.partition.commit import (
    COMMIT_STEPS,
    CommitObserver,
    CommitStep,
    Committer,
    StoreHandle,
    store_stats,
)
from sessionstore.checkpoint.partition.identity import (
    FORMAT,
    CheckpointIdentity,
    CheckpointMismatchError,
    CheckpointPartition,
    check_partition_count,
    recorded_partitions,
)
from sessionstore.checkpoint.partition.load import PartitionLoader, VersionNotFoundError
from sessionstore.checkpoint.partition.maintenance import Maintenance
from sessionstore.checkpoint.partition.orphans import DEFAULT_ORPHAN_GRACE_S
from sessionstore.checkpoint.records.layout import LocalPartition, PartitionFiles
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem, redact
from sessionstore.engine.memory import check_memory_max_mb
from sessionstore.stores.base import check_store_name
from sessionstore.stores.spec import StoreSpec

__all__ = [
    "StateStoreProvider",
    "StoreHandle",
    "CommitStep",
    "CommitObserver",
    "COMMIT_STEPS",
    "CheckpointMismatchError",
    "VersionNotFoundError",
    "recorded_partitions",
    "check_partition_count",
    "store_stats",
    "FORMAT",
    "MIN_RETAIN_VERSIONS",
]

#: The fewest versions a provider keeps loadable: the latest, the one before it
#: (whose changelog header holds the event time the next batch reads) and one more
#: for a batch replayed after a failure.
MIN_RETAIN_VERSIONS = 3

log = logging.getLogger(__name__)

#: A provider's confirmed run before its first load: its constructor read the identity.
_BUILT = object()


class StateStoreProvider:
    """Versioned, checkpointed stores of one operator partition.

    ``memory_max_mb``: the RocksDB memory budget of this process, shared by every
    database it opens (:mod:`sessionstore.engine.memory`); None keeps the process's
    current budget (by default 256 MiB). ``allow_pickle``: adopt the pickle serde
    that ``_metadata`` records for a processor store whose spec leaves the serde
    open (unpickling runs code from the checkpoint; without it such a checkpoint is
    refused: docs/security.md).
    """

    def __init__(
        self,
        checkpoint_uri: str,
        operator_id: str,
        partition_id: int,
        store_specs: list[StoreSpec],
        local_dir: str,
        snapshot_interval: int = 10,
        retain_versions: int = 100,
        storage_options: dict[str, Any] | None = None,
        num_partitions: int | None = None,
        progress: Callable[[str, int, int], None] | None = None,
        commit_observer: CommitObserver | None = None,
        key_types: list[str] | None = None,
        memory_max_mb: int | None = None,
        key_groups: int | None = None,
        orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
        allow_pickle: bool = False,
    ) -> None:
        check_store_name(operator_id)
        check_memory_max_mb(memory_max_mb)
        if type(partition_id) is not int or partition_id < 0:
            raise ValueError(f"partition_id must be a non-negative int, got {partition_id!r}")
        for name, value in (
            ("snapshot_interval", snapshot_interval),
            ("retain_versions", retain_versions),
        ):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if retain_versions < MIN_RETAIN_VERSIONS:
            # an event-time operator's next batch reads the changelog of the version
            # before the latest (event_time.py, MissingEventTimeError)
            raise ValueError(
                f"retain_versions must be at least {MIN_RETAIN_VERSIONS}, got {retain_versions!r}"
            )
        if not store_specs or not all(isinstance(s, StoreSpec) for s in store_specs):
            raise ValueError("store_specs must be a non-empty list of StoreSpec")
        self.operator_id, self.partition_id = operator_id, partition_id
        self.snapshot_interval, self.retain_versions = snapshot_interval, retain_versions
        self.memory_max_mb = memory_max_mb
        self.storage_options = redact(storage_options)
        self._operator = open_filesystem(checkpoint_uri, storage_options).child(operator_id)
        self._remote: Storage = self._operator.child(str(partition_id))
        self._files = PartitionFiles(self._remote)
        identity = self._identity = CheckpointIdentity(
            self._operator, self._remote, self._files, operator_id, key_types, allow_pickle,
            partition_id, key_groups,
        )  # fmt: skip
        self.store_specs = identity.check(list(store_specs), num_partitions)
        local = LocalPartition(local_dir, operator_id, partition_id)
        self._local_db_path = local.db
        partition = CheckpointPartition(self._remote, self._files, local, identity)
        self._loader = PartitionLoader(
            partition, memory_max_mb, progress or (lambda label, done, total: None)
        )
        self._maintenance = Maintenance(partition, retain_versions, orphan_grace_s)
        #: the commits of this partition (and their metrics)
        self.committer = Committer(
            partition, self._operator, operator_id, partition_id, snapshot_interval,
            self._loader, self._maintenance, commit_observer,
        )  # fmt: skip
        self._handle: StoreHandle | None = None
        #: the run whose loads need no confirmation of the checkpoint's identity
        #: (see get_store); _BUILT: the constructor has just read it
        self._confirmed_run: object = _BUILT

    def __repr__(self) -> str:
        return f"StateStoreProvider({self._remote.uri!r}, storage_options={self.storage_options})"

    @property
    def operator_storage(self) -> Storage:
        """The operator's directory in object storage (shared by its partitions)."""
        return self._operator

    @property
    def initial_event_time(self) -> int | None:
        """The shared event time batch 0 starts from: None, or the history's when
        version 0 was bootstrapped (docs/rewrite.md, "Bootstrapping")."""
        return self._identity.initial_event_time

    @property
    def last_metrics(self) -> dict[str, Any] | None:
        """The metrics of the last commit, its timings included (after commit())."""
        return self.committer.last_metrics

    @property
    def repairs(self) -> list[str]:
        """Every repair this provider made (a restore that went around an unusable
        snapshot), one sentence each."""
        return self._loader.repairs

    # --------------------------------------------------------------- versions
    def list_versions(self) -> list[int]:
        """Committed versions that can still be loaded, ascending."""
        return self._files.loadable()

    def latest_version(self) -> int:
        """The newest committed version (0 when nothing was committed)."""
        return self._files.latest()

    # ---------------------------------------------------------------- loading
    def get_store(self, version: int, run: str | None = None) -> StoreHandle:
        """The stores loaded at ``version``, ready to collect ``version + 1``.

        Each load first makes sure the checkpoint is still the one this provider
        checked, not one deleted and created again at its URI since (one read of
        ``_metadata``; its state is then never served, see :meth:`confirm`), except
        in the steady state of a query: ``run`` names the run of the query the load
        is for (a restart is a new run, and a checkpoint is deleted and created
        again only between runs), and the identity is confirmed at the first load
        of each run only, and not at the first load after the constructor read it.
        """
        if type(version) is not int or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        if run is not None and not isinstance(run, str):
            raise ValueError(f"run must be a str or None, got {run!r}")
        if self._handle is not None and self._handle.is_open:
            self._handle.abort()  # a retried task abandons the previous attempt
        if self._confirmed_run is not _BUILT and (run is None or run != self._confirmed_run):
            self.confirm()
        self._confirmed_run = run
        db = self._loader.load(version)
        db.begin()
        stores = {spec.name: spec.open(db) for spec in self.store_specs}
        self._handle = StoreHandle(version, db, stores, self.committer.commit)
        return self._handle

    def confirm(self) -> bool:
        """Make sure this provider serves the checkpoint's current incarnation (one
        read of ``_metadata``): False if it does. True if the checkpoint was deleted
        and created again since it was checked (invariant 9 of DESIGN.md): the new
        one is checked as the constructor does, the local database and pending
        snapshots of the old one are then never used or uploaded (a load restores),
        and maintenance forgets what it knew of the old one."""
        specs = self._identity.confirm()
        if specs is None:
            return False
        self.store_specs = specs
        log.warning(
            "sessionstore: %s: the checkpoint's id is not the one this provider checked "
            "(the checkpoint was deleted and created again, or another partition's id "
            "won at its creation); local state of the other id is not used",
            self._remote.uri,
        )
        return True

    @property
    def local_db_path(self) -> str:
        """Where this partition's RocksDB database lives on this machine."""
        return self._local_db_path

    @property
    def local_open(self) -> bool:
        """Whether this provider holds its local database open (and its lock)."""
        return self._loader.db is not None

    def open_local(self) -> None:
        """Open the local database now if there is one (and it is not open yet).

        Raises :class:`~sessionstore.errors.StateDBLockedError` while another process
        holds it: the store service uses this to hand a partition over.
        """
        self._loader.open_local()

    # ------------------------------------------------------------- maintenance
    def do_maintenance(self) -> dict[str, Any]:
        """Upload this checkpoint's pending snapshots, prune versions beyond
        ``retain_versions`` and delete files no retained snapshot uses (after the
        orphan grace). Returns what was done: ``snapshots`` uploaded,
        ``uploaded_bytes``, ``deleted`` names, ``foreign`` pending snapshots dropped."""
        return self._maintenance.run()

    def close(self) -> None:
        """Abort any open handle and close the local database."""
        if self._handle is not None:
            self._handle.abort()
            self._handle = None
        self._loader.close()
