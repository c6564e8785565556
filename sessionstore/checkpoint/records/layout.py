"""Every name of a checkpoint, remote and local, and its meta keys: the one place
that spells them (everything else asks this module).

Remote, under the checkpoint URI (object storage)::

    <checkpoint_uri>/
      <operator>/
        _metadata                    msgpack map: format, operator_id, num_partitions,
                                     stores (their specs), checkpoint_id (the
                                     checkpoint's identity, see identity.py),
                                     key_types (Spark types of the key columns
                                     the operator partitions by, see
                                     repartition.py), key_groups (the partition
                                     count, when num_partitions slabs hold the
                                     partitions: identity.py), change (an
                                     offline change committed, not yet applied:
                                     change.py)
        event_time/<batch>/<partition>   int64: a partition's event time after a batch,
                                     for a partition with no changelog of that
                                     version to carry it (a repartitioned copy's
                                     first version; else it is in the changelog
                                     header): event_time.py
        initial_state/<token>/<partition>   Arrow IPC: a transform_with_state
                                     partition's initial state, written when the
                                     query is planned before any partition
                                     committed (token: that planning), read by the
                                     partition's task of the first batch, deleted
                                     by the first planning after batch 1
        initial_state/<token>/complete   empty, written after every partition's
                                     object: that planning's copy is whole
        _generations/<id>/           the state after a rescale on restart, a checkpoint
                                     root of its own, named by ``_metadata``
                                     (generation.py); beside, ``<source>-v<V>-<ns>.claim``
        _fenced                      msgpack: the version fenced in a state a rescale
                                     replaced; its partitions keep only
                                     ``changelog/<G>/<V>.changelog``, a fence, not a
                                     changelog (fence.py)
        _changes/<id>/<partition>.manifest   an offline change's staged manifest
                                     (change.py), loadable only once applied
        _audit/<time>-<id>.json      JSON: one record per applied offline change
                                     (counts and a hash, never user keys)
        <partition>/                 a decimal partition number
          changelog/<G>/<N>.changelog  every write of version N (see changelog.py); its
                                     upload is the commit point of version N. G is
                                     N // CHANGELOG_GROUP: pruning deletes a whole
                                     group with one listing and one bulk delete.
          snapshot/<N>.manifest      the files of the snapshot of version N (see
                                     snapshot.py); written last, so it is the snapshot
          files/<sha256>             snapshot files by content, shared by snapshots;
                                     a snapshot's small files go in one pack, itself
                                     a content file
          .<name>.<uuid>.tmp         an upload in progress or killed: never read

Local, under an executor's ``local_dir`` (one partition's working copy)::

    <local_dir>/
      <operator>/
        <partition>/
          db/                        the RocksDB database (has RocksDB's CURRENT file)
          owner                      pid of the process holding db (store_service.py)
          maintenance.lock           flock: one snapshot upload/prune at a time
          snapshots/<N>/             RocksDB checkpoint of version N (hard links), until
                                     uploaded; built as snapshots/.<N>.staging (RocksDB
                                     via .<N>.staging.tmp), renamed once its record
                                     below is written
          snapshots/<N>.lineage      msgpack: the checkpoint identity and commit id
                                     whose state snapshots/<N> holds (lineage.py),
                                     written once it is whole; without it, or of
                                     another checkpoint, the snapshot is never uploaded
        <partition>.restore-<uuid>/db   a restore in progress, renamed to db when whole
        <partition>.restore-<uuid>.lock held by the restoring process; a scratch whose
                                     lock is free is a dead one's, swept (leftovers.py)

Meta keys of a local database (:meth:`StateDB.get_meta`):

* ``committed_version``: int64 big-endian, the version the database holds. It is
  written into the commit's batch, so every changelog carries it too.
* ``checkpoint_identity``: msgpack ``[checkpoint id, location of the partition]``,
  local only (never in a changelog): which checkpoint's copy the database is.
* ``commit``: the id of the commit whose state the database holds (ASCII; see
  lineage.py). Written into the commit's batch, so every changelog (and so every
  snapshot) carries it; absent in state written before lineage.
* ``last_commit``: msgpack map, local only: the timings of the commit that brought
  the database to its version, reported in the next changelog's header (a changelog
  cannot hold its own upload time; see metrics.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import msgpack

from sessionstore.checkpoint.records.changelog import read_changelog_header
from sessionstore.checkpoint.storage.filesystem import Storage
from sessionstore.encoding.ints import INT64
from sessionstore.errors import SessionStoreError

T = TypeVar("T")

__all__ = [
    "FENCED_MARKER",
    "PartitionFiles",
    "METADATA",
    "CHECKPOINT_ID_FIELD",
    "KEY_TYPES_FIELD",
    "KEY_GROUPS_FIELD",
    "BOOTSTRAP_FIELD",
    "EVENT_TIME_DIR",
    "INITIAL_STATE_DIR",
    "CHANGELOG_DIR",
    "SNAPSHOT_DIR",
    "FILES_DIR",
    "VERSION_KEY",
    "IDENTITY_KEY",
    "COMMIT_KEY",
    "LAST_COMMIT_KEY",
    "commit_of",
    "CHANGELOG_GROUP",
    "changelog_name",
    "changelog_group",
    "read_changelog_file",
    "newest_committed",
    "partition_changelog_header",
    "manifest_name",
    "content_name",
    "event_time_name",
    "initial_state_name",
    "initial_state_complete_name",
    "initial_state_tokens",
    "operators",
    "partitions",
    "read_metadata",
    "write_metadata",
    "encode_version",
    "committed_version",
    "LocalPartition",
    "database_in",
    "owner_file",
    "is_database",
    "local_databases",
]

# ------------------------------------------------------------------- remote
METADATA = "_metadata"
#: The field of an operator's ``_metadata`` that holds the checkpoint's id.
CHECKPOINT_ID_FIELD = "checkpoint_id"
#: The field of an operator's ``_metadata`` that holds the Spark types of the key
#: columns its input is hash-partitioned by, in order (``["string", "long"]``).
KEY_TYPES_FIELD = "key_types"
#: The field of an operator's ``_metadata`` that holds its partition count when its
#: partitions are kept in fewer databases (``num_partitions`` of them, each a
#: *slab*: see identity.py). Absent: each partition is a database of its own.
KEY_GROUPS_FIELD = "key_groups"
#: The ``_metadata`` field of an offline change committed but not yet applied
#: (change.py): every provider refuses the operator while it is there.
CHANGE_FIELD = "change"
#: The ``_metadata`` field of an operator whose version 0 was bootstrapped
#: (offline/bootstrap.py): ``{"event_time": ms or None, ...}``, the shared event
#: time its batch 0 starts from (the history's, as if it had been batch -1).
BOOTSTRAP_FIELD = "bootstrap"
#: ``<operator>/_changes/<id>/<partition>.manifest``: a change's staged manifests.
CHANGES_DIR = "_changes"
#: ``<operator>/_audit/<time>-<id>.json``: one record per applied change.
AUDIT_DIR = "_audit"
EVENT_TIME_DIR = "event_time"
#: Beside the partitions of a state a rescale on restart replaced (fence.py).
FENCED_MARKER = "_fenced"
#: Marks an operator whose Spark query reads a due source
#: (spark_integration/planning/due_batches.py): Spark refuses a restart whose
#: sources differ from its checkpoint's, so the choice holds for the checkpoint's life.
DUE_BATCHES_MARKER = "due_batches"
#: Initial state of transform_with_state, per planning and partition.
INITIAL_STATE_DIR = "initial_state"
#: The object that marks a planning's initial state as whole (not a partition number).
_INITIAL_STATE_COMPLETE = "complete"
CHANGELOG_DIR = "changelog"
SNAPSHOT_DIR = "snapshot"
FILES_DIR = "files"
_CHANGELOG_SUFFIX = ".changelog"
_MANIFEST_SUFFIX = ".manifest"


#: Versions per changelog folder. On S3 a single delete costs three requests
#: (pyarrow sends a HEAD before the DELETE and recreates the parent's marker after
#: it), a folder's worth costs about five whatever its size (a listing and one
#: DeleteObjects): pruning goes a group at a time. A group leaves only once all its
#: versions left retention, so up to CHANGELOG_GROUP - 1 extra changelogs stay.
CHANGELOG_GROUP = 10


def changelog_group(version: int) -> str:
    """``changelog/<group>``: the folder of the changelog of ``version``."""
    return f"{CHANGELOG_DIR}/{version // CHANGELOG_GROUP}"


def changelog_name(version: int) -> str:
    """``changelog/<group>/<version>.changelog``, relative to a partition: where the
    changelog of ``version`` is written."""
    return f"{changelog_group(version)}/{version}{_CHANGELOG_SUFFIX}"


def manifest_name(version: int) -> str:
    """``snapshot/<version>.manifest``, relative to a partition."""
    return f"{SNAPSHOT_DIR}/{version}{_MANIFEST_SUFFIX}"


def content_name(sha256: str) -> str:
    """``files/<sha256>``, relative to a partition."""
    return f"{FILES_DIR}/{sha256}"


def event_time_name(batch_id: int, partition: int | None = None) -> str:
    """``event_time/<batch>/<partition>`` relative to an operator (the batch's folder
    when ``partition`` is None)."""
    folder = f"{EVENT_TIME_DIR}/{batch_id}"
    return folder if partition is None else f"{folder}/{partition}"


def initial_state_name(token: str, partition: int) -> str:
    """``initial_state/<token>/<partition>`` relative to an operator: the initial
    state of ``partition`` as the query's planning ``token`` wrote it."""
    return f"{INITIAL_STATE_DIR}/{token}/{partition}"


def initial_state_complete_name(token: str) -> str:
    """``initial_state/<token>/complete`` relative to an operator: written once
    every partition's object of planning ``token`` is, so the copy is whole."""
    return f"{INITIAL_STATE_DIR}/{token}/{_INITIAL_STATE_COMPLETE}"


def initial_state_tokens(operator_storage: Storage) -> list[str]:
    """The tokens of the whole initial-state copies (with their ``complete``
    object) under an operator: one recursive listing."""
    return sorted(
        name.split("/")[0]
        for name in operator_storage.list_files(INITIAL_STATE_DIR)
        if name.count("/") == 1 and name.endswith(f"/{_INITIAL_STATE_COMPLETE}")
    )


def read_changelog_file(read: Callable[[str], T], version: int) -> T:
    """``read(name)`` of the changelog of ``version``, relative to its partition
    (``FileNotFoundError`` if it has none)."""
    return read(changelog_name(version))


def partition_changelog_header(
    operator_storage: Storage, partition: int, version: int
) -> dict[str, Any]:
    """The header of ``partition``'s changelog of ``version``, relative to an
    operator (one ranged read, two for a large header); ``FileNotFoundError`` if
    that version has no changelog."""
    return read_changelog_file(
        lambda name: read_changelog_header(operator_storage, f"{partition}/{name}", guess=2048),
        version,
    )


def recorded_time(header: dict[str, Any], field: str) -> int | None:
    """A time a partition recorded in its changelog ``header`` as ``field`` (None
    when it recorded none)."""
    value = header.get(field)
    if value is None:
        return None
    if type(value) is not int:  # no release writes anything else (bool is not a time)
        raise SessionStoreError(
            f"a changelog header records {field} = {value!r:.80}, not a time in ms: the "
            "changelog was not written by sessionstore"
        )
    return value


def operators(root: Storage) -> list[str]:
    """Operators (directories with a ``_metadata`` file) under a checkpoint root."""
    return [d for d in root.list_dirs() if root.exists(f"{d}/{METADATA}")]


def partitions(root: Storage, operator: str) -> list[int]:
    """The partitions of ``operator`` that have a directory under a checkpoint root."""
    return sorted(int(d) for d in root.list_dirs(operator) if d.isdigit())


def read_metadata(operator_storage: Storage) -> dict[str, Any]:
    """An operator's ``_metadata`` (``FileNotFoundError`` if it has none)."""
    return msgpack.unpackb(operator_storage.read(METADATA), raw=False)


def write_metadata(operator_storage: Storage, metadata: dict[str, Any]) -> None:
    """Replace an operator's ``_metadata`` atomically."""
    operator_storage.write_atomic(METADATA, msgpack.packb(metadata))


def _versions(names: list[str], suffix: str) -> set[int]:
    return {int(n[: -len(suffix)]) for n in names if n.endswith(suffix)}


class PartitionFiles:
    """The remote files of one operator partition, read-only: versions and sizes."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def changelogs(self) -> set[int]:
        """Versions with a changelog (one recursive listing)."""
        return set(self.changelog_files())

    def changelog_files(self) -> dict[int, str]:
        """``version -> name`` of every changelog, relative to the partition."""
        found = {}
        for rel in self.storage.list_files(CHANGELOG_DIR):
            parts = rel.split("/")
            name = parts[-1]
            if (
                not name.endswith(_CHANGELOG_SUFFIX)
                or not name[: -len(_CHANGELOG_SUFFIX)].isdigit()
            ):
                continue
            if len(parts) == 2 and parts[0].isdigit():
                found[int(name[: -len(_CHANGELOG_SUFFIX)])] = f"{CHANGELOG_DIR}/{rel}"
        return found

    def snapshots(self) -> set[int]:
        return _versions(self.storage.list(SNAPSHOT_DIR), _MANIFEST_SUFFIX)

    def snapshot_stamps(self) -> dict[int, tuple[int | None, int | None]]:
        """``version -> (size, modification time)`` of every manifest (one listing):
        a manifest rewritten since (a speculative task's snapshot of the same
        version) shows another stamp."""
        return {
            int(n[: -len(_MANIFEST_SUFFIX)]): stamp
            for n, stamp in self.storage.stamps(SNAPSHOT_DIR).items()
            if n.endswith(_MANIFEST_SUFFIX) and n[: -len(_MANIFEST_SUFFIX)].isdigit()
        }

    def latest(self) -> int:
        """The newest committed version (0 when nothing was committed)."""
        return max(self.changelogs() | self.snapshots(), default=0)

    def loadable(self) -> list[int]:
        """Versions that can be loaded: those with a snapshot, or a changelog that
        follows a loadable version (0, the empty state, always is)."""
        changelogs, snapshots = self.changelogs(), self.snapshots()
        ok = {0}
        for v in range(1, max(changelogs | snapshots, default=0) + 1):
            if v in snapshots or (v in changelogs and v - 1 in ok):
                ok.add(v)
        return sorted(ok - {0})

    def bytes_used(self) -> int:
        total = 0
        for folder in (CHANGELOG_DIR, SNAPSHOT_DIR, FILES_DIR):
            total += sum(
                self.storage.size(f"{folder}/{n}") for n in self.storage.list_files(folder)
            )
        return total


#: Partitions listed side by side by :func:`newest_committed`.
_LIST_THREADS = 16


def newest_committed(
    operator_storage: Storage, num_partitions: int, enough: int | None = None
) -> int:
    """The newest version any of an operator's ``num_partitions`` partitions
    committed (0 when none did; :meth:`PartitionFiles.latest` of each).

    An operator without ``_metadata`` has none, at the cost of one look-up: a
    provider writes it before its first commit and refuses state without it.
    Partition 0 is listed first, and when it has ``enough`` the others are not;
    else they are listed side by side."""
    if not operator_storage.exists(METADATA):
        return 0

    def latest(partition: int) -> int:
        return PartitionFiles(operator_storage.child(str(partition))).latest()

    first = latest(0)
    if num_partitions <= 1 or (enough is not None and first >= enough):
        return first
    with ThreadPoolExecutor(min(_LIST_THREADS, num_partitions - 1)) as pool:
        return max(first, *pool.map(latest, range(1, num_partitions)))


# ---------------------------------------------------------------- meta keys
VERSION_KEY = b"committed_version"
#: Which checkpoint a local database belongs to: msgpack ``[checkpoint id, location
#: of the partition]``. Two queries may share a local_dir and an operator name, and
#: one must never take the other's state. Written to the local database alone, never
#: into a changelog.
IDENTITY_KEY = b"checkpoint_identity"
#: The id of the commit whose state a local database holds (see lineage.py):
#: written in the commit's batch, so changelogs and snapshots carry it.
COMMIT_KEY = b"commit"
#: The timings of the commit that brought a local database to its version, for the
#: next changelog's header. Local only, written after the commit's batch.
LAST_COMMIT_KEY = b"last_commit"


def encode_version(version: int) -> bytes:
    """The value of :data:`VERSION_KEY` for ``version``."""
    return INT64.pack(version)


def committed_version(db: Any) -> int:
    """The committed version a :class:`StateDB` holds (0 for a new database)."""
    raw = db.get_meta(VERSION_KEY)
    return 0 if raw is None else INT64.unpack(raw)[0]


def commit_of(db: Any) -> str | None:
    """The commit id a :class:`StateDB` holds (None for state written before
    lineage, and for version 0)."""
    raw = db.get_meta(COMMIT_KEY)
    return None if raw is None else raw.decode("ascii")


# -------------------------------------------------------------------- local
_DB = "db"
_OWNER = "owner"


class LocalPartition:
    """The local paths of one operator partition under ``local_dir``."""

    def __init__(self, local_dir: str | os.PathLike[str], operator: str, partition: int) -> None:
        #: the local_dir itself (the top of what must stay private)
        self.base = os.fspath(local_dir)
        self.root = os.path.join(self.base, operator, str(partition))
        self.db = database_in(self.root)
        self.maintenance_lock = os.path.join(self.root, "maintenance.lock")
        self.snapshots = os.path.join(self.root, "snapshots")

    def snapshot(self, version: int) -> str:
        """Where the local checkpoint of ``version`` waits for its upload."""
        return os.path.join(self.snapshots, str(version))

    def snapshot_staging(self, version: int) -> str:
        """Where the local checkpoint of ``version`` is built and given its record,
        before it is renamed to :meth:`snapshot`: a name maintenance never lists, so
        it never meets a pending snapshot without its record."""
        return os.path.join(self.snapshots, f".{version}.staging")

    def snapshot_record(self, version: int) -> str:
        """The lineage record beside the pending snapshot of ``version``."""
        return os.path.join(self.snapshots, f"{version}.lineage")

    def pending_snapshots(self) -> list[int]:
        """Versions whose local checkpoint is complete, ascending (digits only:
        RocksDB builds a checkpoint in ``<N>.tmp`` and renames it)."""
        if not os.path.isdir(self.snapshots):
            return []
        return sorted(int(n) for n in os.listdir(self.snapshots) if n.isdigit())

    def restore_dir(self, token: str) -> str:
        """A scratch directory beside the partition's, for a restore (``<dir>/db``)."""
        return f"{self.root}.restore-{token}"


def database_in(folder: str) -> str:
    """The database directory of a partition's folder (or of a restore's scratch)."""
    return os.path.join(folder, _DB)


def owner_file(db_path: str) -> str:
    """The ``owner`` file beside a local database."""
    return os.path.join(os.path.dirname(db_path), _OWNER)


def is_database(path: str) -> bool:
    """Whether ``path`` is a RocksDB database directory (RocksDB writes CURRENT)."""
    return os.path.isfile(os.path.join(path, "CURRENT"))


def local_databases(path: str) -> dict[tuple[str, int], str]:
    """``(operator, partition) -> database directory`` for a local_dir, an operator
    directory or a single database directory (any other database is partition 0 of
    an operator named after its directory)."""
    path = os.path.abspath(path)
    if is_database(path):
        parent = os.path.dirname(path)
        if os.path.basename(path) == _DB and os.path.basename(parent).isdigit():
            operator = os.path.basename(os.path.dirname(parent))
            return {(operator, int(os.path.basename(parent))): path}
        return {(os.path.basename(path), 0): path}
    found = {}
    for part in _digit_dirs(path):
        db = os.path.join(path, part, _DB)
        if is_database(db):
            found[(os.path.basename(path), int(part))] = db
    if found:
        return found
    for operator in sorted(os.listdir(path)) if os.path.isdir(path) else []:
        for part in _digit_dirs(os.path.join(path, operator)):
            db = os.path.join(path, operator, part, _DB)
            if is_database(db):
                found[(operator, int(part))] = db
    return found


def _digit_dirs(path: str) -> list[str]:
    if not os.path.isdir(path):
        return []
    return [d for d in os.listdir(path) if d.isdigit() and os.path.isdir(os.path.join(path, d))]
