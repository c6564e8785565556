"""Rescale a checkpoint: the state of one operator at version V, moved from its M
partitions to N, as a new checkpoint a query restarted with ``num_partitions=N``
loads as version V (and continues with batch V).

Engine-agnostic pieces, used alike by ``sessionstore repartition`` (one process,
:func:`repartition_checkpoint`) and the Spark job
(``spark_integration.repartition_state``, which runs :func:`routed_rows` in one task
per source partition and a :class:`TargetWriter` in one task per target):

1. :func:`plan_repartition` checks everything and writes nothing: the operator
   exists, V is loadable in every source partition, the key columns' Spark types
   are known (the checkpoint's ``key_types``, or given), the target is empty.
2. :func:`routed_rows` loads version V of one source partition through the
   provider (as ``sessionstore restore`` and ``dump`` do) and yields every row of
   every column family with the target partition of the key it belongs to. The
   key comes from the store kind's ``row_key`` hook (registry.py), the partition
   from Spark's hash partitioning of the key columns (encoding/spark_hash.py). Meta
   entries go to every target.
3. A :class:`TargetWriter` per target partition writes its rows into a new
   database, merges the meta entries (stream times and the operators' times: the
   minimum over the sources; everything else must agree), sets the committed version to V and
   uploads it as the snapshot of version V.
4. :func:`finish_repartition` writes the operator's shared event time after batch
   V-1 (what batch V reads) and, last, ``_metadata`` with the new partition count
   and a new checkpoint id. A checkpoint without ``_metadata`` is refused by every
   provider, so a run that dies earlier leaves nothing a query could mistake for a
   complete checkpoint.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import msgpack

from sessionstore.checkpoint.partition.provider import FORMAT, StateStoreProvider
from sessionstore.checkpoint.records.event_time import MissingEventTimeError, durable_event_time
from sessionstore.checkpoint.records.generation import state_root
from sessionstore.checkpoint.records.layout import (
    CHECKPOINT_ID_FIELD,
    COMMIT_KEY,
    DUE_BATCHES_MARKER,
    IDENTITY_KEY,
    KEY_GROUPS_FIELD,
    KEY_TYPES_FIELD,
    LAST_COMMIT_KEY,
    VERSION_KEY,
    PartitionFiles,
    database_in,
    encode_version,
    event_time_name,
    operators,
    read_metadata,
    write_metadata,
)
from sessionstore.checkpoint.records.layout import (
    partitions as listed_partitions,
)
from sessionstore.checkpoint.records.snapshot import upload_snapshot
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from sessionstore.encoding.ints import INT64
from sessionstore.encoding.keys import decode_key
from sessionstore.encoding.spark_hash import KeyRouter, check_key_types
from sessionstore.engine.db import META_CF
from sessionstore.errors import SessionStoreError
from sessionstore.stores.base import DEFAULT_KEY_SERDE, aux_key, stream_time_key
from sessionstore.stores.registry import row_key_of, row_splitter_of
from sessionstore.stores.spec import StoreSpec, record_of_family, refuse_pickle
from sessionstore.stores.state_db import StateDB

__all__ = [
    "RepartitionError",
    "RepartitionPlan",
    "plan_repartition",
    "routed_rows",
    "TargetWriter",
    "carry_event_time",
    "summary",
    "finish_repartition",
    "copy_partitions",
    "repartition_checkpoint",
]

#: Meta entries of a local database that no snapshot of the new checkpoint carries:
#: the committed version is set to V, the identity and the last commit's timings
#: belong to the copy they were written in, and the commit id to its lineage (the
#: new checkpoint's first commits continue an unknown parent, lineage.py).
_LOCAL_META = frozenset({VERSION_KEY, IDENTITY_KEY, LAST_COMMIT_KEY, COMMIT_KEY})
#: The operators' per-partition times kept next to a store (``aux:<store>:<name>``,
#: int64), merged like the stores' stream times: the minimum over the source
#: partitions, so a target resumes as its most lagging source did (why:
#: docs/rescale.md). True: a source without the entry wins (the target has none).
#: Any other meta entry must be equal in every source that has it.
_AUX_TIMES: dict[str, bool] = {
    "stream_time": False,  # sessions, windows: the largest timestamp seen
    "join_stream_time": False,  # window join: the same
    "emitted_close": True,  # sessions, final: none means nothing emitted yet
    "early_tick": False,  # windows' early results
}
_CHUNK = 65_536  # rows routed at once (one vectorised hash per chunk)

#: ``progress(label, done, total)``
Progress = Callable[[str, int, int], None]


class RepartitionError(SessionStoreError, ValueError):
    """A repartition that cannot be done as asked (nothing was written)."""


@dataclass(frozen=True)
class RepartitionPlan:
    """What a repartition reads and writes; picklable (it ships to Spark tasks)."""

    source_uri: str
    operator: str
    version: int
    source_partitions: int
    target_uri: str
    partitions: int
    key_types: tuple[str, ...]
    #: the source's ``_metadata``
    metadata: dict[str, Any]
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    target_storage_options: dict[str, Any] | None = field(default=None, repr=False)
    #: the user trusts the source's pickled stores (see refuse_pickle)
    allow_pickle: bool = False
    #: the target's partition count when its ``partitions`` databases are slabs
    #: holding more (identity.py); None: a partition per database
    key_groups: int | None = None

    def source(self) -> Storage:
        """The source operator's directory."""
        return open_filesystem(self.source_uri, self.storage_options).child(self.operator)

    def target(self) -> Storage:
        """The target operator's directory."""
        return open_filesystem(self.target_uri, self.target_storage_options).child(self.operator)


def plan_repartition(
    uri: str,
    operator: str,
    partitions: int,
    to: str,
    version: int | None = None,
    key_types: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    target_storage_options: dict[str, Any] | None = None,
    allow_pickle: bool = False,
    key_groups: int | None = None,
) -> RepartitionPlan:
    """Check a repartition of ``operator`` at ``uri`` to ``partitions`` partitions at
    ``to`` (version ``version``, default the latest every partition has) and return
    its plan. Reads only; :class:`RepartitionError` names what is wrong.

    ``key_types`` (Spark type names of the key columns, in order) are needed only
    for checkpoints that do not record them (written before they were recorded);
    given for one that does, they must agree. ``target_storage_options`` default to
    ``storage_options``. A source with a pickled store is refused unless
    ``allow_pickle`` (:func:`~sessionstore.stores.spec.refuse_pickle`).
    ``key_groups``: the target's partition count when its ``partitions``
    databases are slabs holding more (a multiple of ``partitions``; identity.py).
    """
    if type(partitions) is not int or partitions < 1:
        raise RepartitionError(f"the partition count must be a positive int, got {partitions!r}")
    if key_groups is not None and (
        type(key_groups) is not int or key_groups < 1 or key_groups % partitions
    ):
        raise RepartitionError(
            f"the partition count {key_groups!r} must be a positive multiple of the "
            f"{partitions} slabs"
        )
    if version is not None and (type(version) is not int or version < 1):
        raise RepartitionError(f"version must be a positive int, got {version!r}")
    root = open_filesystem(uri, storage_options)
    try:
        metadata = read_metadata(root.child(operator))
    except FileNotFoundError:
        known = ", ".join(operators(root)) or "none"
        raise RepartitionError(f"no operator {operator!r} in {uri} (operators: {known})") from None
    source = state_root(uri, operator, storage_options, metadata)  # after a rescale
    if source != uri:
        uri, root = source, open_filesystem(source, storage_options)
        metadata = read_metadata(root.child(operator))
    if metadata.get("format") != FORMAT:
        raise RepartitionError(
            f"{uri}/{operator} has checkpoint format {metadata.get('format')}; this "
            f"sessionstore repartitions format {FORMAT}"
        )
    refuse_pickle(metadata.get("stores") or [], f"{uri}/{operator}", allow_pickle)
    types = _key_types(metadata.get(KEY_TYPES_FIELD), key_types, f"{uri}/{operator}")
    count = metadata.get("num_partitions")
    if count is None:  # written by a provider that was not told the count
        found = listed_partitions(root, operator)
        count = max(found) + 1 if found else 0
    if not count:
        raise RepartitionError(f"operator {operator!r} in {uri} has no partitions")
    version = _version(root.child(operator), count, version, f"{uri}/{operator}")
    target_storage_options = (
        storage_options if target_storage_options is None else target_storage_options
    )
    # the operator's directory: a query's operators may be moved one by one into one
    # new checkpoint root
    if open_filesystem(to, target_storage_options).has_files(operator):
        raise RepartitionError(
            f"the target {to}/{operator} exists and is not empty; repartition into a new location"
        )
    return RepartitionPlan(
        uri, operator, version, count, to, partitions, types, metadata,
        storage_options, target_storage_options, allow_pickle,
        None if key_groups == partitions else key_groups,
    )  # fmt: skip


def _key_types(recorded: list[str] | None, given: list[str] | None, where: str) -> tuple[str, ...]:
    try:
        given_types = None if given is None else check_key_types(given)
        recorded_types = None if recorded is None else check_key_types(recorded)
    except ValueError as exc:
        raise RepartitionError(f"{where}: {exc}") from None
    if recorded_types is None and given_types is None:
        raise RepartitionError(
            f"{where} does not record the Spark types of its key columns (written before "
            "sessionstore recorded them); give them in order with --key-types, e.g. "
            "--key-types string,long"
        )
    if recorded_types is not None and given_types is not None and given_types != recorded_types:
        raise RepartitionError(
            f"--key-types {','.join(given_types)} disagrees with the key types {where} "
            f"records: {','.join(recorded_types)}"
        )
    return recorded_types or given_types  # type: ignore[return-value]


def _version(operator: Storage, count: int, version: int | None, where: str) -> int:
    """``version`` if every partition can load it, else the newest they all can."""
    loadable = {p: PartitionFiles(operator.child(str(p))).loadable() for p in range(count)}
    if version is None:
        empty = [p for p, versions in loadable.items() if not versions]
        if empty:
            raise RepartitionError(
                f"{where}: partition {empty[0]} has no committed version to repartition"
            )
        version = min(max(versions) for versions in loadable.values())
    for p, versions in loadable.items():
        if version not in versions:
            span = f"{versions[0]}..{versions[-1]}" if versions else "none"
            raise RepartitionError(
                f"version {version} of {where} is not loadable in partition {p} (loadable: {span})"
            )
    return version


# ------------------------------------------------------------------ routing
class _Router:
    """Target partition of encoded keys, each key decoded and hashed once (a key
    has many rows)."""

    def __init__(self, key_types: tuple[str, ...], partitions: int) -> None:
        self._keys = KeyRouter(key_types, partitions)
        self._cache: dict[bytes, int] = {}

    def targets(self, encoded: list[bytes], where: str) -> list[int]:
        cache = self._cache
        missing = list({kb for kb in encoded if kb not in cache})
        if missing:
            try:
                ids = self._keys.partitions_of([decode_key(kb) for kb in missing])
            except ValueError as exc:
                raise RepartitionError(f"{where}: {exc}") from None
            cache.update(zip(missing, ids, strict=True))
        return [cache[kb] for kb in encoded]


def routed_rows(
    plan: RepartitionPlan, partition: int, workdir: str
) -> Iterator[tuple[int, str, bytes, bytes]]:
    """``(target partition, column family, key, value)`` for every row of version
    ``plan.version`` of source ``partition`` (restored under ``workdir``); its meta
    entries as one row (a msgpack list of pairs) for every target partition."""
    records = {r["name"]: r for r in plan.metadata["stores"]}
    specs = [StoreSpec.from_record(r, plan.allow_pickle) for r in plan.metadata["stores"]]
    where = f"{plan.source_uri}/{plan.operator}/{partition}"
    provider = StateStoreProvider(
        plan.source_uri, plan.operator, partition, specs, workdir,
        storage_options=plan.storage_options,
    )  # fmt: skip
    try:
        handle = provider.get_store(plan.version)
        handle.abort()  # opening stores may write into the batch: read what is committed
        db, router = handle.db, _Router(plan.key_types, plan.partitions)
        for family in db.column_families():
            if family == META_CF:
                meta = msgpack.packb(list(db.scan(META_CF)))
                for target in range(plan.partitions):
                    yield target, META_CF, b"", meta
                continue
            store, _, suffix = family.partition(".")
            record = record_of_family(family, records, where, RepartitionError)
            if record.get("key_serde", DEFAULT_KEY_SERDE) != DEFAULT_KEY_SERDE:
                raise RepartitionError(
                    f"{where}: store {store!r} keeps its keys with the serde "
                    f"{record['key_serde']!r}, not as the operator's key columns; it "
                    "cannot be routed"
                )
            try:
                row_key = row_key_of(record["kind"])
                split = row_splitter_of(record["kind"], suffix)
            except ValueError as exc:
                raise RepartitionError(f"{where}: {exc}") from None
            rows = db.scan(family)
            while chunk := list(islice(rows, _CHUNK)):
                if split is not None:  # a row of several keys' data: one row per key
                    try:
                        chunk = [row for key, value in chunk for row in split(key, value)]
                    except SessionStoreError as exc:
                        raise RepartitionError(f"{where} store {store!r}: {exc}") from None
                encoded = [row_key(suffix, key) for key, _ in chunk]
                targets = router.targets(encoded, f"{where} store {store!r}")
                for (key, value), target in zip(chunk, targets, strict=True):
                    yield target, family, key, value
    finally:
        provider.close()


# ------------------------------------------------------------------ writing
class TargetWriter:
    """The new database of one target partition: rows in any order, then
    :meth:`finish` uploads it as the snapshot of version ``plan.version``.

    The result depends only on the set of rows received, never on their order, so
    the CLI and the Spark job (whose shuffle orders rows as it likes) write the
    same database contents.
    """

    def __init__(
        self, plan: RepartitionPlan, partition: int, workdir: str, flush_rows: int = 50_000
    ) -> None:
        self.plan, self.partition = plan, partition
        #: rows held in memory before they are written to the database
        self.flush_rows = flush_rows
        self.rows = 0
        self._dir = os.path.join(workdir, f"target-{partition}")
        #: opened at the first flush, with the families its rows need (one write
        #: of RocksDB's options file for them all, not one each)
        self._db: StateDB | None = None
        self._closed = False
        self._pending: dict[str, dict[bytes, bytes]] = {}
        self._buffered = 0
        self._meta: dict[bytes, bytes] = {}
        stores = [r["name"] for r in plan.metadata["stores"]]
        #: int64 times merged by their minimum -> whether a source without one wins
        self._times = {
            aux_key(store, name): absent_wins
            for store in stores
            for name, absent_wins in _AUX_TIMES.items()
        }
        self._times.update({stream_time_key(store): False for store in stores})
        #: times some source lacks whose absence wins
        self._absent: set[bytes] = set()

    def add(self, family: str, key: bytes, value: bytes) -> None:
        """One routed row (the meta family: one row per source partition, holding
        its entries, so that an entry a source lacks is seen missing)."""
        if family == META_CF:
            entries = dict(msgpack.unpackb(value))
            for meta_key, absent_wins in self._times.items():
                if absent_wins and meta_key not in entries:
                    self._absent.add(meta_key)
            for meta_key, meta_value in entries.items():
                self._add_meta(meta_key, meta_value)
            return
        self._pending.setdefault(family, {})[key] = value
        self.rows += 1
        self._buffered += 1
        if self._buffered >= self.flush_rows:
            self._flush()

    def _add_meta(self, key: bytes, value: bytes) -> None:
        if key in _LOCAL_META:
            return
        seen = self._meta.get(key)
        if seen is None or seen == value:
            self._meta[key] = value
            return
        if key in self._times:
            self._meta[key] = INT64.pack(min(INT64.unpack(seen)[0], INT64.unpack(value)[0]))
        else:
            raise RepartitionError(
                f"the source partitions of {self.plan.operator!r} disagree on the meta entry "
                f"{key!r} ({seen!r:.80} vs {value!r:.80}); it cannot be merged"
            )

    def _open(self) -> StateDB:
        if self._closed:
            raise RepartitionError(f"target partition {self.partition}'s writer is closed")
        if self._db is None:
            self._db = StateDB.open(database_in(self._dir), families=list(self._pending))
        return self._db

    def _flush(self) -> StateDB:
        """Write the pending rows (opening the database at the first flush); the
        database."""
        db = self._open()
        for family in self._pending:
            db.create_column_family(family)  # nothing to do where it exists
        with db.batch():
            for family, entries in self._pending.items():
                db.bulk_writer(family).update(entries)
        self._pending, self._buffered = {}, 0
        return db

    def finish(self) -> dict[str, Any]:
        """Write the merged meta entries and version, upload the snapshot and
        remove the local copy. Returns ``{"partition", "rows"}``."""
        self.seal()
        return self.upload()

    def seal(self, commit: str | None = None) -> StateDB:
        """Write the merged meta entries, the version and, given, the id of the
        commit whose state this is: the database is then the target's state at
        ``plan.version`` (returned, open until :meth:`upload` or :meth:`close`)."""
        db = self._flush()
        with db.batch():
            for key, value in sorted(self._meta.items()):
                if key not in self._absent:
                    db.put_meta(key, value)
            db.put_meta(VERSION_KEY, encode_version(self.plan.version))
            if commit is not None:
                db.put_meta(COMMIT_KEY, commit.encode("ascii"))
        return db

    def upload(self, commit: str | None = None) -> dict[str, Any]:
        """Upload the sealed database as the snapshot of ``plan.version`` (its
        manifest naming ``commit``) and remove the local copy. Returns
        ``{"partition", "rows"}``."""
        db = self._db
        assert db is not None
        snapshot = os.path.join(self._dir, "snapshot")
        db.checkpoint(snapshot)
        self.close()
        target = self.plan.target().child(str(self.partition))
        upload_snapshot(target, snapshot, self.plan.version, commit=commit)
        shutil.rmtree(self._dir, ignore_errors=True)
        return {"partition": self.partition, "rows": self.rows}

    def close(self) -> None:
        """Close the database (idempotent); the writer takes nothing more."""
        self._closed = True
        if self._db is not None:
            self._db.close()
            self._db = None


def carry_event_time(plan: RepartitionPlan) -> int | None:
    """Copy the operator's shared event time after batch ``version - 1`` (what batch
    ``version``, the restarted query's first, reads) to the target: the largest
    time any source partition recorded, written for every target partition. Returns
    it, or None when the source has none (an operator without shared event time, or
    a version whose changelogs were already pruned).

    The target's partitions start from snapshots, with no changelog of ``version``
    to carry the record, so it goes in the per-partition file that
    :func:`~sessionstore.checkpoint.records.event_time.partition_event_time` reads for a
    partition without that changelog. The one place that knows how event time is
    carried (event_time.py)."""
    batch = plan.version - 1
    try:
        shared = durable_event_time(plan.source(), batch, plan.source_partitions)
    except MissingEventTimeError:
        return None
    if shared is not None:
        target = plan.target()
        for partition in range(plan.partitions):
            target.write_atomic(event_time_name(batch, partition), INT64.pack(shared))
    return shared


def finish_repartition(plan: RepartitionPlan) -> tuple[int | None, str]:
    """After every target partition's snapshot: the event time, then, last,
    ``_metadata`` (the new partition count, key types and a new checkpoint id: the
    copy is a checkpoint of its own). Returns ``(event time, checkpoint id)``."""
    shared = carry_event_time(plan)
    checkpoint_id = uuid.uuid4().hex
    metadata = {
        **{k: v for k, v in plan.metadata.items() if k != KEY_GROUPS_FIELD},
        "num_partitions": plan.partitions,
        KEY_TYPES_FIELD: list(plan.key_types),
        CHECKPOINT_ID_FIELD: checkpoint_id,
    }
    if plan.key_groups is not None:
        metadata[KEY_GROUPS_FIELD] = plan.key_groups
    if plan.source().exists(DUE_BATCHES_MARKER):  # the query's sources stay as they were
        plan.target().write_atomic(DUE_BATCHES_MARKER, plan.source().read(DUE_BATCHES_MARKER))
    write_metadata(plan.target(), metadata)
    return shared, checkpoint_id


def repartition_checkpoint(
    uri: str,
    operator: str,
    partitions: int,
    to: str,
    version: int | None = None,
    key_types: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    target_storage_options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    allow_pickle: bool = False,
) -> dict[str, Any]:
    """Repartition in this process (``sessionstore repartition``): see
    :func:`plan_repartition` for the arguments. Source partitions are read one at
    a time; every target partition's database, opened at its first flush, stays
    open until the end.

    Returns ``{"operator", "version", "from_partitions", "partitions", "rows",
    "event_time", "checkpoint_id"}``."""
    plan = plan_repartition(
        uri, operator, partitions, to, version, key_types, storage_options,
        target_storage_options, allow_pickle,
    )  # fmt: skip
    rows = copy_partitions(plan, progress)
    shared, checkpoint_id = finish_repartition(plan)
    return summary(plan, rows, shared, checkpoint_id)


def copy_partitions(plan: RepartitionPlan, progress: Progress | None = None) -> int:
    """Write every target partition of ``plan`` in this process (source partitions
    read one at a time; every target's database open from its first flush to the
    end) and return the rows written; :func:`finish_repartition` completes the
    copy."""
    report = progress or (lambda label, done, total: None)
    with tempfile.TemporaryDirectory(prefix="sessionstore-repartition-") as workdir:
        writers: list[TargetWriter] = []
        try:
            # every target's buffer fills at once here: bound them together
            flush = max(1_000, 500_000 // plan.partitions)
            writers = [TargetWriter(plan, t, workdir, flush) for t in range(plan.partitions)]
            source_dir = os.path.join(workdir, "source")
            for partition in range(plan.source_partitions):
                report("source partitions", partition, plan.source_partitions)
                for target, family, key, value in routed_rows(plan, partition, source_dir):
                    writers[target].add(family, key, value)
                shutil.rmtree(source_dir, ignore_errors=True)
            report("source partitions", plan.source_partitions, plan.source_partitions)
            rows = 0
            for done, writer in enumerate(writers):
                report("target snapshots", done, plan.partitions)
                rows += writer.finish()["rows"]
            report("target snapshots", plan.partitions, plan.partitions)
        finally:
            for writer in writers:
                writer.close()
    return rows


def summary(
    plan: RepartitionPlan, rows: int, event_time: int | None, checkpoint_id: str
) -> dict[str, Any]:
    """What a repartition reports (the CLI and the Spark job alike)."""
    return {
        "operator": plan.operator,
        "version": plan.version,
        "from_partitions": plan.source_partitions,
        "partitions": plan.partitions,
        "rows": rows,
        "event_time": event_time,
        "checkpoint_id": checkpoint_id,
    }
