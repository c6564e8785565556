"""StateStoreProvider: versioned state per (operator, partition), durable in object storage.

Modelled on Spark's RocksDB state store provider with changelog checkpointing.
Version N is the state after micro-batch N; version 0 is empty.

Files and meta keys, remote and local: see layout.py.

Commit protocol: the stores write into one batch of the local StateDB; at commit
the batch (stores' metadata and ``committed_version = N`` included) is serialised
as changelog N and uploaded atomically. **That upload is the commit point.** Only
then is the same batch written to the local RocksDB. A crash before the upload
leaves version N-1 everywhere; a crash after it leaves the local copy one version
behind, and the next load replays changelog N. A ``commit_observer`` sees each
step (``prepared``, ``uploaded``, ``applied``): for metrics, tracing, or a test
that injects a failure there, as Spark's tests plug a failure-injecting file
manager in.

Loading version N: if the local database is at N it is used as is; if it is
behind and the changelogs up to N exist, they are replayed; otherwise (a new
executor, a replayed batch whose local state is ahead, a gap in the changelogs)
the newest snapshot at or below N is downloaded into a fresh directory, the
changelogs after it are replayed, and the directory replaces the local copy only
when complete: a store is never returned partly restored. An unusable snapshot is
gone around (an older one, or version 0, plus the retained changelogs): a repair,
logged and counted in the next commit's metrics.

Lineage (lineage.py): every commit has a unique id, recorded in its changelog
with its parent's; a changelog is applied only onto the commit it continues. Of
two attempts committing one version the first to publish wins (a local ``link``,
the driver's coordinator as arbiter on object stores, or a look before writing)
and a later one adopts the winner's commit instead of replacing it.

Maintenance uploads only this checkpoint's pending snapshots (each records its
identity and commit), prunes only below a snapshot whose files are all stored,
and deletes an unreferenced content file only after two sweeps the grace apart
(orphans.py), so another executor's upload in flight never loses a file.

Identity: a checkpoint is known by the ``checkpoint_id`` in its operator's
``_metadata`` (a random id written when the checkpoint is created, or with the
first commit of a checkpoint written before ids existed), not by the spelling of
its URI. A local database records the id and the location of the copy it came
from; it is used only by a provider of that same checkpoint at that same place,
so two checkpoints sharing a ``local_dir`` and an operator name never read each
other's state. Remote snapshots and changelogs carry no owner: whatever is downloaded from
a checkpoint belongs to it, which is what lets a checkpoint be reached by any
spelling of its URI, or copied to another folder or bucket.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from sessionstore.checkpoint.changelog import decode_changelog, encode_changelog
from sessionstore.checkpoint.event_time import EVENT_TIME_FIELD
from sessionstore.checkpoint.filesystem import Storage, open_filesystem, redact
from sessionstore.checkpoint.layout import (
    CHANGELOG_GROUP,
    CHECKPOINT_ID_FIELD,
    COMMIT_KEY,
    FILES_DIR,
    IDENTITY_KEY,
    KEY_TYPES_FIELD,
    LAST_COMMIT_KEY,
    METADATA,
    VERSION_KEY,
    LocalPartition,
    PartitionFiles,
    changelog_group,
    changelog_name,
    commit_of,
    committed_version,
    content_name,
    database_in,
    encode_version,
    is_database,
    manifest_name,
    read_changelog_file,
    read_metadata,
    write_metadata,
)
from sessionstore.checkpoint.lineage import (
    COMMIT_FIELD,
    PARENT_FIELD,
    CommitArbiter,
    LineageError,
    SnapshotRecord,
    check_continues,
    new_commit_id,
    publish,
    read_snapshot_record,
    write_snapshot_record,
)
from sessionstore.checkpoint.metrics import METRICS_FORMAT, millis, snapshot_lag
from sessionstore.checkpoint.orphans import DEFAULT_ORPHAN_GRACE_S, OrphanSweep
from sessionstore.checkpoint.private_dir import private_dir
from sessionstore.checkpoint.processing_time import PROCESSING_TIME_FIELD
from sessionstore.checkpoint.snapshot import (
    CorruptSnapshotError,
    download_snapshot,
    read_manifest,
    referenced,
    upload_snapshot,
)
from sessionstore.encoding.serde import PickleSerde
from sessionstore.engine.db import process_native_memory
from sessionstore.engine.memory import check_memory_max_mb
from sessionstore.engine.write_buffer import WriteBuffer
from sessionstore.errors import SessionStoreError
from sessionstore.stores.base import check_store_name, is_data_family
from sessionstore.stores.spec import StoreSpec
from sessionstore.stores.state_db import StateDB

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
    "MIN_RETAIN_VERSIONS",
]

log = logging.getLogger(__name__)

FORMAT = 1
#: The fewest versions a provider keeps loadable: the latest, the one before it
#: (whose changelog header holds the event time the next batch reads) and one more
#: for a batch replayed after a failure.
MIN_RETAIN_VERSIONS = 3
#: The steps of a commit a :data:`CommitObserver` sees, in order: the changelog is
#: encoded and nothing is written yet; it is uploaded (the commit point: the version
#: is durable); the local database holds it.
COMMIT_STEPS = ("prepared", "uploaded", "applied")


@dataclass(frozen=True)
class CommitStep:
    """One step of a commit, as a :data:`CommitObserver` sees it."""

    step: str  # one of COMMIT_STEPS
    operator_id: str
    partition_id: int
    version: int


#: Called at each of :data:`COMMIT_STEPS` of every commit. An exception it raises
#: fails the commit at that step, with the state as the step says.
CommitObserver = Callable[[CommitStep], None]


class _UnusableSnapshot(Exception):
    """A snapshot a restore cannot use (``cause`` says why): an older base may do."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class CheckpointMismatchError(SessionStoreError, ValueError):
    """The checkpoint was written with other stores or another partition count."""


class VersionNotFoundError(SessionStoreError, LookupError):
    """The requested version was never committed (or was pruned)."""


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
    """The partition count recorded in operator ``operator_id``'s ``_metadata`` under
    ``checkpoint_uri``: None when the operator has no checkpoint yet, or one whose
    first writer did not give a count. One read of one small object."""
    check_store_name(operator_id)
    try:
        recorded = read_metadata(
            open_filesystem(checkpoint_uri, storage_options).child(operator_id)
        )
    except FileNotFoundError:
        return None
    count = recorded.get("num_partitions")
    return count if type(count) is int else None


def store_stats(
    db: StateDB, stores: dict[str, Any], pending: WriteBuffer
) -> dict[str, dict[str, Any]]:
    """Per store: observed stream time (None if it has none), an estimate of its
    RocksDB entries once ``pending`` is applied (RocksDB's estimate for the current
    state, plus pending puts, minus pending deletes), and the rows ``pending``
    writes (``updated``) and deletes (``removed``). Recorded in each changelog
    header for ``sessionstore ls`` and ``sessionstore stats``."""
    stats = {}
    for name, store in stores.items():
        keys, updated, removed = db.estimated_keys(name), 0, 0
        for cf, entries in pending.families.items():
            if is_data_family(name, cf):
                deletes = sum(1 for v in entries.values() if v is None)
                updated += len(entries) - deletes
                removed += deletes
        stats[name] = {
            "stream_time": getattr(store, "observed_stream_time", None),
            "keys": max(keys + updated - removed, 0),
            "updated": updated,
            "removed": removed,
        }
    return stats


class StoreHandle:
    """The stores of one partition loaded at ``version``, collecting the next version."""

    def __init__(
        self, provider: StateStoreProvider, version: int, db: StateDB, stores: dict[str, Any]
    ) -> None:
        self._provider = provider
        self.version = version
        self.db = db
        self.stores = stores
        self._open = True
        #: what the caller tells the commit's metrics (see :meth:`note`)
        self.noted: dict[str, Any] = {"late_dropped": None, "emitted": None, "load_ms": None}
        #: fields the commit writes into its changelog header (see :meth:`note_event_time`,
        #: :meth:`note_processing_time`)
        self.header: dict[str, Any] = {}
        #: who decides between two attempts committing this version (see :meth:`arbitrate`)
        self.arbiter: CommitArbiter | None = None

    def arbitrate(self, arbiter: CommitArbiter | None) -> None:
        """Let ``arbiter`` (in Spark, the driver's coordinator) decide which attempt's
        commit of the next version wins on an object store; without one, the commit
        looks before it writes (see lineage.py)."""
        self.arbiter = arbiter

    def note_event_time(self, event_time: int | None) -> None:
        """Record the operator's event time after this batch (None if it has none)
        in the commit's changelog header: the durable record the operator's other
        partitions advance to before the next batch (see event_time.py)."""
        self.header[EVENT_TIME_FIELD] = event_time

    def note_processing_time(self, processing_ms: int) -> None:
        """Record the batch's processing time in the commit's changelog header: the
        durable record a replay of the batch reads (see processing_time.py)."""
        self.header[PROCESSING_TIME_FIELD] = processing_ms

    def note(
        self,
        late_dropped: int | None = None,
        emitted: int | None = None,
        load_ms: float | None = None,
    ) -> None:
        """Tell the next commit's metrics how many rows the operator dropped as
        late and emitted, and (``load_ms``) how long taking the state took when the
        caller waited for it before :meth:`StateStoreProvider.get_store` too, as a
        Spark task does for a handover (recorded in the changelog header)."""
        for name, value in (
            ("late_dropped", late_dropped), ("emitted", emitted), ("load_ms", load_ms)
        ):  # fmt: skip
            if value is not None:
                self.noted[name] = value

    def __getitem__(self, name: str) -> Any:
        return self.stores[name]

    def commit(self) -> int:
        """Make version ``version + 1`` durable and return it."""
        self._require_open()
        self._open = False
        return self._provider._commit(self)

    def abort(self) -> None:
        """Drop every change made through this handle."""
        if self._open:
            self._open = False
            self.db.rollback()
            self.db.reload_stores()

    def _require_open(self) -> None:
        if not self._open:
            raise SessionStoreError(
                f"handle for version {self.version} was already committed or aborted"
            )


def _with_recorded_intervals(
    specs: list[StoreSpec], recorded: list[dict[str, Any]] | None
) -> list[StoreSpec] | None:
    """``specs`` with the checkpoint's segment intervals where either side leaves
    the interval open (``segment_interval_ms`` None), and with its ``pickle`` value
    serde where a processor store's spec leaves the serde open, if the specs differ
    in nothing else; or None.

    A processor store recorded with ``pickle`` was written by a release that
    pickled processor state: the job that wrote it keeps reading and writing it so
    (a job trusts its own checkpoint; docs/security.md says how to rewrite it).

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
            spec.kind == "processor" and spec.value_serde is None
            and record.get("value_serde") == PickleSerde.name
        ):  # fmt: skip
            spec = replace(spec, value_serde=PickleSerde())
        if spec.describe() != record:
            return None
        adopted.append(spec)
    return adopted


class StateStoreProvider:
    """Versioned, checkpointed stores of one operator partition.

    ``memory_max_mb``: the RocksDB memory budget of this process, shared by every
    database it opens (:mod:`sessionstore.engine.memory`); None keeps the process's
    current budget (by default 256 MiB).
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
        orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
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
        self.store_specs = list(store_specs)
        self.snapshot_interval, self.retain_versions = snapshot_interval, retain_versions
        self.memory_max_mb = memory_max_mb
        #: the orphan sweep's marks; ``orphan_grace_s`` must exceed the longest
        #: snapshot upload (see orphans.py)
        self._sweep = OrphanSweep(orphan_grace_s)
        self.storage_options = redact(storage_options)
        root = open_filesystem(checkpoint_uri, storage_options)
        self._operator = root.child(operator_id)
        self._remote: Storage = self._operator.child(str(partition_id))
        self._files = PartitionFiles(self._remote)
        self._checkpoint_id: str | None = None
        #: Spark types of the key columns the operator partitions by, recorded in
        #: ``_metadata`` for a repartition (see repartition.py)
        self._key_types = None if key_types is None else list(key_types)
        self._check_metadata(num_partitions)
        self._location = self._remote.location
        self._local = LocalPartition(local_dir, operator_id, partition_id)
        self._db_path = self._local.db
        self._db: StateDB | None = None
        self._private = False  # the local folders were checked (private_dir)
        self._handle: StoreHandle | None = None
        #: ``progress(label, done, total)`` during restores (the CLI's progress bars)
        self._progress = progress or (lambda label, done, total: None)
        self._observer = commit_observer
        #: how the last get_store got its state, and how long it took
        self._load_kind, self._load_ms = "restore", 0.0
        self._opened_ms: float | None = None  # open_local's time since the last load
        self._snapshot_bytes = 0  # uploaded by maintenance since the last commit
        self._retries_seen = 0  # the storage's retried requests at the last commit
        #: manifests read, by version, with the listing's stamp of the object read:
        #: maintenance reads each once instead of every retained one each time
        self._manifests: dict[int, tuple[Any, dict[str, Any]]] = {}
        #: the metrics of the last commit, its timings included (after commit())
        self.last_metrics: dict[str, Any] | None = None
        #: every repair this provider made (a restore that went around an unusable
        #: snapshot), one sentence each; and how many since the last commit
        self.repairs: list[str] = []
        self._repaired = 0

    def __repr__(self) -> str:
        return f"StateStoreProvider({self._remote.uri!r}, storage_options={self.storage_options})"

    @property
    def operator_storage(self) -> Storage:
        """The operator's directory in object storage (shared by its partitions)."""
        return self._operator

    # --------------------------------------------------------------- metadata
    def _read_metadata(self) -> dict[str, Any]:
        return read_metadata(self._operator)

    def _check_metadata(self, num_partitions: int | None) -> None:
        wanted = {
            "format": FORMAT,
            "operator_id": self.operator_id,
            "num_partitions": num_partitions,
            "stores": [s.describe() for s in self.store_specs],
        }
        if self._key_types is not None:
            wanted[KEY_TYPES_FIELD] = self._key_types
        try:
            recorded = self._read_metadata()
        except FileNotFoundError:
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
            return
        self._checkpoint_id = recorded.get(CHECKPOINT_ID_FIELD)
        where = f"{self._operator.uri}/{METADATA}"
        if recorded.get("format") != FORMAT:
            raise CheckpointMismatchError(
                f"{where} has checkpoint format {recorded.get('format')}; this sessionstore "
                f"writes format {FORMAT}"
            )
        if recorded.get("stores") != wanted["stores"]:
            adopted = _with_recorded_intervals(self.store_specs, recorded.get("stores"))
            if adopted is not None:
                self.store_specs = adopted
                return self._check_metadata(num_partitions)
            raise CheckpointMismatchError(
                f"{where} was written with stores {recorded.get('stores')}, but this query uses "
                f"{wanted['stores']}; use a new checkpoint location for a changed operator"
            )
        old_n = recorded.get("num_partitions")
        check_partition_count(where, old_n, num_partitions)
        missing = {}
        if old_n is None and num_partitions is not None:
            missing["num_partitions"] = num_partitions
        if recorded.get(KEY_TYPES_FIELD) is None and self._key_types is not None:
            missing[KEY_TYPES_FIELD] = self._key_types  # checkpoints from before they were
        if missing:
            write_metadata(self._operator, {**recorded, **missing})

    def _write_id(self, metadata: dict[str, Any]) -> None:
        """Record ``metadata`` with a new checkpoint id and take the id recorded.

        Partitions starting together may each write one: the last write wins, and
        reading it back leaves few of them believing a lost id. One that does has
        its local database refused once (see :meth:`_owns`); nothing else follows.
        """
        new = {**metadata, CHECKPOINT_ID_FIELD: uuid.uuid4().hex}
        write_metadata(self._operator, new)
        self._checkpoint_id = self._read_metadata().get(CHECKPOINT_ID_FIELD)

    def _adopt_id(self) -> bool:
        """Give a checkpoint written before checkpoint ids existed its id, at its
        first commit by this release (before the changelog upload, the commit
        point). True if it has one now."""
        recorded = self._read_metadata()
        if recorded.get(CHECKPOINT_ID_FIELD) is None:
            self._write_id(recorded)
        else:
            self._checkpoint_id = recorded[CHECKPOINT_ID_FIELD]
        return self._checkpoint_id is not None

    @property
    def _identity(self) -> bytes:
        """What a local database of this partition records as its owner."""
        return msgpack.packb([self._checkpoint_id, self._location])

    # --------------------------------------------------------------- versions
    def _changelogs(self) -> set[int]:
        return self._files.changelogs()

    def _snapshots(self) -> set[int]:
        return self._files.snapshots()

    def list_versions(self) -> list[int]:
        """Committed versions that can still be loaded, ascending."""
        return self._files.loadable()

    def latest_version(self) -> int:
        """The newest committed version (0 when nothing was committed)."""
        return self._files.latest()

    # ---------------------------------------------------------------- loading
    def get_store(self, version: int) -> StoreHandle:
        """The stores loaded at ``version``, ready to collect ``version + 1``."""
        if type(version) is not int or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        if self._handle is not None and self._handle._open:
            self._handle.abort()  # a retried task abandons the previous attempt
        start = time.perf_counter()
        db = self._load(version)
        self._load_ms = round(millis(time.perf_counter() - start) + (self._opened_ms or 0.0), 3)
        self._opened_ms = None
        db.begin()
        stores = {spec.name: spec.open(db) for spec in self.store_specs}
        self._handle = StoreHandle(self, version, db, stores)
        return self._handle

    def _owns(self, db: StateDB) -> bool:
        """Whether the local database ``db`` holds state of this checkpoint's copy.

        A database without a record (left by an earlier release) is not trusted. On
        a mismatch the recorded id is read again: partitions that created the id
        together may have believed another one for a moment, and another provider
        of this partition may have restored the database since under the id that
        won.
        """
        owner = db.get_meta(IDENTITY_KEY)
        if owner is None:
            return False
        if owner != self._identity:
            try:
                self._checkpoint_id = self._read_metadata().get(CHECKPOINT_ID_FIELD)
            except FileNotFoundError:  # the checkpoint is gone: nothing here is its state
                return False
        return owner == self._identity

    def _local_version(self, db: StateDB) -> int:
        """The committed version of a local database, or -1 if it belongs to another
        checkpoint (so that it is never used, only replaced by a restore)."""
        return committed_version(db) if self._owns(db) else -1

    @property
    def local_db_path(self) -> str:
        """Where this partition's RocksDB database lives on this machine."""
        return self._db_path

    @property
    def local_open(self) -> bool:
        """Whether this provider holds its local database open (and its lock)."""
        return self._db is not None

    def open_local(self) -> None:
        """Open the local database now if there is one (and it is not open yet).

        Raises :class:`~sessionstore.errors.StateDBLockedError` while another process
        holds it: the store service uses this to hand a partition over.
        """
        if not self._private:
            # before anything is read from or written to it (see private_dir)
            private_dir(self._local.root, base=self._local.base)
            self._private = True
        if self._db is None and is_database(self._db_path):
            start = time.perf_counter()
            self._db = StateDB.open(self._db_path, memory_max_mb=self.memory_max_mb)
            self._opened_ms = millis(time.perf_counter() - start)

    def _load(self, version: int) -> StateDB:
        # Fast path: the local copy is applied only after its changelog was
        # uploaded, so a database already at ``version`` is committed state and no
        # listing of the remote directory is needed, whether it was open already or
        # was left by another worker process of this machine.
        self.open_local()
        local = None if self._db is None else self._local_version(self._db)
        if local == version:
            self._load_kind = "warm" if self._opened_ms is None else "handover"
            return self._db
        changelogs = self._changelogs()
        snapshots = self._snapshots()
        if version > 0 and version not in changelogs and version not in snapshots:
            latest = max(changelogs | snapshots, default=0)
            raise VersionNotFoundError(
                f"version {version} of {self._remote.uri} does not exist (latest is {latest})"
            )
        # a local copy behind the version catches up by replaying the changelog tail
        # (unless it holds another attempt's commit: then the tail does not continue
        # it, and a restore takes the committed lineage)
        if local is not None and local < version:
            tail = range(local + 1, version + 1)
            if all(v in changelogs for v in tail):
                try:
                    self._replay(self._db, local + 1)  # checked before anything is applied
                except LineageError as exc:
                    log.warning("sessionstore: local copy not reused: %s", exc)
                else:
                    for v in tail[1:]:
                        self._replay(self._db, v)
                    self._db.reload_stores()
                    self._load_kind = "replay"
                    return self._db
        self._restore(version, snapshots, changelogs)
        self._load_kind = "restore"
        return self._db

    def _changelog(self, version: int) -> tuple[dict[str, Any], Any]:
        """``(header, writes)`` of the changelog of ``version``."""
        try:
            data = read_changelog_file(self._remote.read, version)
        except FileNotFoundError as exc:
            raise VersionNotFoundError(
                f"changelog of version {version} is missing: {exc}"
            ) from None
        return decode_changelog(data, self._remote.where(changelog_name(version)), version)

    def _replay(self, db: StateDB, version: int) -> None:
        rel = changelog_name(version)
        header, buf = self._changelog(version)
        check_continues(header, commit_of(db), self._remote.where(rel), version)
        db.apply(buf)
        if committed_version(db) != version:
            raise SessionStoreError(
                f"{self._remote.uri}/{rel} did not bring the state to version {version}"
            )

    def _restore(self, version: int, snapshots: set[int], changelogs: set[int]) -> None:
        """Rebuild the local copy at ``version`` from remote files, all or nothing.

        From the newest snapshot at or below ``version``; when that snapshot is
        unusable (a file missing or corrupt, or it does not hold the commit the
        next changelog continues), from an older one, or from version 0, whose
        changelogs up to ``version`` are all retained: a *repair*, logged, kept in
        :attr:`repairs` and counted in the next commit's metrics (``repaired``).
        A broken changelog is not repaired: every older base needs it too.
        """
        bases = [*sorted((s for s in snapshots if s <= version), reverse=True), 0]
        bases = list(dict.fromkeys(bases))
        skipped: list[str] = []
        first: BaseException | None = None
        for i, base in enumerate(bases):
            if i and not all(v in changelogs for v in range(base + 1, version + 1)):
                continue  # the changelogs after this older base are not retained
            tmp = self._local.restore_dir(uuid.uuid4().hex)
            try:
                self._rebuild(database_in(tmp), base, version)
            except _UnusableSnapshot as unusable:
                shutil.rmtree(tmp, ignore_errors=True)
                skipped.append(f"snapshot {base}: {unusable.cause}")
                first = first or unusable.cause
                continue
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            if skipped:
                self._record_repair(version, base, skipped)
            if self._db is not None:
                self._db.close()
                self._db = None
            shutil.rmtree(self._db_path, ignore_errors=True)
            os.makedirs(self._local.root, exist_ok=True)
            os.replace(database_in(tmp), self._db_path)
            shutil.rmtree(tmp, ignore_errors=True)
            self._db = StateDB.open(self._db_path, memory_max_mb=self.memory_max_mb)
            return
        assert first is not None
        raise first

    def _rebuild(self, db_dir: str, base: int, version: int) -> None:
        """Download the snapshot of ``base`` (none for 0) into ``db_dir`` and replay
        the changelogs up to ``version``; :class:`_UnusableSnapshot` when the
        snapshot is what failed."""
        manifest: dict[str, Any] | None = None
        if base:
            self._progress("download snapshot", 0, 1)
            try:
                manifest = download_snapshot(self._remote, base, db_dir)
            except (CorruptSnapshotError, FileNotFoundError) as exc:
                raise _UnusableSnapshot(exc) from None
            self._progress("download snapshot", 1, 1)
        try:
            db = StateDB.open(db_dir, memory_max_mb=self.memory_max_mb)
        except Exception as exc:
            if not base:
                raise
            raise _UnusableSnapshot(exc) from None
        try:
            where = self._remote.where(manifest_name(base))
            if committed_version(db) != base:
                raise _UnusableSnapshot(
                    SessionStoreError(f"{where} holds version {committed_version(db)}")
                )
            if manifest is not None and manifest.get(COMMIT_FIELD) not in (None, commit_of(db)):
                raise _UnusableSnapshot(
                    LineageError(where, base, manifest.get(COMMIT_FIELD), commit_of(db))
                )
            for v in range(base + 1, version + 1):
                self._progress("replay changelogs", v - base - 1, version - base)
                try:
                    self._replay(db, v)
                except LineageError as exc:
                    if v == base + 1 and base:  # the snapshot holds another lineage
                        raise _UnusableSnapshot(exc) from None
                    raise
            self._progress("replay changelogs", version - base, version - base)
            # downloaded from this checkpoint, so it is this checkpoint's state,
            # whatever the snapshot's writer recorded
            db.put_meta(IDENTITY_KEY, self._identity)
        finally:
            db.close()

    def _record_repair(self, version: int, base: int, skipped: list[str]) -> None:
        source = f"snapshot {base}" if base else "version 0"
        message = (
            f"{self._remote.uri}: version {version} restored from {source} and the "
            f"changelogs after it, around {len(skipped)} unusable snapshot(s): "
            + "; ".join(skipped)
        )
        log.warning("sessionstore: repaired %s", message)
        self.repairs.append(message)
        self._repaired += 1

    # -------------------------------------------------------------- committing
    def _commit(self, handle: StoreHandle) -> int:
        start = time.perf_counter()
        db, version = handle.db, handle.version + 1
        adopted = self._checkpoint_id is None and self._adopt_id()
        parent, commit = commit_of(db), new_commit_id()
        db.put_meta(VERSION_KEY, encode_version(version))
        db.put_meta(COMMIT_KEY, commit.encode("ascii"))
        previous = db.get_meta(LAST_COMMIT_KEY)
        buf = db.prepare()
        stats = store_stats(db, handle.stores, buf)
        metrics = self._metrics(handle, version, stats, previous)
        header = {**handle.header, COMMIT_FIELD: commit, PARENT_FIELD: parent}
        data = encode_changelog(
            buf, self.operator_id, self.partition_id, version, stats, metrics, header
        )
        self._observe("prepared", version)
        prepared = time.perf_counter()
        winner = publish(self._remote, version, data, commit, parent, handle.arbiter)
        self._observe("uploaded", version)
        uploaded = time.perf_counter()
        if winner is None:
            db.apply(buf)
        else:
            self._adopt(db, version, winner.header, winner.writes)
        self._observe("applied", version)
        applied = time.perf_counter()
        timings = {
            "version": version,
            "prepare_ms": millis(prepared - start),
            "upload_ms": millis(uploaded - prepared),
            "apply_ms": millis(applied - uploaded),
        }
        # outside the batch: these records stay local (see IDENTITY_KEY, LAST_COMMIT_KEY)
        db.put_meta(LAST_COMMIT_KEY, msgpack.packb(timings))
        if adopted:
            db.put_meta(IDENTITY_KEY, self._identity)
        # only the winner snapshots a version: one writer per manifest, so a
        # manifest is never rewritten with other content
        if winner is None and version % self.snapshot_interval == 0:
            os.makedirs(self._local.snapshots, exist_ok=True)
            target = self._local.snapshot(version)
            shutil.rmtree(target, ignore_errors=True)
            db.checkpoint(target)  # hard links: the upload waits for maintenance
            # written once the snapshot is whole: whose state it is (never uploaded
            # by a provider of another checkpoint that shares this local_dir)
            write_snapshot_record(
                self._local.snapshot_record(version), SnapshotRecord(self._identity, commit)
            )
        metrics["uploaded_bytes"] += len(data)
        self.last_metrics = {**metrics, **timings, "commit_ms": millis(applied - start)}
        del self.last_metrics["previous"]
        return version

    def _adopt(self, db: StateDB, version: int, header: dict[str, Any], writes: Any) -> None:
        """Drop this attempt's writes and apply the winning attempt's commit of
        ``version`` instead (see lineage.py): it was built on the same version."""
        db.rollback()
        where = self._remote.where(changelog_name(version))
        check_continues(header, commit_of(db), where, version)
        db.apply(writes)
        db.reload_stores()
        if committed_version(db) != version:
            raise SessionStoreError(f"{where} did not bring the state to version {version}")
        log.warning(
            "sessionstore: %s: another attempt committed version %d first (commit %s); "
            "this attempt's writes are dropped and its state is that commit's",
            self._remote.uri, version, header.get(COMMIT_FIELD),
        )  # fmt: skip

    def _metrics(
        self, handle: StoreHandle, version: int, stats: dict[str, Any], previous: bytes | None
    ) -> dict[str, Any]:
        """The header metrics of committing ``version`` (see metrics.py), except the
        changelog's own size, which encoding adds."""
        last = None if previous is None else msgpack.unpackb(previous)
        if last is not None and last.get("version") != version - 1:
            last = None  # a record of an older commit (the copy caught up by replay)
        uploaded, self._snapshot_bytes = self._snapshot_bytes, 0
        retries = self._operator.retries
        retried, self._retries_seen = retries - self._retries_seen, retries
        repaired, self._repaired = self._repaired, 0
        return {
            "format": METRICS_FORMAT,
            "rows_total": sum(s["keys"] for s in stats.values()),
            "rows_updated": sum(s["updated"] for s in stats.values()),
            "rows_removed": sum(s["removed"] for s in stats.values()),
            "late_dropped": handle.noted["late_dropped"],
            "emitted": handle.noted["emitted"],
            "load_kind": self._load_kind,
            "load_ms": self._load_ms
            if handle.noted["load_ms"] is None
            else handle.noted["load_ms"],
            "uploaded_bytes": uploaded,
            # the snapshot of this version, if any, is taken after the commit
            "snapshot_lag": snapshot_lag(
                version, self.snapshot_interval, [*self._local.pending_snapshots(), version]
            ),
            "memory_bytes": process_native_memory(),
            "storage_retries": retried,
            "repaired": repaired,
            "previous": last,
        }

    def _observe(self, step: str, version: int) -> None:
        if self._observer is not None:
            self._observer(CommitStep(step, self.operator_id, self.partition_id, version))

    # ------------------------------------------------------------- maintenance
    def do_maintenance(self) -> dict[str, Any]:
        """Upload this checkpoint's pending snapshots, prune versions beyond
        ``retain_versions`` and delete files no retained snapshot uses (after the
        orphan grace). Returns what was done: ``snapshots`` uploaded,
        ``uploaded_bytes``, ``deleted`` names, ``foreign`` pending snapshots dropped."""
        os.makedirs(self._local.root, exist_ok=True)
        # One maintenance at a time per partition on this machine: a background
        # upload and a later task's maintenance must not race (the orphan sweep
        # could delete files of a snapshot whose manifest is not written yet).
        with open(self._local.maintenance_lock, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return self._maintain()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _maintain(self) -> dict[str, Any]:
        report: dict[str, Any] = {
            "snapshots": [], "uploaded_bytes": 0, "deleted": [], "foreign": [],
        }  # fmt: skip
        # One listing of the content files serves the uploads, the check of the new
        # base and the orphan sweep. It comes before the listing of the manifests,
        # so a manifest written meanwhile is seen by the sweep.
        stored = self._remote.stamps(FILES_DIR)
        changelogs = self._files.changelog_files()
        self._read_manifests(self._files.snapshot_stamps())
        snapshots = set(self._manifests)
        # content a listed manifest uses: the only content an upload may skip (a
        # listed file nothing uses may be about to go; it is uploaded again)
        used = set().union(*(referenced(m) for _, m in self._manifests.values()))
        present = set(stored)
        for version in self._local.pending_snapshots():
            manifest = self._upload_pending(version, used, report)
            if manifest is not None:
                snapshots.add(version)
                used |= referenced(manifest)
                present |= referenced(manifest)
        latest = max(set(changelogs) | snapshots, default=0)
        oldest_kept = latest - self.retain_versions + 1
        # Prune only below a base whose every file is stored (the listing above, no
        # extra request): if the newest candidate lost a file, the older snapshots
        # and changelogs stay, and a restore repairs around it.
        base = next(
            (
                v for v in sorted(snapshots, reverse=True)
                if v <= oldest_kept
                and "format" in self._manifests[v][1]  # readable
                and referenced(self._manifests[v][1]) <= present
            ),
            None,
        )  # fmt: skip
        if base is not None:
            for v in sorted(snapshots):
                if v < base:
                    self._remote.delete(manifest_name(v))
                    report["deleted"].append(manifest_name(v))
                    snapshots.discard(v)
                    del self._manifests[v]
            report["deleted"] += self._prune_changelogs(changelogs, base)
        used = set().union(*(referenced(m) for _, m in self._manifests.values()))
        for name in self._sweep.due(stored, used, time.monotonic()):
            self._remote.delete(content_name(name))
            report["deleted"].append(content_name(name))
        return report

    def _read_manifests(self, stamps: dict[int, Any]) -> None:
        """Bring the manifest cache in line with the listing ``stamps``: manifests
        gone are dropped, new ones read. A manifest is written once, by the winner
        of its version from its one local snapshot (or again with the same bytes
        by a retried upload), so a cached one stays right; a stamp that changed
        (a legitimately replaced commit) is read again all the same."""
        for v in list(self._manifests):
            if v not in stamps:
                del self._manifests[v]
        for v, stamp in stamps.items():
            if v not in self._manifests or self._manifests[v][0] != stamp:
                try:
                    self._manifests[v] = (stamp, read_manifest(self._remote, v))
                except FileNotFoundError:  # pruned by another executor since the listing
                    self._manifests.pop(v, None)
                except CorruptSnapshotError as exc:
                    # never a base; its files go unless another manifest uses them,
                    # and restores repair around it
                    log.warning("sessionstore: %s", exc)
                    self._manifests[v] = (stamp, {})

    def _upload_pending(
        self, version: int, used: set[str], report: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Upload the pending local snapshot of ``version`` if it is this
        checkpoint's and not stored yet (content in ``used`` is skipped); drop it
        either way. Its manifest, or None when nothing was uploaded."""
        path, record_path = self._local.snapshot(version), self._local.snapshot_record(version)
        record = read_snapshot_record(record_path)
        manifest = None
        if record is None or not self._is_own(record.identity):
            # left by a provider of another checkpoint that shared this local_dir
            # (one deleted and created again at the same URI, say), or by a
            # release that recorded no owner: never uploaded as this one's
            report["foreign"].append(version)
        elif (self._manifests.get(version) or (None, {}))[1].get(COMMIT_FIELD) != record.commit:
            # (else a retry after an upload that finished: already there)
            manifest = upload_snapshot(
                self._remote, path, version, known=used, commit=record.commit
            )
            uploaded = manifest.pop("uploaded_bytes")
            # the listing of the next maintenance gives its stamp (None never matches)
            self._manifests[version] = (None, manifest)
            report["snapshots"].append(version)
            report["uploaded_bytes"] += uploaded
            self._snapshot_bytes += uploaded
        # a failed upload raised above: the snapshot stays for the next maintenance
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(record_path):
            os.unlink(record_path)
        return manifest

    def _is_own(self, identity: bytes) -> bool:
        """Whether ``identity`` (a pending snapshot's record) is this provider's
        checkpoint copy; on a mismatch the recorded id is read again (see
        :meth:`_owns`)."""
        if identity != self._identity:
            try:
                self._checkpoint_id = self._read_metadata().get(CHECKPOINT_ID_FIELD)
            except FileNotFoundError:
                return False
        return identity == self._identity

    def _prune_changelogs(self, changelogs: dict[int, str], base: int) -> list[str]:
        """Delete the changelogs of versions up to ``base`` (which has a snapshot):
        a whole group folder once every version of it is at most ``base``, a flat
        changelog of an earlier release one by one. Returns what went."""
        deleted = []
        groups: dict[str, list[int]] = {}
        for v, name in changelogs.items():
            if name == changelog_name(v):
                groups.setdefault(changelog_group(v), []).append(v)
            elif v <= base:
                self._remote.delete(name)
                deleted.append(name)
        for group, versions in sorted(groups.items()):
            last_of_group = (max(versions) // CHANGELOG_GROUP + 1) * CHANGELOG_GROUP - 1
            if last_of_group <= base:
                self._remote.delete_dir(group)
                deleted.append(group)
        return deleted

    def close(self) -> None:
        """Abort any open handle and close the local database."""
        if self._handle is not None:
            self._handle.abort()
            self._handle = None
        if self._db is not None:
            self._db.close()
            self._db = None
