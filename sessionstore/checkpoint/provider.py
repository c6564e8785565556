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
when complete: a store is never returned partly restored.

Identity: a checkpoint is known by the ``checkpoint_id`` in its operator's
``_metadata`` (a random id written when the checkpoint is created, or with the
first commit of a checkpoint written before ids existed), not by the spelling of
its URI. A local database records the id and the location of the copy it came
from; it is used only by a provider of that same checkpoint at that same place,
so two checkpoints sharing a ``local_dir`` and an operator name never read each
other's state. Snapshots and changelogs carry no owner: whatever is downloaded from
a checkpoint belongs to it, which is what lets a checkpoint be reached by any
spelling of its URI, or copied to another folder or bucket.
"""

from __future__ import annotations

import fcntl
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
from sessionstore.checkpoint.metrics import METRICS_FORMAT, millis, snapshot_lag
from sessionstore.checkpoint.private_dir import private_dir
from sessionstore.checkpoint.processing_time import PROCESSING_TIME_FIELD
from sessionstore.checkpoint.snapshot import (
    download_snapshot,
    read_manifest,
    referenced,
    upload_snapshot,
)
from sessionstore.checkpoint.spec import StoreSpec
from sessionstore.encoding.serde import PickleSerde
from sessionstore.engine.db import process_native_memory
from sessionstore.engine.memory import check_memory_max_mb
from sessionstore.engine.write_buffer import WriteBuffer
from sessionstore.errors import SessionStoreError
from sessionstore.stores.base import check_store_name, is_data_family
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
        if local is not None and local < version:
            tail = range(local + 1, version + 1)
            if all(v in changelogs for v in tail):
                for v in tail:
                    self._replay(self._db, v)
                self._db.reload_stores()
                self._load_kind = "replay"
                return self._db
        self._restore(version, snapshots)
        self._load_kind = "restore"
        return self._db

    def _replay(self, db: StateDB, version: int) -> None:
        rel = changelog_name(version)
        try:
            data = read_changelog_file(self._remote.read, version)
        except FileNotFoundError as exc:
            raise VersionNotFoundError(
                f"changelog of version {version} is missing: {exc}"
            ) from None
        _, buf = decode_changelog(data, f"{self._remote.uri}/{rel}", version)
        db.apply(buf)
        if committed_version(db) != version:
            raise SessionStoreError(
                f"{self._remote.uri}/{rel} did not bring the state to version {version}"
            )

    def _restore(self, version: int, snapshots: set[int]) -> None:
        """Rebuild the local copy at ``version`` from remote files, all or nothing."""
        base = max((s for s in snapshots if s <= version), default=0)
        tmp = self._local.restore_dir(uuid.uuid4().hex)
        try:
            db_dir = database_in(tmp)
            if base:
                self._progress("download snapshot", 0, 1)
                download_snapshot(self._remote, base, db_dir)
                self._progress("download snapshot", 1, 1)
            db = StateDB.open(db_dir, memory_max_mb=self.memory_max_mb)
            try:
                if committed_version(db) != base:
                    raise SessionStoreError(
                        f"snapshot {base} of {self._remote.uri} holds version "
                        f"{committed_version(db)}"
                    )
                for v in range(base + 1, version + 1):
                    self._progress("replay changelogs", v - base - 1, version - base)
                    self._replay(db, v)
                self._progress("replay changelogs", version - base, version - base)
                # downloaded from this checkpoint, so it is this checkpoint's state,
                # whatever the snapshot's writer recorded
                db.put_meta(IDENTITY_KEY, self._identity)
            finally:
                db.close()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if self._db is not None:
            self._db.close()
            self._db = None
        shutil.rmtree(self._db_path, ignore_errors=True)
        os.makedirs(self._local.root, exist_ok=True)
        os.replace(db_dir, self._db_path)
        shutil.rmtree(tmp, ignore_errors=True)
        self._db = StateDB.open(self._db_path, memory_max_mb=self.memory_max_mb)

    # -------------------------------------------------------------- committing
    def _commit(self, handle: StoreHandle) -> int:
        start = time.perf_counter()
        db, version = handle.db, handle.version + 1
        adopted = self._checkpoint_id is None and self._adopt_id()
        db.put_meta(VERSION_KEY, encode_version(version))
        previous = db.get_meta(LAST_COMMIT_KEY)
        buf = db.prepare()
        stats = store_stats(db, handle.stores, buf)
        metrics = self._metrics(handle, version, stats, previous)
        data = encode_changelog(
            buf, self.operator_id, self.partition_id, version, stats, metrics, handle.header
        )
        self._observe("prepared", version)
        prepared = time.perf_counter()
        self._remote.write_atomic(changelog_name(version), data)
        self._observe("uploaded", version)
        uploaded = time.perf_counter()
        db.apply(buf)
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
        if version % self.snapshot_interval == 0:
            os.makedirs(self._local.snapshots, exist_ok=True)
            target = self._local.snapshot(version)
            shutil.rmtree(target, ignore_errors=True)
            db.checkpoint(target)  # hard links: the upload waits for maintenance
        metrics["uploaded_bytes"] += len(data)
        self.last_metrics = {**metrics, **timings, "commit_ms": millis(applied - start)}
        del self.last_metrics["previous"]
        return version

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
            "previous": last,
        }

    def _observe(self, step: str, version: int) -> None:
        if self._observer is not None:
            self._observer(CommitStep(step, self.operator_id, self.partition_id, version))

    # ------------------------------------------------------------- maintenance
    def do_maintenance(self) -> dict[str, Any]:
        """Upload pending snapshots, prune versions beyond ``retain_versions`` and
        delete files no retained snapshot uses. Returns what was done."""
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
        report: dict[str, Any] = {"snapshots": [], "uploaded_bytes": 0, "deleted": []}
        # one listing of the content files serves the uploads (what is there
        # already) and the orphan sweep (what may go)
        stored = set(self._remote.list(FILES_DIR))
        known = set(stored)
        for version in self._local.pending_snapshots():
            path = self._local.snapshot(version)
            manifest = upload_snapshot(self._remote, path, version, known=known)
            known |= referenced(manifest)
            report["snapshots"].append(version)
            report["uploaded_bytes"] += manifest["uploaded_bytes"]
            self._snapshot_bytes += manifest["uploaded_bytes"]
            shutil.rmtree(path, ignore_errors=True)
        changelogs, stamps = self._files.changelog_files(), self._files.snapshot_stamps()
        snapshots = set(stamps)
        latest = max(set(changelogs) | snapshots, default=0)
        oldest_kept = latest - self.retain_versions + 1
        base = max((s for s in snapshots if s <= oldest_kept), default=None)
        if base is not None:
            for v in sorted(snapshots):
                if v < base:
                    self._remote.delete(manifest_name(v))
                    report["deleted"].append(manifest_name(v))
                    snapshots.discard(v)
            report["deleted"] += self._prune_changelogs(changelogs, base)
        for v in list(self._manifests):
            if v not in snapshots:
                del self._manifests[v]
        used = set()
        for v in snapshots:
            # Not the manifest this provider wrote: another writer of the same
            # version (a speculative task) may have replaced it, and the sweep must
            # keep the files of the manifest that is stored. A stamp that changed
            # since the read means such a rewrite: read it again.
            if v not in self._manifests or self._manifests[v][0] != stamps[v]:
                self._manifests[v] = (stamps[v], read_manifest(self._remote, v))
            used |= referenced(self._manifests[v][1])
        for name in sorted(stored - used):
            self._remote.delete(content_name(name))
            report["deleted"].append(content_name(name))
        return report

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
