"""Erase keys from an operator's checkpoint: every row of every store that belongs
to one of the keys (session rows, sessions kept apart to close, end-index entries,
versioned history, window rows, processor values, list and map entries, timers,
TTL index entries), in the latest version and in the retained history.

Which key a raw row belongs to is the store kind's ``row_key`` hook, and a row of
several keys' data (a block of closing sessions) is first split into a row per key
by its ``row_splitter`` (stores/registry.py; the same hooks a repartition routes
by). The change itself (a new commit of the latest version that replaces every
older changelog and snapshot, fenced against a running query, crash-safe) is
change.py's. Used by ``sessionstore erase`` and :func:`sessionstore.erase`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from sessionstore.checkpoint.offline.change import (
    DEFAULT_QUIET_S,
    ChangeError,
    check_idle,
    finish_change,
    open_change,
    pending_change,
    run_change,
)
from sessionstore.checkpoint.records.generation import state_root
from sessionstore.checkpoint.records.layout import KEY_TYPES_FIELD, read_metadata
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from sessionstore.encoding.keys import encode_key
from sessionstore.stores.base import DEFAULT_KEY_SERDE
from sessionstore.stores.registry import row_key_of, row_splitter_of

__all__ = ["erase", "read_keys_file", "keys_digest", "typed_key", "recorded_key_types"]

_INT_TYPES = frozenset({"long", "integer", "short", "byte"})


def recorded_key_types(operator_storage: Storage) -> list[str] | None:
    """The Spark types of the operator's key columns, as its ``_metadata`` records
    them (None: not recorded, or no such operator, which :func:`erase` names)."""
    try:
        return read_metadata(operator_storage).get(KEY_TYPES_FIELD)
    except FileNotFoundError:
        return None


def typed_key(text: str, key_types: list[str] | None) -> Any:
    """A key given as text (``--key``) as the operator keeps it: an int for an
    integer key column, else the text. Keys of several columns come from a file."""
    if key_types and len(key_types) > 1:
        raise ChangeError(
            f"the operator is keyed by {len(key_types)} columns ({','.join(key_types)}); "
            "give its keys in a Parquet file with --keys-from"
        )
    if key_types and key_types[0] in _INT_TYPES:
        try:
            return int(text)
        except ValueError:
            raise ChangeError(
                f"--key {text!r} is not an integer, but the key column is {key_types[0]}"
            ) from None
    return text


def read_keys_file(path: str, key_types: list[str] | None) -> list[Any]:
    """The keys in the Parquet file ``path``: its columns are the key columns in
    order (one column: the keys themselves; several: a tuple per row)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:
        raise ChangeError(f"--keys-from {path}: not a readable Parquet file ({exc})") from None
    width = len(key_types) if key_types else table.num_columns
    if table.num_columns != width:
        raise ChangeError(
            f"--keys-from {path} has {table.num_columns} columns "
            f"({', '.join(table.column_names)}), but the operator is keyed by {width} "
            f"({','.join(key_types or [])})"
        )
    columns = [c.to_pylist() for c in table.columns]
    for name, column in zip(table.column_names, columns, strict=True):
        if any(v is None for v in column):
            raise ChangeError(f"--keys-from {path}: column {name!r} holds a null key")
    return columns[0] if width == 1 else [tuple(row) for row in zip(*columns, strict=True)]


def keys_digest(encoded: Iterable[bytes]) -> str:
    """The audit record's hash of a key list: sha256 over the sorted encoded keys,
    each length-prefixed (the same set of keys gives the same hash, in any order)."""
    h = hashlib.sha256()
    for kb in sorted(set(encoded)):
        h.update(len(kb).to_bytes(4, "big"))
        h.update(kb)
    return h.hexdigest()


def _encoded(keys: list[Any]) -> set[bytes]:
    out = set()
    for k in keys:
        try:
            out.add(encode_key(k))
        except TypeError as exc:
            raise ChangeError(f"key {k!r} cannot be erased: {exc}") from None
    return out


def _eraser(erased: set[bytes], counts: Counter[str]) -> Any:
    """The row change that drops the rows of ``erased`` keys, counting them per store."""
    hooks: dict[tuple[str, str], tuple[Callable, Callable | None]] = {}

    def change(record: dict[str, Any], suffix: str, chunk: list[tuple[bytes, bytes]]) -> list:
        kind = record["kind"]
        if (kind, suffix) not in hooks:
            hooks[kind, suffix] = (row_key_of(kind), row_splitter_of(kind, suffix))
        row_key, split = hooks[kind, suffix]
        if split is not None:  # a row of several keys' data: one row per key
            chunk = [row for key, value in chunk for row in split(key, value)]
        kept = [(k, v) for k, v in chunk if row_key(suffix, k) not in erased]
        counts[record["name"]] += len(chunk) - len(kept)
        return kept

    return change


def erase(
    checkpoint: str,
    operator: str,
    key: list[Any] | None = None,
    keys_from: str | None = None,
    storage_options: dict[str, Any] | None = None,
    force: bool = False,
    quiet_s: float = DEFAULT_QUIET_S,
    allow_pickle: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Erase every row of the keys ``key`` (a list of keys as the operator keeps
    them: str, int, or tuples for several key columns) and/or those in the Parquet
    file ``keys_from`` from every store of ``operator`` at ``checkpoint``, in its
    latest version V and its history: V becomes a new commit holding no row of
    them, and every older changelog and snapshot is deleted (versions before V are
    no longer loadable).

    The query must be stopped: a checkpoint committed to in the last ``quiet_s``
    seconds, or while the erase runs, is refused (:class:`CheckpointBusyError`);
    ``force`` skips the first check only (docs/rewrite.md says what it risks). A
    change a crash left committed but not applied is finished first.

    Returns ``{"operator", "version", "keys", "keys_sha256", "rows": {store: n},
    "resumed"}`` (``resumed``: the id of an interrupted change finished first).
    """
    checkpoint = state_root(checkpoint, operator, storage_options)  # after a rescale
    storage = open_filesystem(checkpoint, storage_options).child(operator)
    resumed = pending_change(storage)
    if resumed is not None:
        finish_change(storage, resumed)
    target = open_change(checkpoint, operator, storage_options, allow_pickle)
    key_types = target.metadata.get(KEY_TYPES_FIELD)
    keys = list(key or [])
    if keys_from is not None:
        keys += read_keys_file(keys_from, key_types)
    if not keys:
        raise ChangeError("no key to erase: give --key or --keys-from")
    erased = _encoded(keys)
    digest = keys_digest(erased)
    done = {"operator": operator, "keys": len(erased), "keys_sha256": digest,
            "resumed": None if resumed is None else resumed["id"]}  # fmt: skip
    if resumed is not None and resumed["audit"].get("keys_sha256") == digest:
        # the interrupted run was this erase: finishing it was the whole job
        return {**done, "version": resumed["version"], "rows": resumed["audit"]["rows"]}
    for record in target.metadata["stores"]:
        if record.get("key_serde", DEFAULT_KEY_SERDE) != DEFAULT_KEY_SERDE:
            raise ChangeError(
                f"store {record['name']!r} keeps its keys with the serde "
                f"{record['key_serde']!r}, not as the operator's key columns; its rows "
                "cannot be matched to keys"
            )
    if not force:
        check_idle(target, quiet_s)
    counts: Counter[str] = Counter({r["name"]: 0 for r in target.metadata["stores"]})
    audit = {"change": "erase", "operator": operator, "keys": len(erased),
             "keys_sha256": digest, "rows": counts}  # fmt: skip
    record = run_change(target, _eraser(erased, counts), audit, progress)
    return {**done, "version": record["version"], "rows": dict(counts)}
