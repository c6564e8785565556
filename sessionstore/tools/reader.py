"""Read-only access to sessionstore state: operators, partitions and store rows.

Shared by the ``sessionstore`` CLI and the ``sessionstore`` Spark data source. Two
kinds of source, both opened with :func:`open_source`:

* a **checkpoint root** in object storage (``file://``, a path, ``s3://``, ...):
  a version is restored from the checkpoint into a temporary directory;
* a **local database directory** of a running (or stopped) job: an executor's
  ``local_dir``, one operator's directory below it, or one database directory.
  It is opened as a RocksDB secondary instance, which takes no lock and writes
  nothing into the job's directory, so the job keeps writing while it is read.

Either way, stores are read inside a batch that is rolled back: opening a store
may want to expire segments or record its spec, and those writes never land.
Rows are streamed: memory stays flat however large the store.

A store in which an aggregating operator recorded its output plan (sessions,
time windows, count windows with built-in aggregates) holds accumulators; its
rows show the operator's output instead, as :class:`Aggregates` (``raw=True``
reads the stored form).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlparse

from sessionstore.checkpoint.partition.identity import layout_of
from sessionstore.checkpoint.partition.provider import StateStoreProvider, store_stats
from sessionstore.checkpoint.records.changelog import read_changelog_header
from sessionstore.checkpoint.records.generation import state_root
from sessionstore.checkpoint.records.layout import (
    KEY_GROUPS_FIELD,
    KEY_TYPES_FIELD,
    PartitionFiles,
    committed_version,
    local_databases,
    operators,
    partitions,
    read_changelog_file,
    read_metadata,
)
from sessionstore.checkpoint.records.metrics import summarize_batch, task_records
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from sessionstore.checkpoint.storage.first_contact import reach
from sessionstore.encoding.spark_hash import KeyRouter
from sessionstore.engine.write_buffer import WriteBuffer
from sessionstore.errors import SessionStoreError
from sessionstore.operators.aggregations import recorded_output, recorded_time_type
from sessionstore.stores.registry import kinds_with, store_class
from sessionstore.stores.spec import StoreSpec, refuse_pickle
from sessionstore.stores.state_db import StateDB
from sessionstore.tools import row_chunks
from sessionstore.tools.processor_rows import has_ttl
from sessionstore.tools.row_chunks import RowChunk, chunks_of, limited, rows_of

#: How a CLI user opts in to reading pickled stores (the data source names its own).
PICKLE_OPTION = "--allow-pickle"

__all__ = [
    "Aggregates",
    "NotFoundError",
    "RowFilter",
    "CheckpointSource",
    "LocalSource",
    "open_source",
    "store_rows",
    "store_chunks",
    "presented_rows",
    "presented_chunks",
    "processor_declarations",
    "variable_declaration",
    "operators",
    "operator_metadata",
    "partitions",
    "store_kind",
]

#: ``progress(label, done, total)``: called as long operations advance.
Progress = Callable[[str, int, int], None]


class NotFoundError(SessionStoreError, LookupError):
    """An operator, store, partition or key that the source does not have."""


class Aggregates(dict):
    """A row's value finished by its store's recorded output plan: each aggregate's
    result by name, as the operator emits it (flat formats show one column each)."""


class Instant(int):
    """An event time (epoch milliseconds) of a store whose operator shows its times
    as timestamps (its output plan says so): an int everywhere, a timestamp column
    where a format has types (Parquet)."""

    __slots__ = ()


def _instants(rows: Iterator[dict[str, Any]], columns: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    for row in rows:
        for c in columns:
            if row.get(c) is not None:
                row[c] = Instant(row[c])
        yield row


def _instant_chunks(chunks: Iterator[RowChunk], columns: tuple[str, ...]) -> Iterator[RowChunk]:
    """:func:`_instants` of chunks of rows."""
    for chunk in chunks:
        for c in columns:
            values = chunk.column(c)
            if values is not None:
                chunk = chunk.replace(c, [v if v is None else Instant(v) for v in values])
        yield chunk


# ----------------------------------------------------------- checkpoint metadata
def operator_metadata(root: Storage, operator: str) -> dict[str, Any]:
    """The recorded specs and partition count of ``operator``."""
    try:
        return read_metadata(root.child(operator))
    except FileNotFoundError:
        known = ", ".join(operators(root)) or "none"
        raise NotFoundError(
            f"no operator {operator!r} in {root.uri} (operators: {known})"
        ) from None


def store_kind(source: CheckpointSource | LocalSource, operator: str, store: str) -> str:
    """The kind of ``store`` of ``operator`` in any source."""
    return _kind_of(source.store_records(operator), operator, store)


def _kind_of(records: dict[str, dict[str, Any]], operator: str, store: str) -> str:
    if store not in records:
        raise NotFoundError(
            f"operator {operator!r} has no store {store!r} "
            f"(stores: {', '.join(sorted(records)) or 'none'})"
        )
    return records[store]["kind"]


# ------------------------------------------------------------------- sources
@dataclass
class PartitionInfo:
    """What ``sessionstore ls`` shows for one partition."""

    latest: int
    loadable: list[int]
    snapshots: list[int]
    bytes: int
    #: per store: ``{"stream_time": ms or None, "keys": estimate}``, or None if unknown
    stats: dict[str, dict[str, Any]] | None


class _PickleGuard:
    """What both sources share: refusing pickled stores (docs/security.md)."""

    uri: str
    allow_pickle: bool
    pickle_option: str

    def store_records(self, operator: str) -> dict[str, dict[str, Any]]:
        raise NotImplementedError

    def check_pickle(self, operator: str) -> None:
        """Refuse ``operator`` if a store of it is pickled and pickle is not allowed."""
        refuse_pickle(
            list(self.store_records(operator).values()), f"{self.uri}/{operator}",
            self.allow_pickle, self.pickle_option,
        )  # fmt: skip


class CheckpointSource(_PickleGuard):
    """State in object storage, restored version by version into a temporary directory."""

    local = False

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, Any] | None = None,
        allow_pickle: bool = False,
        pickle_option: str = PICKLE_OPTION,
        waiting: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.uri, self.storage_options = uri, storage_options
        # answered within a bounded time, or one line saying what to fix
        self.root = reach(uri, storage_options, waiting)
        self._records: dict[str, dict[str, dict[str, Any]]] = {}
        self._roots: dict[str, str] = {}
        self._state_records: dict[tuple[str, str], dict[str, Any]] = {}
        #: read stores recorded with the pickle serde (see refuse_pickle)
        self.allow_pickle, self.pickle_option = allow_pickle, pickle_option

    def operators(self) -> list[str]:
        return operators(self.root)

    def store_records(self, operator: str) -> dict[str, dict[str, Any]]:
        """The recorded store specs of ``operator`` by name (read once per source)."""
        if operator not in self._records:
            stores = operator_metadata(self.root, operator)["stores"]
            self._records[operator] = {r["name"]: r for r in stores}
        return self._records[operator]

    def state_uri(self, operator: str) -> str:
        """The checkpoint root holding ``operator``'s state: this one, or the
        generation its last rescale wrote (docs/rescale.md)."""
        if operator not in self._roots:
            metadata = operator_metadata(self.root, operator)
            self._roots[operator] = state_root(self.uri, operator, self.storage_options, metadata)
        return self._roots[operator]

    def pin(
        self,
        operator: str,
        state_uri: str,
        layout: tuple[int, int] | None = None,
        key_types: list[str] | None = None,
    ) -> None:
        """Read ``operator``'s state at ``state_uri`` (what :meth:`state_uri` gave
        earlier), whatever its ``_metadata`` names now, and with a ``layout``
        (:meth:`layout`) its rows named by it and ``key_types``: a read planned in
        one process and done in others reads the state it listed, as it listed it
        (the root's ``_metadata`` is a rescale's switch once one switched)."""
        self._roots[operator] = state_uri
        if layout is not None:
            slabs, count = layout
            self._state_records[(operator, state_uri)] = {
                "num_partitions": slabs, KEY_GROUPS_FIELD: count, KEY_TYPES_FIELD: key_types,
            }  # fmt: skip

    def _state(self, operator: str) -> Storage:
        uri = self.state_uri(operator)
        return self.root if uri == self.uri else open_filesystem(uri, self.storage_options)

    def partitions(self, operator: str) -> list[int]:
        """The databases of ``operator``'s state (its slabs: :meth:`layout`)."""
        return partitions(self._state(operator), operator)

    def layout(self, operator: str) -> tuple[int, int] | None:
        """``(slabs, partitions)`` of ``operator``'s state as read (the one
        :meth:`state_uri` names: identity.py, ``partitions`` partitions kept in
        ``slabs`` databases); None when it records no count."""
        return layout_of(self._state_metadata(operator))

    def key_types(self, operator: str) -> list[str] | None:
        """The Spark types of ``operator``'s key columns, as its state records them."""
        return self._state_metadata(operator).get(KEY_TYPES_FIELD)

    def _state_metadata(self, operator: str) -> dict[str, Any]:
        """The ``_metadata`` of the state :meth:`state_uri` names (read once per
        state): what a read planned in one process and done in others reads by."""
        key = (operator, self.state_uri(operator))
        if key not in self._state_records:
            self._state_records[key] = operator_metadata(self._state(operator), operator)
        return self._state_records[key]

    def info(self, operator: str, partition: int) -> PartitionInfo:
        files = PartitionFiles(self._state(operator).child(f"{operator}/{partition}"))
        latest = files.latest()
        stats = None
        if latest in files.changelogs():
            header = read_changelog_file(
                lambda name: read_changelog_header(files.storage, name), latest
            )
            stats = header.get("stats")
        return PartitionInfo(
            latest, files.loadable(), sorted(files.snapshots()), files.bytes_used(), stats
        )

    def batch_metrics(self, operator: str, last: int | None = None) -> list[dict[str, Any]]:
        """One row per micro-batch of ``operator`` (the ``last`` newest, else every
        retained one), its partitions' task metrics aggregated
        (:func:`~sessionstore.checkpoint.records.metrics.summarize_batch`), oldest first.

        Reads one listing per partition and the header of each changelog shown,
        plus the next one (which holds the commit time), with ranged reads run
        side by side (object stores answer each in tens of ms)."""
        from concurrent.futures import ThreadPoolExecutor

        state = self._state(operator)
        parts = {
            p: PartitionFiles(state.child(f"{operator}/{p}")) for p in self.partitions(operator)
        }
        with ThreadPoolExecutor(16) as pool:
            listed = dict(
                zip(parts, pool.map(lambda f: f.changelogs(), parts.values()), strict=True)
            )
            versions = sorted(set().union(*listed.values()))
            shown = versions[-last:] if last else versions
            wanted = [
                (p, v)
                for p, have in listed.items()
                for v in sorted(set(shown) | {v + 1 for v in shown})
                if v in have
            ]

            def header(item: tuple[int, int]) -> dict[str, Any] | None:
                try:
                    storage = parts[item[0]].storage
                    return read_changelog_file(
                        lambda name: read_changelog_header(storage, name), item[1]
                    )
                except FileNotFoundError:  # pruned since the listing
                    return None

            headers: dict[int, dict[int, dict]] = {p: {} for p in parts}
            for (p, v), head in zip(wanted, pool.map(header, wanted), strict=True):
                if head is not None:
                    headers[p][v] = head
        per_version: dict[int, list[dict[str, Any]]] = {v: [] for v in shown}
        for p, heads in headers.items():
            for v, record in task_records(heads, p).items():
                if v in per_version:
                    per_version[v].append(record)
        return [
            summarize_batch(operator, v - 1, records)
            for v, records in sorted(per_version.items())
            if records
        ]

    @contextmanager
    def open(
        self,
        operator: str,
        partition: int,
        version: int | None = None,
        progress: Progress | None = None,
        workdir: str | None = None,
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(version, stores by name)`` of one partition (default: the latest
        version), restored under ``workdir`` (default: a temporary directory, removed
        after) as ``<workdir>/<operator>/<partition>/db``; nothing is written back."""
        self.check_pickle(operator)
        specs = [
            StoreSpec.from_record(r, allow_pickle=True)  # checked above
            for r in self.store_records(operator).values()
        ]
        place = nullcontext(workdir) if workdir else tempfile.TemporaryDirectory(prefix="ss-read-")
        with place as workdir:
            provider = StateStoreProvider(
                self.state_uri(operator), operator, partition, specs, workdir,
                storage_options=self.storage_options, progress=progress,
            )  # fmt: skip
            try:
                handle = provider.get_store(
                    provider.latest_version() if version is None else version
                )
                yield handle.version, handle.stores
            finally:
                provider.close()


class LocalSource(_PickleGuard):
    """Live local databases (``<local_dir>/<operator>/<partition>/db``), read through
    RocksDB secondary instances: no lock, no writes, the job keeps running."""

    local = True

    def __init__(
        self, path: str, allow_pickle: bool = False, pickle_option: str = PICKLE_OPTION
    ) -> None:
        self.uri = path
        self._records: dict[str, dict[str, dict[str, Any]]] = {}
        self._dbs = local_databases(path)
        if not self._dbs:
            raise NotFoundError(f"no sessionstore database under {path}")
        self.allow_pickle, self.pickle_option = allow_pickle, pickle_option

    def operators(self) -> list[str]:
        return sorted({op for op, _ in self._dbs})

    def partitions(self, operator: str) -> list[int]:
        found = sorted(p for op, p in self._dbs if op == operator)
        if not found:
            raise NotFoundError(
                f"no operator {operator!r} in {self.uri} (operators: {', '.join(self.operators())})"
            )
        return found

    def layout(self, operator: str) -> tuple[int, int] | None:
        """None: a live database is read as the slab it is (its partition
        numbers are those of its folder)."""
        return None

    def store_records(self, operator: str) -> dict[str, dict[str, Any]]:
        """The store specs recorded in ``operator``'s first database (read once)."""
        if operator not in self._records:
            with self._secondary(operator, self.partitions(operator)[0]) as db:
                specs = db.store_specs()
            self._records[operator] = {name: {"name": name, **r} for name, r in specs.items()}
        return self._records[operator]

    @contextmanager
    def _secondary(self, operator: str, partition: int) -> Iterator[StateDB]:
        path = self._dbs.get((operator, partition))
        if path is None:
            raise NotFoundError(
                f"operator {operator!r} has no partition {partition} in {self.uri} "
                f"(partitions: {self.partitions(operator)})"
            )
        scratch = tempfile.mkdtemp(prefix="sessionstore-secondary-")
        try:
            db = StateDB.open_secondary(path, scratch)
            try:
                yield db
            finally:
                db.close()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    @contextmanager
    def open(
        self,
        operator: str,
        partition: int,
        version: int | None = None,
        progress: Progress | None = None,
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(version, stores by name)`` as the database is now."""
        with (
            self._secondary(operator, partition) as db,
            _stores_of(db, self.allow_pickle, self.pickle_option) as (local, stores),
        ):
            if version is not None and version != local:
                raise NotFoundError(
                    f"the local database of {operator}/{partition} is at version {local}, "
                    f"not {version}; read other versions from the checkpoint URI"
                )
            yield local, stores

    def info(self, operator: str, partition: int) -> PartitionInfo:
        with (
            self._secondary(operator, partition) as db,
            _stores_of(db, self.allow_pickle, self.pickle_option) as (version, stores),
        ):
            stats = store_stats(db, stores, WriteBuffer())
        path = self._dbs[(operator, partition)]
        size = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files
        )
        return PartitionInfo(version, [version], [], size, stats)


@contextmanager
def _stores_of(
    db: StateDB, allow_pickle: bool = False, pickle_option: str = "--allow-pickle"
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(committed version, stores)`` of a read-only database, opened inside a batch
    that is rolled back (opening may expire segments; that must not be written).
    A pickled store is refused unless ``allow_pickle``."""
    version = committed_version(db)
    records = [{"name": n, **r} for n, r in db.store_specs().items()]
    refuse_pickle(records, db.path, allow_pickle, pickle_option)
    db.begin()
    try:
        specs = [StoreSpec.from_record(r, allow_pickle=True) for r in records]
        yield version, {spec.name: spec.open(db) for spec in specs}
    finally:
        db.rollback()


def _local_path(uri: str) -> str | None:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.path
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        return uri
    return None


def open_source(
    uri: str,
    storage_options: dict[str, Any] | None = None,
    allow_pickle: bool = False,
    pickle_option: str = PICKLE_OPTION,
    waiting: Callable[[], AbstractContextManager[Any]] | None = None,
) -> CheckpointSource | LocalSource:
    """The source at ``uri``: local databases if the path holds RocksDB databases,
    otherwise a checkpoint root (object storage or a local folder), first reached
    within a bounded time (:func:`~sessionstore.checkpoint.storage.first_contact.reach`;
    ``waiting``, a spinner, shows while it takes more than a second). Stores
    recorded with the pickle serde are read only with ``allow_pickle``
    (``pickle_option`` names how the user says so, in the refusal)."""
    path = _local_path(uri)
    if path is not None:
        if not os.path.exists(path):
            raise NotFoundError(f"{uri} does not exist")
        if local_databases(path):
            return LocalSource(path, allow_pickle, pickle_option)
    return CheckpointSource(uri, storage_options, allow_pickle, pickle_option, waiting)


# ---------------------------------------------------------------------- rows
@dataclass(frozen=True)
class RowFilter:
    """Which rows to read. ``key`` or ``key_from``/``key_to`` (inclusive, None is
    open); ``from_ts``/``to_ts``: rows whose time span overlaps them (sessions,
    windows, validity intervals; a message's timestamp); ``as_of``: the version of a
    versioned store valid at that time."""

    key: Any = None
    key_from: Any = None
    key_to: Any = None
    from_ts: int | None = None
    to_ts: int | None = None
    as_of: int | None = None

    def check(self, kind: str, store: str) -> None:
        """Refuse filters that mean nothing for a store of ``kind``."""
        accepted = store_class(kind).row_filters
        if self.key is not None and (self.key_from is not None or self.key_to is not None):
            raise ValueError("give either a key or a key range (key_from/key_to), not both")
        if self.as_of is not None and "as_of" not in accepted:
            where = " and ".join(kinds_with("row_filters", "as_of"))
            raise ValueError(f"as_of applies to {where} stores; {store!r} is a {kind} store")
        if "from_ts" not in accepted and (self.from_ts is not None or self.to_ts is not None):
            raise ValueError(f"{store!r} is a {kind} store: it has no time to filter on")
        if self.from_ts is not None and self.to_ts is not None and self.from_ts > self.to_ts:
            raise ValueError(f"from_ts {self.from_ts} is after to_ts {self.to_ts}")
        if self.as_of is not None and (self.from_ts is not None or self.to_ts is not None):
            raise ValueError("give either as_of or a time range (from_ts/to_ts), not both")

    def rows(self, store: Any) -> Iterator[dict[str, Any]]:
        """The rows of ``store`` this filter selects, shaped by the store's kind
        (sessions, windows, messages, versions or values)."""
        return store.read_rows(**asdict(self))

    def chunks(self, store: Any, size: int | None = None) -> Iterator[RowChunk]:
        """:meth:`rows` in chunks of at most ``size`` rows (None:
        :data:`~sessionstore.tools.row_chunks.CHUNK_ROWS`): read as columns where
        the store can (``read_columns``: the session-layout stores), else
        gathered from its rows."""
        size = size or row_chunks.CHUNK_ROWS
        read = getattr(store, "read_columns", None)
        columns = None if read is None else read(**asdict(self), size=size)
        if columns is None:
            return chunks_of(self.rows(store), size)
        return map(RowChunk.of_columns, columns)


def _finished(
    rows: Iterator[dict[str, Any]], finish: Callable, where: str
) -> Iterator[dict[str, Any]]:
    """Rows whose value is replaced by the fields and aggregates ``finish`` gives."""
    for row in rows:
        value = row.pop("value")
        try:
            fields, results = finish(value)
        except Exception as exc:
            raise SessionStoreError(
                f"{where}: key {row['key']!r} holds {value!r:.200}, which its recorded output "
                f"plan cannot finish ({type(exc).__name__}: {exc}); read it raw (--raw)"
            ) from None
        yield {**row, **fields, "value": Aggregates(results)}


def presented_rows(
    store: Any, kind: str, where: str, row_filter: RowFilter = RowFilter(), raw: bool = False
) -> Iterator[dict[str, Any]]:
    """The rows of one open ``store`` of ``kind`` as :func:`store_rows` shows them
    (without ``partition``): finished by its recorded output plan unless ``raw``,
    event times as :class:`Instant` where the operator shows timestamps. ``where``
    names the store in errors."""
    rows = row_filter.rows(store)
    finish = None if raw else recorded_output(store)
    if finish is not None:
        rows = _finished(rows, finish, where)
    if recorded_time_type(store) == "timestamp":
        rows = _instants(rows, store_class(kind).time_columns)
    return rows


def presented_chunks(
    store: Any,
    kind: str,
    where: str,
    row_filter: RowFilter = RowFilter(),
    raw: bool = False,
    size: int | None = None,
) -> Iterator[RowChunk]:
    """:func:`presented_rows` in chunks of at most ``size`` rows (None:
    :data:`~sessionstore.tools.row_chunks.CHUNK_ROWS`; the same rows)."""
    size = size or row_chunks.CHUNK_ROWS
    chunks = row_filter.chunks(store, size)
    finish = None if raw else recorded_output(store)
    if finish is not None:  # a plan finishes row by row
        chunks = chunks_of(_finished(rows_of(chunks), finish, where), size)
    if recorded_time_type(store) == "timestamp":
        chunks = _instant_chunks(chunks, store_class(kind).time_columns)
    return chunks


def store_rows(
    source: CheckpointSource | LocalSource,
    operator: str,
    store: str,
    partition_ids: list[int] | None = None,
    version: int | None = None,
    row_filter: RowFilter = RowFilter(),
    limit: int | None = None,
    progress: Progress | None = None,
    raw: bool = False,
) -> Iterator[dict[str, Any]]:
    """Rows of ``store`` (``partition`` first) at ``version`` (default: the latest of
    each partition), filtered by ``row_filter``. Streams partition by partition.

    Where an operator recorded its output plan in the store, a row's ``value`` is
    :class:`Aggregates` (and count windows add ``window`` and ``count`` before it);
    ``raw`` keeps the stored value (the accumulator). Event times are epoch
    milliseconds, as :class:`Instant` where the operator shows them as timestamps."""
    chunks = store_chunks(
        source, operator, store, partition_ids, version, row_filter, limit, progress, raw
    )  # fmt: skip
    try:
        for chunk in chunks:
            yield from chunk.rows()
    finally:
        chunks.close()  # the database being read, at once


def store_chunks(
    source: CheckpointSource | LocalSource,
    operator: str,
    store: str,
    partition_ids: list[int] | None = None,
    version: int | None = None,
    row_filter: RowFilter = RowFilter(),
    limit: int | None = None,
    progress: Progress | None = None,
    raw: bool = False,
    size: int | None = None,
) -> Iterator[RowChunk]:
    """:func:`store_rows` in chunks of at most ``size`` rows (None:
    :data:`~sessionstore.tools.row_chunks.CHUNK_ROWS`; the same rows, in the same
    order, with the same errors): what a dump of millions of rows reads."""
    size = size or row_chunks.CHUNK_ROWS
    source.check_pickle(operator)  # before anything is read
    kind = _kind_of(source.store_records(operator), operator, store)
    row_filter.check(kind, store)  # clear errors before any restore
    if limit is not None and 0 < limit < size:
        size = limit  # a few rows: read no more than them
    layout = source.layout(operator)
    if layout is not None and layout[0] != layout[1]:
        chunks = _slab_chunks(
            source, operator, store, kind, layout, partition_ids, version, row_filter, progress,
            raw, size,
        )  # fmt: skip
    else:
        known = source.partitions(operator)
        ids = known if partition_ids is None else partition_ids
        for p in ids:
            if p not in known:
                raise NotFoundError(
                    f"operator {operator!r} has no partition {p} (partitions: {sorted(known)})"
                )
        opened = _databases(
            source, operator, store, kind, ids, version, row_filter, raw, progress, size
        )  # fmt: skip
        chunks = (
            chunk.with_first("partition", [p] * chunk.size) for p, _, each in opened
            for chunk in each
        )  # fmt: skip
    try:
        yield from chunks if limit is None else limited(chunks, limit)
    finally:
        chunks.close()  # the database being read, at once (a limit stops in the middle)


def _databases(
    source: CheckpointSource | LocalSource,
    operator: str,
    store: str,
    kind: str,
    databases: list[int],
    version: int | None,
    row_filter: RowFilter,
    raw: bool,
    progress: Progress | None,
    size: int,
) -> Iterator[tuple[int, str, Iterator[RowChunk]]]:
    """``(database, where, its rows of store in chunks of at most size)`` for each
    of ``databases`` in turn, each open until the next is asked for, with the
    progress of the whole."""
    for done, database in enumerate(databases):
        if progress is not None:
            progress("partitions", done, len(databases))
        with source.open(operator, database, version, progress) as (_, stores):
            where = f"{operator}/{database} store {store!r}"
            yield database, where, presented_chunks(
                stores[store], kind, where, row_filter, raw, size
            )  # fmt: skip
    if progress is not None:
        progress("partitions", len(databases), len(databases))


def _slab_chunks(
    source: CheckpointSource,
    operator: str,
    store: str,
    kind: str,
    layout: tuple[int, int],
    partition_ids: list[int] | None,
    version: int | None,
    row_filter: RowFilter,
    progress: Progress | None,
    raw: bool,
    size: int,
) -> Iterator[RowChunk]:
    """:func:`store_chunks` of an operator whose partitions are kept in fewer
    databases (``layout``: ``(slabs, partitions)``, identity.py): each slab
    holding a wanted partition is read once, and each row is given its partition,
    Spark's hash of its key (``repartition(partitions, keys)``, what routed it),
    and kept if wanted. Rows come slab by slab, the partitions of a slab
    interleaved."""
    slabs, count = layout
    wanted = range(count) if partition_ids is None else partition_ids
    bad = next((p for p in wanted if type(p) is not int or not 0 <= p < count), None)
    if bad is not None:
        raise NotFoundError(
            f"operator {operator!r} has no partition {bad} (partitions: 0..{count - 1}, "
            f"kept in {slabs} databases)"
        )
    types = source.key_types(operator)
    if not types:
        raise SessionStoreError(
            f"operator {operator!r} keeps {count} partitions in {slabs} databases but "
            "records no key types to tell them apart"
        )
    router, keep = KeyRouter(types, count), set(wanted)
    chosen = sorted({p % slabs for p in keep})
    opened = _databases(
        source, operator, store, kind, chosen, version, row_filter, raw, progress, size
    )  # fmt: skip
    for _, where, chunks in opened:
        for block in _blocks(chunks, _ROUTED_ROWS):
            try:
                labels = router.partitions_of([k for chunk in block for k in _keys(chunk)])
            except (KeyError, ValueError) as exc:
                raise SessionStoreError(f"{where}: no partition for a row: {exc}") from None
            at = 0
            for chunk in block:
                mine, at = labels[at : at + chunk.size], at + chunk.size
                kept = [i for i, label in enumerate(mine) if label in keep]
                if kept:
                    picked = chunk if len(kept) == chunk.size else chunk.take(kept)
                    yield picked.with_first("partition", [mine[i] for i in kept])


#: Rows routed together in a slab (one call of the router): a routing error stops
#: a read at the start of such a block.
_ROUTED_ROWS = 4096


def _keys(chunk: RowChunk) -> list[Any]:
    keys = chunk.column("key")
    if keys is None:
        raise KeyError("key")
    return keys


def _blocks(chunks: Iterator[RowChunk], rows: int) -> Iterator[list[RowChunk]]:
    """``chunks`` cut and gathered into lists of chunks of ``rows`` rows together
    (the last one fewer)."""
    block, count = [], 0
    for chunk in chunks:
        start = 0
        while start < chunk.size:
            part = chunk.slice(start, start + rows - count)
            block.append(part)
            start, count = start + part.size, count + part.size
            if count == rows:
                yield block
                block, count = [], 0
    if block:
        yield block


def processor_declarations(
    source: CheckpointSource | LocalSource,
    operator: str,
    store: str,
    version: int | None = None,
) -> dict[str, dict[str, Any]]:
    """The state variables a processor store of ``operator`` recorded, by name:
    ``{"kind", "value_schema", "key_schema"}`` (Spark's JSON form; see
    :mod:`sessionstore.stores.processor`), from the first partition that has any
    at ``version`` (default: the latest); every partition records the same."""
    source.check_pickle(operator)
    kind = _kind_of(source.store_records(operator), operator, store)
    if kind != "processor":
        raise ValueError(f"{store!r} of {operator!r} is a {kind} store, not a processor store")
    for partition in source.partitions(operator):
        with source.open(operator, partition, version) as (_, stores):
            found = stores[store].declarations
            if found:
                return dict(found)
    return {}


def variable_declaration(
    source: CheckpointSource | LocalSource,
    operator: str,
    store: str,
    variable: str,
    version: int | None = None,
) -> dict[str, Any]:
    """The recorded declaration of state variable ``variable`` of a processor
    store (:func:`processor_declarations`) with ``ttl``: whether its values carry
    an expiry, by the first stored one (False when it has none), or
    :class:`NotFoundError` naming the variables there are."""
    declared = processor_declarations(source, operator, store, version)
    if variable not in declared:
        raise NotFoundError(
            f"{store!r} of {operator!r} has no state variable {variable!r} "
            f"(variables: {sorted(declared)})"
        )
    rows = store_rows(source, operator, store, None, version)
    return {**declared[variable], "ttl": has_ttl(rows, variable)}
