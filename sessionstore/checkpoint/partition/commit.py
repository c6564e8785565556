"""Committing a partition's next version: the handle that collects it, the commit
protocol and the metrics each commit records.

The stores write into one batch of the local StateDB; at commit the batch (stores'
metadata and ``committed_version = N`` included) is serialised as changelog N and
uploaded atomically. **That upload is the commit point.** Only then is the same
batch written to the local RocksDB. A crash before the upload leaves version N-1
everywhere; a crash after it leaves the local copy one version behind, and the
next load replays changelog N. A ``commit_observer`` sees each step
(``prepared``, ``uploaded``, ``applied``): for metrics, tracing, or a test that
injects a failure there, as Spark's tests plug a failure-injecting file manager in.

Lineage (lineage.py): every commit has a unique id, recorded in its changelog with
its parent's. Of two attempts committing one version the first to publish wins (a
local ``link``, the driver's coordinator as arbiter on object stores, or a look
before writing) and a later one adopts the winner's commit instead of replacing it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from sessionstore.checkpoint.partition.identity import CheckpointPartition
from sessionstore.checkpoint.partition.lineage import (
    COMMIT_FIELD,
    PARENT_FIELD,
    CommitArbiter,
    SnapshotRecord,
    new_commit_id,
    publish,
    write_snapshot_record,
)
from sessionstore.checkpoint.partition.load import replay_changelog
from sessionstore.checkpoint.records.changelog import encode_changelog
from sessionstore.checkpoint.records.deadlines import DUE_EVENT_FIELD, DUE_PROCESSING_FIELD
from sessionstore.checkpoint.records.event_time import EVENT_TIME_FIELD
from sessionstore.checkpoint.records.layout import (
    COMMIT_KEY,
    IDENTITY_KEY,
    LAST_COMMIT_KEY,
    VERSION_KEY,
    changelog_name,
    commit_of,
    encode_version,
)
from sessionstore.checkpoint.records.metrics import METRICS_FORMAT, millis, snapshot_lag
from sessionstore.checkpoint.records.processing_time import PROCESSING_TIME_FIELD
from sessionstore.checkpoint.storage.filesystem import Storage
from sessionstore.checkpoint.storage.private_dir import private_dir
from sessionstore.engine.db import process_native_memory
from sessionstore.engine.write_buffer import WriteBuffer
from sessionstore.errors import SessionStoreError
from sessionstore.stores.base import is_data_family
from sessionstore.stores.state_db import StateDB

if TYPE_CHECKING:
    from sessionstore.checkpoint.partition.load import PartitionLoader
    from sessionstore.checkpoint.partition.maintenance import Maintenance

__all__ = [
    "COMMIT_STEPS",
    "CommitObserver",
    "CommitStep",
    "Committer",
    "StoreHandle",
    "store_stats",
]

log = logging.getLogger(__name__)

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
    """The stores of one partition loaded at ``version``, collecting the next version.

    ``commit(handle)`` makes the next version durable (the provider's
    :class:`Committer`)."""

    def __init__(
        self,
        version: int,
        db: StateDB,
        stores: dict[str, Any],
        commit: Callable[[StoreHandle], int],
    ) -> None:
        self._commit = commit
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

    @property
    def is_open(self) -> bool:
        """Whether neither :meth:`commit` nor :meth:`abort` was called yet."""
        return self._open

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

    def note_deadlines(self, processing_ms: int | None, event_ms: int | None) -> None:
        """Record in the commit's changelog header when the partition next has work
        without input: the earliest processing time and shared event time at
        which a batch fires a timer or expires a value (see deadlines.py)."""
        self.header[DUE_PROCESSING_FIELD] = processing_ms
        self.header[DUE_EVENT_FIELD] = event_ms

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
        return self._commit(self)

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


class Committer:
    """The commits of one partition: changelog upload (the commit point), local
    apply, the snapshot every ``snapshot_interval`` versions, and their metrics.

    ``loader`` and ``maintenance`` are asked for what the metrics report of them
    (how the state was loaded, repairs, uploaded snapshot bytes); ``operator`` is
    the operator's storage, whose retried requests the metrics count."""

    def __init__(
        self,
        partition: CheckpointPartition,
        operator: Storage,
        operator_id: str,
        partition_id: int,
        snapshot_interval: int,
        loader: PartitionLoader,
        maintenance: Maintenance,
        observer: CommitObserver | None = None,
    ) -> None:
        self._operator, self._remote = operator, partition.remote
        self._local, self._identity = partition.local, partition.identity
        self._operator_id, self._partition_id = operator_id, partition_id
        self._snapshot_interval = snapshot_interval
        self._loader, self._maintenance = loader, maintenance
        self._observer = observer
        self._retries_seen = 0  # the storage's retried requests at the last commit
        #: the metrics of the last commit, its timings included (after a commit)
        self.last_metrics: dict[str, Any] | None = None

    def commit(self, handle: StoreHandle) -> int:
        """Make ``handle.version + 1`` durable, then local; returns it.

        A commit that fails, at whichever step, leaves the provider as if it had not
        started (invariant 10 of DESIGN.md): its writes, and what the stores hold in
        memory of them (a stream time), are dropped, so a load of ``handle.version``
        sees exactly that version. A version published before the failure stays
        committed (its changelog is the commit point); when the local database
        applied it too, a load of ``handle.version`` restores that version, and a
        retry adopts the published commit."""
        try:
            return self._commit(handle)
        except BaseException:
            try:
                handle.db.rollback()
                handle.db.reload_stores()
            except Exception:  # the next load finds out (it restores if need be)
                log.warning("sessionstore: dropping a failed commit failed", exc_info=True)
            raise

    def _commit(self, handle: StoreHandle) -> int:
        start = time.perf_counter()
        db, version = handle.db, handle.version + 1
        adopted = self._identity.checkpoint_id is None and self._identity.adopt()
        parent, commit = commit_of(db), new_commit_id()
        db.put_meta(VERSION_KEY, encode_version(version))
        db.put_meta(COMMIT_KEY, commit.encode("ascii"))
        previous = db.get_meta(LAST_COMMIT_KEY)
        buf = db.prepare()
        stats = store_stats(db, handle.stores, buf)
        metrics = self.metrics(handle, version, stats, previous)
        header = {**handle.header, COMMIT_FIELD: commit, PARENT_FIELD: parent}
        data = encode_changelog(
            buf, self._operator_id, self._partition_id, version, stats, metrics, header
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
            db.put_meta(IDENTITY_KEY, self._identity.record)
        # only the winner snapshots a version: one writer per manifest, so a
        # manifest is never rewritten with other content
        if winner is None and version % self._snapshot_interval == 0:
            self._snapshot(db, version, commit)
        metrics["uploaded_bytes"] += len(data)
        self.last_metrics = {**metrics, **timings, "commit_ms": millis(applied - start)}
        del self.last_metrics["previous"]
        return version

    def _snapshot(self, db: StateDB, version: int, commit: str) -> None:
        """Take the local snapshot of ``version``; maintenance uploads it."""
        private_dir(self._local.snapshots, base=self._local.base)
        target, staging = self._local.snapshot(version), self._local.snapshot_staging(version)
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
        db.checkpoint(staging)  # hard links: the upload waits for maintenance
        # written once the snapshot is whole: whose state it is (never uploaded
        # by a provider of another checkpoint that shares this local_dir)
        write_snapshot_record(
            self._local.snapshot_record(version), SnapshotRecord(self._identity.record, commit)
        )
        # pending only now, its record beside it: a maintenance running meanwhile
        # (a background upload) would take a snapshot without one for a foreign one
        os.rename(staging, target)

    def _adopt(self, db: StateDB, version: int, header: dict[str, Any], writes: Any) -> None:
        """Drop this attempt's writes and apply the winning attempt's commit of
        ``version`` instead (see lineage.py): it was built on the same version."""
        db.rollback()
        replay_changelog(db, self._remote.where(changelog_name(version)), version, header, writes)
        db.reload_stores()
        log.warning(
            "sessionstore: %s: another attempt committed version %d first (commit %s); "
            "this attempt's writes are dropped and its state is that commit's",
            self._remote.uri, version, header.get(COMMIT_FIELD),
        )  # fmt: skip

    def metrics(
        self, handle: StoreHandle, version: int, stats: dict[str, Any], previous: bytes | None
    ) -> dict[str, Any]:
        """The header metrics of committing ``version`` (see metrics.py), except the
        changelog's own size, which encoding adds. ``previous`` is the local record
        of the last commit's timings. It takes the counts since the last commit
        (retries, repairs, uploaded snapshot bytes)."""
        last = None if previous is None else msgpack.unpackb(previous)
        if last is not None and last.get("version") != version - 1:
            last = None  # a record of an older commit (the copy caught up by replay)
        retries = self._operator.retries
        retried, self._retries_seen = retries - self._retries_seen, retries
        loader = self._loader
        return {
            "format": METRICS_FORMAT,
            "rows_total": sum(s["keys"] for s in stats.values()),
            "rows_updated": sum(s["updated"] for s in stats.values()),
            "rows_removed": sum(s["removed"] for s in stats.values()),
            "late_dropped": handle.noted["late_dropped"],
            "emitted": handle.noted["emitted"],
            "load_kind": loader.kind,
            "load_ms": loader.load_ms
            if handle.noted["load_ms"] is None
            else handle.noted["load_ms"],
            "uploaded_bytes": self._maintenance.take_uploaded_bytes(),
            # the snapshot of this version, if any, is taken after the commit
            "snapshot_lag": snapshot_lag(
                version, self._snapshot_interval, [*self._local.pending_snapshots(), version]
            ),
            "memory_bytes": process_native_memory(),
            "storage_retries": retried,
            "repaired": loader.take_repaired(),
            "previous": last,
        }

    def _observe(self, step: str, version: int) -> None:
        if self._observer is not None:
            self._observer(CommitStep(step, self._operator_id, self._partition_id, version))
