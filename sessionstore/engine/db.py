"""Database: one RocksDB instance (rocksdict, raw mode) shared by many logical stores.

The engine knows column families, atomic batches and a ``meta`` family, not what
the families mean: the stores layer (:mod:`sessionstore.stores`) names its families
and meta keys, and :class:`sessionstore.stores.state_db.StateDB` adds the store
openers. The engine's own meta key is the database's format version.

Writes go through a :class:`~sessionstore.engine.write_buffer.WriteBuffer` and reach RocksDB
as one atomic ``WriteBatch`` when the outermost :meth:`Database.batch` ends (or at
once, outside a batch). A :class:`Participant` (a store with in-memory state, such
as its stream time) enlisted in the batch writes its metadata into that same batch,
so a crash never separates data from the stream time that describes it. Reads see
the pending writes of the current batch.

rocksdict pitfalls handled here: every family is passed with its options on reopen,
family objects and iterators are released before ``drop_column_family`` and
``close``, and ``ReadOptions`` outlive their iterators.
"""

from __future__ import annotations

import logging
import os
import re
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, Self

import msgpack
from rocksdict import (
    AccessType,
    BlockBasedOptions,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from sessionstore.engine.memory import check_memory_max_mb, current_budget, memory_budget
from sessionstore.engine.write_buffer import MISSING, WriteBuffer
from sessionstore.errors import SessionStoreError, StateDBLockedError, StateDBPathError
from sessionstore.process import this_process

__all__ = ["Database", "Participant", "META_CF", "FORMAT_VERSION", "process_native_memory"]

log = logging.getLogger(__name__)

META_CF = "meta"
FORMAT_VERSION = 1
_FORMAT_KEY = b"format_version"


def _open_databases() -> weakref.WeakSet:
    """The databases this process holds open, for :func:`process_native_memory`
    (the process's ``open_databases`` slot: :mod:`sessionstore.process`)."""
    return this_process().get_or_make("open_databases", weakref.WeakSet)


def process_native_memory() -> int:
    """Native memory this process's open databases use, in bytes (what a worker's
    state costs outside Python's heap): the shared cache's usage, which holds their
    blocks and is charged with their memtables (:mod:`sessionstore.engine.memory`)."""
    budget = current_budget()
    if budget is None or not _open_databases():
        return 0
    return budget.usage()


_COMPRESSION = {
    "none": DBCompressionType.none(),
    "lz4": DBCompressionType.lz4(),
    "zstd": DBCompressionType.zstd(),
    "snappy": DBCompressionType.snappy(),
}


class Participant(Protocol):
    """Something with in-memory state tied to the current batch (a store's stream
    time): enlisted with :meth:`Database.enlist`, it is told when the batch ends."""

    def before_commit(self) -> None:
        """Write pending metadata; the writes join the batch being committed."""

    def after_rollback(self) -> None:
        """Forget in-memory state the discarded batch changed (re-read it)."""


def _make_options(
    memory_max_mb: int | None,
    bloom_bits_per_key: float,
    write_buffer_mb: int,
    compression: str,
    create_if_missing: bool,
) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(create_if_missing)
    opts.create_missing_column_families(True)
    # the per-memtable size; all memtables of the process share the budget's manager
    opts.set_write_buffer_size(write_buffer_mb * 1024 * 1024)
    # Memtables take memory in arena blocks, by default 1 MiB (write_buffer_size / 8,
    # capped), even for a few rows: 200 partitions with 3 families each would hold
    # 600 MiB of nearly empty memtables. Small blocks charge what is used.
    opts.set_arena_block_size(_ARENA_BLOCK)
    budget = memory_budget(memory_max_mb)
    opts.set_write_buffer_manager(budget.write_buffers)
    # RocksDB opens each column family's table files with this many threads, and it
    # starts them per family even when there is nothing to open: 15 thread starts
    # per family at the default of 16. Our databases are one partition's state with
    # a handful of files per family, and Spark reopens them whenever a partition
    # moves between Python workers; one thread makes that open markedly cheaper
    # (measured: BENCHMARKS.md, "Figures quoted in code").
    opts.set_max_file_opening_threads(1)
    # RocksDB's info log: every open moves the last one aside (LOG.old.<time>) and
    # writes the options of every family into a new one, about 12 KB a family, and
    # RocksDB keeps 1,000 of them, each growing without bound. Spark reopens a
    # partition's database whenever the partition moves to another Python worker,
    # so its directory would grow by a log per move. The newest few, capped in size,
    # as Flink's RocksDB backend keeps them
    opts.set_keep_log_file_num(INFO_LOGS_KEPT)
    opts.set_max_log_file_size(INFO_LOG_BYTES)
    try:
        opts.set_compression_type(_COMPRESSION[compression])
    except KeyError:
        raise ValueError(
            f"unknown compression {compression!r}; choose one of {sorted(_COMPRESSION)}"
        ) from None
    table = BlockBasedOptions()
    table.set_block_cache(budget.cache)
    # Index and filter blocks in the shared cache, so that they count against the
    # budget rather than grow with every table file a worker holds open; those of
    # L0 files stay pinned (read by every lookup, and few), as Spark pins them.
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    if bloom_bits_per_key > 0:
        table.set_bloom_filter(bloom_bits_per_key, False)
    opts.set_block_based_table_factory(table)
    return opts


_ARENA_BLOCK = 64 * 1024
#: RocksDB info logs (``LOG``, ``LOG.old.*``) a database keeps, and the size at
#: which the current one is rolled over: at most 32 MiB of logs a database.
INFO_LOGS_KEPT = 4
INFO_LOG_BYTES = 8 * 1024 * 1024

# How rocksdict words an operating-system error: "... (os error 17)", "IO error: ..."
_OS_ERROR = re.compile(r"\(os error \d+\)|^IO error")


def _checked_families(families: Iterable[str]) -> list[str]:
    """``families`` (for :meth:`Database.open`) as a list without repeats;
    ``ValueError`` naming the first that cannot name a family of ours."""
    if isinstance(families, (str, bytes)):
        raise ValueError(f"families must be an iterable of names, not one name: {families!r}")
    try:
        names = list(families)
    except TypeError:
        raise ValueError(f"families must be an iterable of names, got {families!r}") from None
    for name in names:
        if not isinstance(name, str) or not name or name in ("default", META_CF):
            raise ValueError(f"families: {name!r} cannot name a column family of a store")
    return list(dict.fromkeys(names))


def _path_problem(path: str) -> str | None:
    """Why a database cannot be created or written at ``path``, or None if the path
    looks usable (run after RocksDB refused it, to say why in the user's terms)."""
    if os.path.exists(path) and not os.path.isdir(path):
        return "it is a file, not a directory (give a directory; it is created if missing)"
    # the nearest existing ancestor: RocksDB creates the missing directories below it
    existing = os.path.abspath(path)
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing!r} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        if existing == os.path.abspath(path):
            return "the directory is not writable"
        return f"{existing!r} is not writable, so the database cannot be created in it"
    return None


class Database:
    """One RocksDB database holding the stores of one operator partition.

    Open it with :meth:`open`; use it as a context manager or call :meth:`close`.
    Stores are opened through the subclass
    :class:`~sessionstore.stores.state_db.StateDB`.
    """

    def __init__(self, path: str, rdict: Rdict, options: Options, read_only: bool = False) -> None:
        self.path = path
        #: A secondary (reader) instance: batches may be opened and rolled back, but
        #: nothing ever reaches the database.
        self.read_only = read_only
        self._rdict: Rdict | None = rdict
        self._options = options
        self._families: set[str] = {n for n in Rdict.list_cf(path) if n != "default"}
        self._cf_objects: dict[str, Rdict] = {}
        self._cf_handles: dict[str, Any] = {}
        #: Families the open created (:meth:`open`'s ``families``) that nothing has
        #: asked for yet: absent to everything but :meth:`_make_family`, which
        #: takes one over when it is first created or written, as if created then.
        self._unrecorded: set[str] = set()
        self._buffer = WriteBuffer()
        self._depth = 0
        self._participants: dict[int, Participant] = {}
        self._iterators: weakref.WeakSet = weakref.WeakSet()
        self._prepared: WriteBuffer | None = None
        self._write_options = WriteOptions()
        self._budget = memory_budget()
        _open_databases().add(self)
        if META_CF not in self._families:
            if read_only:
                rdict.close()
                raise SessionStoreError(
                    f"{path!r} is a RocksDB database but not a sessionstore one"
                )
            self.create_column_family(META_CF)
        recorded = self._rdict_cf(META_CF).get(_FORMAT_KEY)
        if recorded is None:
            if read_only:
                self.close()
                raise SessionStoreError(f"{path!r} has no sessionstore format version")
            self.put(META_CF, _FORMAT_KEY, msgpack.packb(FORMAT_VERSION))
        elif msgpack.unpackb(recorded) != FORMAT_VERSION:
            version = msgpack.unpackb(recorded)
            self.close()
            raise SessionStoreError(
                f"state database {path!r} has format version {version}, this sessionstore "
                f"reads version {FORMAT_VERSION}; restore it with a matching release"
            )

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        memory_max_mb: int | None = None,
        bloom_bits_per_key: float = 10,
        write_buffer_mb: int = 16,
        compression: str = "lz4",
        create_if_missing: bool = True,
        families: Iterable[str] = (),
    ) -> Self:
        """Open (or create) the database at ``path`` with every column family it has.

        ``families``: column families a *new* database gets in the open itself
        (ignored where the database exists). RocksDB rewrites and re-reads its
        options file at every family created, and once for all that an open
        creates, so a caller that knows the families it will create passes them
        here. Until :meth:`create_column_family` asks for one (or a replayed
        batch creates or writes it) the database acts as if it lacked it (not in
        :meth:`column_families`; a drop ignores it), and the ask records its
        creation in the batch, as if it were created then: changelogs are those
        of a database that created it then. One never asked for stays in the
        database's files, empty (a later open lists it).

        Every family, those found here and those created later, gets the same
        options: bloom filters and the process's shared block cache and write-buffer
        manager (:mod:`sessionstore.engine.memory`). ``memory_max_mb`` sets that
        process budget (None keeps the current one, or the default); ``write_buffer_mb``
        is the size of one family's memtable.

        Raises :class:`StateDBLockedError` when another handle holds the database,
        and :class:`~sessionstore.errors.StateDBPathError` (naming the path and the
        problem) when ``path`` is a file, lies under a file, or is not writable.
        """
        path = os.fspath(path)
        check_memory_max_mb(memory_max_mb)
        if not path:  # RocksDB would put its files in the working directory
            raise StateDBPathError(path, "the path is empty")
        wanted = _checked_families(families)
        opts = _make_options(
            memory_max_mb, bloom_bits_per_key, write_buffer_mb, compression, create_if_missing
        )
        descriptors: dict[str, Options] = {}
        exists = os.path.exists(os.path.join(path, "CURRENT"))
        if not exists and not create_if_missing:
            raise FileNotFoundError(f"no state database at {path!r}")
        try:
            if exists:
                descriptors = {n: opts for n in Rdict.list_cf(path) if n != "default"}
            else:
                # RocksDB rewrites and re-reads its OPTIONS file for every family
                # created (about 4 ms of CPU each; BENCHMARKS.md, "Figures quoted in
                # code"): the metadata family every new database gets comes with the
                # open's own write instead
                descriptors = {META_CF: opts, **dict.fromkeys(wanted, opts)}
            rdict = Rdict(path, opts, column_families=descriptors)
        except Exception as exc:  # rocksdict raises a bare Exception for IO errors
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "lock" in detail.lower():
                raise StateDBLockedError(path, detail) from exc
            problem = _path_problem(path)
            if problem is None and (isinstance(exc, OSError) or _OS_ERROR.search(detail)):
                problem = detail  # an OS error the checks did not foresee: still name the path
            if problem is not None:
                raise StateDBPathError(path, problem) from exc
            raise
        db = cls(path, rdict, opts)
        if not exists:
            db._unrecorded.update(wanted)
            db._families.difference_update(wanted)
        return db

    @classmethod
    def open_secondary(cls, path: str | os.PathLike[str], secondary_dir: str) -> Self:
        """Open a live database as a RocksDB *secondary* instance: no lock is taken and
        nothing is written to ``path``, so the job owning it keeps writing.

        The view is the state as of the open (the latest committed write batch, never
        part of one). ``secondary_dir`` holds the reader's own info log. Every file is
        opened up front (``max_open_files=-1``) so compactions by the writer cannot
        pull files from under the reader.
        """
        path = os.fspath(path)
        if not os.path.exists(os.path.join(path, "CURRENT")):
            raise FileNotFoundError(f"no state database at {path!r}")
        opts = _make_options(None, 10, 4, "lz4", False)
        opts.set_max_open_files(-1)
        families = {n: opts for n in Rdict.list_cf(path) if n != "default"}
        rdict = Rdict(
            path, opts, column_families=families, access_type=AccessType.secondary(secondary_dir)
        )
        return cls(path, rdict, opts, read_only=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._rdict is None

    def close(self) -> None:
        """Close the database and release its lock, even if iterators are still open.

        Pending writes of an unfinished batch are discarded.
        """
        if self._rdict is None:
            return
        for it in list(self._iterators):
            it.close()
        self._iterators.clear()
        self._buffer = WriteBuffer()
        self._participants.clear()
        self._release_families()
        rdict, self._rdict = self._rdict, None
        _open_databases().discard(self)
        rdict.close()
        del rdict

    def _release_families(self) -> None:
        # rocksdict keeps the lock (and refuses drops) while family objects live.
        self._cf_objects.clear()
        self._cf_handles.clear()

    def _db(self) -> Rdict:
        if self._rdict is None:
            raise SessionStoreError(f"state database {self.path!r} is closed")
        return self._rdict

    # ------------------------------------------------------------ column families
    def column_families(self) -> list[str]:
        """Names of every column family, ``default`` excluded, sorted."""
        return sorted(self._families)

    def create_column_family(self, name: str) -> None:
        """Create ``name`` now (RocksDB cannot create families transactionally)."""
        if name in self._families:
            return
        if self.read_only:
            raise SessionStoreError(
                f"state database {self.path!r} is open read-only; cannot create {name!r}"
            )
        if name in self._buffer.dropped:
            raise SessionStoreError(f"column family {name!r} is being dropped in this batch")
        self._make_family(name)
        self._buffer.created.append(name)

    def _make_family(self, name: str) -> None:
        """Create ``name`` in RocksDB, or take over the one the open created."""
        if name in self._unrecorded:
            self._unrecorded.discard(name)
        else:
            self._db().create_column_family(name, self._options)
        self._families.add(name)

    def drop_column_family(self, name: str) -> None:
        """Drop ``name``: at once outside a batch, after the batch's write inside one."""
        if name not in self._families:
            return
        if self._depth:
            self._buffer.drop_family(name)
        else:
            self._drop_now(name)

    def _drop_now(self, name: str) -> None:
        if self.read_only:
            raise SessionStoreError(
                f"state database {self.path!r} is open read-only; cannot drop {name!r}"
            )
        self._db().drop_column_family(name)
        # Release this family's object and handle right after the drop, which frees
        # its data; other families' objects may live on. Released before its drop, a
        # family object holding unflushed writes costs far more (it is flushed first),
        # and releasing every family object at each segment expiry paid that per
        # family (rocksdict 0.3.29; BENCHMARKS.md, "Figures quoted in code").
        self._cf_objects.pop(name, None)
        self._cf_handles.pop(name, None)
        self._families.discard(name)
        if name in self._buffer.created:  # gone before any changelog needed it
            self._buffer.created.remove(name)

    def estimated_family_keys(self, name: str) -> int:
        """RocksDB's estimate of the entries of family ``name`` (memtables included,
        so overwrites may be counted)."""
        return self._rdict_cf(name).property_int_value("rocksdb.estimate-num-keys") or 0

    def flush_memtables(self, wait: bool = True) -> None:
        """Write every family's memtable to table files, freeing its memory (in the
        background if not ``wait``). A write that leaves the process's memtables over
        their share of the budget calls it (see :mod:`sessionstore.engine.memory`)."""
        for name in self._families:
            self._rdict_cf(name).flush(wait)

    def memtable_bytes(self) -> int:
        """Bytes of this database's memtables, every family's (its share of what
        the process's write-buffer manager charges to the shared cache)."""
        prop = "rocksdb.cur-size-all-mem-tables"
        total = self._db().property_int_value(prop) or 0
        for name in self._families:
            total += self._rdict_cf(name).property_int_value(prop) or 0
        return total

    def _rdict_cf(self, name: str) -> Rdict:
        cf = self._cf_objects.get(name)
        if cf is None:
            cf = self._cf_objects[name] = self._db().get_column_family(name)
        return cf

    def _handle(self, name: str) -> Any:
        h = self._cf_handles.get(name)
        if h is None:
            h = self._cf_handles[name] = self._db().get_column_family_handle(name)
        return h

    # ------------------------------------------------------------------ batches
    @contextmanager
    def batch(self) -> Iterator[Self]:
        """Group writes into one atomic RocksDB write; re-entrant (inner joins outer).

        If the block raises, every write of the outermost batch is discarded.
        """
        self.begin()
        try:
            yield self
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self._rollback()
            raise
        self._depth -= 1
        if self._depth == 0:
            self._commit()

    def begin(self) -> None:
        """Open a batch that lasts until :meth:`prepare` + :meth:`apply` or :meth:`rollback`
        (for callers, like the checkpoint provider, whose unit of work spans calls)."""
        self._db()
        self._depth += 1

    def prepare(self) -> WriteBuffer:
        """End the outermost batch and return its writes, stores' metadata included,
        without applying them: the caller persists them elsewhere first, then calls
        :meth:`apply` (or :meth:`rollback` to discard them)."""
        if self._depth != 1:
            raise SessionStoreError(f"prepare() needs exactly one open batch, not {self._depth}")
        self._flush_participants()
        self._depth = 0
        buf, self._buffer = self._buffer, WriteBuffer()
        self._prepared = buf
        return buf

    def apply(self, buf: WriteBuffer) -> None:
        """Write a prepared (or replayed) buffer to RocksDB atomically.

        A family the buffer writes to is created first if this database lacks it,
        whether or not the buffer records its creation: RocksDB creates a family at
        once, outside any batch, so an attempt that created one and then failed
        (killed, or its task raised and its database was closed: the record of
        what it created goes with the database object) leaves it in its local
        copy, and the retry that commits from that copy finds it there and records
        no creation. A restore elsewhere, or a losing attempt adopting that commit,
        creates it here. (A family such an attempt created and the retry never
        wrote stays in that one copy and its snapshots only: empty, it holds no
        row of any version.)"""
        self._prepared = None
        if not self.read_only:
            for cf in buf.families:
                if cf not in self._families and cf != "default":
                    if cf not in buf.created:
                        log.info(
                            "sessionstore: %s: creating family %r, which a write batch "
                            "writes to without recording its creation (one a failed "
                            "attempt created before the commit it continues)",
                            self.path, cf,
                        )  # fmt: skip
                    self._make_family(cf)
        self._apply(buf)

    def rollback(self) -> None:
        """Discard the open (or prepared) batch."""
        self._depth = 0
        self._rollback()
        self._prepared = None

    def checkpoint(self, path: str) -> None:
        """Write a consistent RocksDB checkpoint of the committed state to ``path``
        (hard links where possible, so it is cheap)."""
        from rocksdict import Checkpoint

        Checkpoint(self._db()).create_checkpoint(path)

    @property
    def in_batch(self) -> bool:
        return self._depth > 0

    def enlist(self, participant: Participant) -> None:
        """Have ``participant`` flush its state at commit and reset it on rollback."""
        self._participants[id(participant)] = participant

    def _flush_participants(self) -> None:
        participants = list(self._participants.values())
        self._participants.clear()
        self._depth += 1  # their metadata joins this batch instead of committing alone
        try:
            for p in participants:
                p.before_commit()
        finally:
            self._depth -= 1

    def _commit(self) -> None:
        self._flush_participants()
        buf, self._buffer = self._buffer, WriteBuffer()
        self._apply(buf)

    def _apply(self, buf: WriteBuffer) -> None:
        if self.read_only:
            if buf.created or buf.families or buf.dropped:
                raise SessionStoreError(
                    f"state database {self.path!r} is open read-only (secondary); "
                    "writes are refused"
                )
            return
        for cf in buf.created:
            if cf not in self._families and cf not in buf.dropped:
                self._make_family(cf)
        if buf.families:
            wb = WriteBatch(raw_mode=True)
            put, delete = wb.put, wb.delete
            for cf, entries in buf.families.items():
                handle = self._handle(cf)
                if None in entries.values():
                    for key, value in entries.items():
                        if value is None:
                            delete(key, handle)
                        else:
                            put(key, value, handle)
                else:
                    # Puts only (the usual case): one C-level loop, no per-key branch.
                    wb.set_default_column_family(handle)
                    deque(map(put, entries.keys(), entries.values()), 0)
            self._db().write(wb, self._write_options)
            if self._budget.memtables_over_share():
                # waits: a background flush would leave the memory charged a while,
                # and every write meanwhile would flush its writer too
                self.flush_memtables(wait=True)
        for cf in buf.dropped:
            if cf in self._families:
                self._drop_now(cf)

    def _rollback(self) -> None:
        # Families created in the batch exist anyway (RocksDB cannot undo that):
        # keep them on record so that the next changelog of this database object
        # still creates them (once it is closed, replay covers them: see apply).
        created = [cf for cf in self._buffer.created if cf in self._families]
        if self._prepared is not None:
            created = [cf for cf in self._prepared.created if cf in self._families] + created
        self._buffer = WriteBuffer()
        self._buffer.created.extend(created)
        participants = list(self._participants.values())
        self._participants.clear()
        for p in participants:
            p.after_rollback()

    # ------------------------------------------------------------ reads and writes
    def put(self, cf: str, key: bytes, value: bytes | None) -> None:
        """Write ``value`` (or delete when None) under ``key`` in family ``cf``."""
        self._buffer.put(cf, key, value)
        if self._depth == 0:
            self._commit()

    def bulk_writer(self, cf: str) -> dict[bytes, bytes | None]:
        """Pending-write dict of ``cf`` in the current batch: assign ``d[key] = value``
        (None deletes) for many keys without a call per key. Only inside a batch."""
        if not self._depth:
            raise SessionStoreError("bulk_writer() needs an open db.batch()")
        return self._buffer.family_for_bulk_write(cf)

    def delete(self, cf: str, key: bytes) -> None:
        self.put(cf, key, None)

    def get(self, cf: str, key: bytes) -> bytes | None:
        """Value of ``key`` in ``cf`` including pending writes, or None."""
        # Inlined buffer and family lookups: this is the hottest read path.
        entries = self._buffer.families.get(cf)
        if entries is not None:
            pending = entries.get(key, MISSING)
            if pending is not MISSING:
                return pending  # type: ignore[return-value]
        family = self._cf_objects.get(cf)
        if family is None:
            family = self._rdict_cf(cf)
        return family.get(key)

    def get_many(self, cf: str, keys: list[bytes]) -> list[bytes | None]:
        """Multi-get: one RocksDB call for every key the batch has not written."""
        if not self._buffer.has_family(cf):
            return self._rdict_cf(cf).get(keys)
        out: list[Any] = [self._buffer.get(cf, k) for k in keys]
        missing = [i for i, v in enumerate(out) if v is MISSING]
        if missing:
            found = self._rdict_cf(cf).get([keys[i] for i in missing])
            for i, v in zip(missing, found, strict=True):
                out[i] = v
        return out

    def scan_list(
        self, cf: str, lo: bytes | None = None, hi: bytes | None = None, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Like :meth:`scan`, read eagerly into a list: faster for small ranges such
        as the rows of one key, and it holds no RocksDB iterator afterwards."""
        family = self._cf_objects.get(cf)
        if family is None:
            family = self._rdict_cf(cf)
        read_opts = ReadOptions()
        if reverse:
            rows = list(
                _reverse_bounded(
                    family.items(backwards=True, from_key=hi, read_opt=read_opts), lo, hi
                )
            )
        else:
            if hi is not None:
                read_opts.set_iterate_upper_bound(hi)
            rows = list(family.items(from_key=lo, read_opt=read_opts))
        del read_opts
        if cf in self._buffer.families:
            pending = self._buffer.range(cf, lo, hi)
            if pending:
                if reverse:
                    pending.reverse()
                rows = list(_merge(iter(rows), pending, reverse))
        return rows

    def scan(
        self, cf: str, lo: bytes | None = None, hi: bytes | None = None, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """Entries of ``cf`` with ``lo <= key < hi`` in key order, pending writes included.

        The iterator is closed (and its RocksDB resources freed) by :meth:`close`.
        """
        it = self._scan(cf, lo, hi, reverse)
        self._iterators.add(it)
        return it

    def _scan(
        self, cf: str, lo: bytes | None, hi: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, bytes]]:
        pending = self._buffer.range(cf, lo, hi)
        family = self._rdict_cf(cf)
        read_opts = ReadOptions()  # must outlive the iterator
        if reverse:
            raw = family.items(backwards=True, from_key=hi, read_opt=read_opts)
            rows = _reverse_bounded(raw, lo, hi)
            pending.reverse()
        else:
            if hi is not None:
                read_opts.set_iterate_upper_bound(hi)
            rows = family.items(from_key=lo, read_opt=read_opts)
        if not pending:
            yield from rows
        else:
            yield from _merge(rows, pending, reverse)
        del rows, family, read_opts

    # ------------------------------------------------------------------ metadata
    def get_meta(self, key: bytes) -> bytes | None:
        return self.get(META_CF, key)

    def put_meta(self, key: bytes, value: bytes | None) -> None:
        self.put(META_CF, key, value)


def _reverse_bounded(
    rows: Iterator[tuple[bytes, bytes]], lo: bytes | None, hi: bytes | None
) -> Iterator[tuple[bytes, bytes]]:
    # seek_for_prev lands on hi itself when present; hi is exclusive.
    for key, value in rows:
        if hi is not None and key >= hi:
            continue
        if lo is not None and key < lo:
            return
        yield key, value


def _merge(
    rows: Iterator[tuple[bytes, bytes]],
    pending: list[tuple[bytes, bytes | None]],
    reverse: bool,
) -> Iterator[tuple[bytes, bytes]]:
    """Merge committed rows with pending writes (which win; None hides a row)."""
    i, n = 0, len(pending)
    for key, value in rows:
        while i < n and (pending[i][0] > key if reverse else pending[i][0] < key):
            pk, pv = pending[i]
            i += 1
            if pv is not None:
                yield pk, pv
        if i < n and pending[i][0] == key:
            pv = pending[i][1]
            i += 1
            if pv is not None:
                yield key, pv
            continue
        yield key, value
    for pk, pv in pending[i:]:
        if pv is not None:
            yield pk, pv
