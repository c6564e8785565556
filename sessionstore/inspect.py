"""Read-only access to checkpointed state: operators, partitions and store rows.

Shared by the ``sessionstore`` CLI and the ``sessionstore`` Spark data source. A
version is restored from the checkpoint into a temporary directory, so reading
never touches a running job's database or takes its lock.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import msgpack

from sessionstore.checkpoint.filesystem import Storage, open_filesystem
from sessionstore.checkpoint.provider import StateStoreProvider
from sessionstore.checkpoint.spec import StoreSpec
from sessionstore.errors import SessionStoreError

__all__ = ["NotFoundError", "operators", "operator_metadata", "partitions", "store_rows"]


class NotFoundError(SessionStoreError, LookupError):
    """An operator, store or key that the checkpoint does not have."""


def operators(root: Storage) -> list[str]:
    """Operators (directories with a ``_metadata`` file) under a checkpoint root."""
    return [d for d in root.list_dirs() if root.exists(f"{d}/_metadata")]


def operator_metadata(root: Storage, operator: str) -> dict[str, Any]:
    """The recorded specs and partition count of ``operator``."""
    try:
        return msgpack.unpackb(root.read(f"{operator}/_metadata"), raw=False)
    except FileNotFoundError:
        known = ", ".join(operators(root)) or "none"
        raise NotFoundError(
            f"no operator {operator!r} in {root.uri} (operators: {known})"
        ) from None


def partitions(root: Storage, operator: str) -> list[int]:
    return sorted(int(d) for d in root.list_dirs(operator) if d.isdigit())


def store_kind(root: Storage, operator: str, store: str, meta: dict | None = None) -> str:
    """The kind of ``store``, or :class:`NotFoundError` naming the stores there are."""
    meta = meta if meta is not None else operator_metadata(root, operator)
    specs = {r["name"]: r for r in meta["stores"]}
    if store not in specs:
        raise NotFoundError(
            f"operator {operator!r} has no store {store!r} (stores: {', '.join(sorted(specs))})"
        )
    return specs[store]["kind"]


def _rows(store: Any, kind: str, key: Any, as_of: int | None) -> Iterator[dict[str, Any]]:
    if kind in ("session", "window", "messages"):
        rows = store.fetch(key) if key is not None else store.fetch_range(None, None)
        for window, value in rows:
            if kind == "messages":
                yield {
                    "key": window.key,
                    "timestamp": window.end,
                    "offset": window.start,
                    "value": value,
                }
            else:
                end = window.end + 1 if kind == "window" else window.end
                yield {"key": window.key, "start": window.start, "end": end, "value": value}
    elif kind == "versioned":
        for k in [key] if key is not None else store.keys():
            records = [store.get(k, as_of)] if as_of is not None else store.get_versions(k)
            for r in records:
                if r is not None:
                    yield {
                        "key": k,
                        "value": r.value,
                        "valid_from": r.timestamp,
                        "valid_to": r.valid_to,
                    }
    else:
        for k, value in store.items():
            if key is None or k == key:
                yield {"key": k, "value": value}


def store_rows(
    uri: str,
    operator: str,
    store: str,
    partition_ids: list[int] | None = None,
    version: int | None = None,
    key: Any = None,
    as_of: int | None = None,
    limit: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """Rows of ``store`` (``partition`` first), at ``version`` (default: the latest
    of each partition), optionally one ``key``, ``as_of`` a time for versioned stores."""
    root = open_filesystem(uri, storage_options)
    meta = operator_metadata(root, operator)
    kind = store_kind(root, operator, store, meta)  # clear errors before any restore
    specs = [StoreSpec.from_record(r) for r in meta["stores"]]
    count = 0
    for partition in partitions(root, operator) if partition_ids is None else partition_ids:
        with tempfile.TemporaryDirectory(prefix="sessionstore-read-") as workdir:
            provider = StateStoreProvider(
                uri, operator, partition, specs, workdir, storage_options=storage_options
            )
            handle = provider.get_store(provider.latest_version() if version is None else version)
            try:
                for row in _rows(handle[store], kind, key, as_of):
                    yield {"partition": partition, **row}
                    count += 1
                    if limit is not None and count >= limit:
                        return
            finally:
                handle.abort()
                provider.close()
