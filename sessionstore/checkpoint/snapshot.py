"""Snapshots: a RocksDB checkpoint uploaded as content-addressed files plus a manifest.

``files/<sha256>`` holds each file of a checkpoint once, whatever its name, so an
SST file shared by many snapshots is uploaded once. ``snapshot/<N>.manifest``
(msgpack) lists the files of the snapshot of version N::

    {"format": 1, "version": N, "files": [{"name": "000012.sst", "sha256": ..., "size": ...}]}

The manifest is written last and atomically: a snapshot exists once its manifest
does. On download, names from the manifest are validated (plain file names only:
no path separators, no ``..``, nothing absolute), so a manifest can never make us
write outside the target directory, and every file's hash is checked.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack

from sessionstore.checkpoint.filesystem import Storage
from sessionstore.checkpoint.layout import FILES_DIR, content_name, manifest_name
from sessionstore.errors import SessionStoreError

__all__ = [
    "upload_snapshot",
    "download_snapshot",
    "read_manifest",
    "CorruptSnapshotError",
]

FORMAT = 1


class CorruptSnapshotError(SessionStoreError):
    def __init__(self, path: str, version: int, reason: str) -> None:
        self.path, self.version, self.reason = path, version, reason
        super().__init__(f"snapshot {path} (version {version}) is unusable: {reason}")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def upload_snapshot(
    storage: Storage, local_dir: str, version: int, threads: int = 8
) -> dict[str, Any]:
    """Upload the checkpoint in ``local_dir`` as the snapshot of ``version``.

    Files go up in parallel (pyarrow releases the GIL during I/O); the manifest is
    written last. Returns the manifest, with ``uploaded_bytes`` (what was new).
    """
    known = set(storage.list(FILES_DIR))
    names = sorted(n for n in os.listdir(local_dir) if os.path.isfile(os.path.join(local_dir, n)))
    paths = [os.path.join(local_dir, n) for n in names]
    with ThreadPoolExecutor(threads) as pool:
        digests = list(pool.map(_sha256, paths))
        todo = {}
        for path, digest in zip(paths, digests, strict=True):
            if digest not in known:
                todo[digest] = path
        list(pool.map(lambda d: storage.upload_file(todo[d], content_name(d)), todo))
    files = [
        {"name": n, "sha256": d, "size": os.path.getsize(p)}
        for n, d, p in zip(names, digests, paths, strict=True)
    ]
    manifest = {"format": FORMAT, "version": version, "files": files}
    storage.write_atomic(manifest_name(version), msgpack.packb(manifest))
    uploaded = sum(os.path.getsize(p) for p in todo.values())
    return {**manifest, "uploaded_bytes": uploaded}


def _check_name(name: Any, path: str, version: int) -> str:
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or os.path.isabs(name)
    ):
        raise CorruptSnapshotError(
            path, version, f"file name {name!r} is not a plain file name; refusing to write it"
        )
    return name


def read_manifest(storage: Storage, version: int) -> dict[str, Any]:
    """The validated manifest of the snapshot of ``version``."""
    rel = manifest_name(version)
    where = f"{storage.uri.rstrip('/')}/{rel}"
    try:
        manifest = msgpack.unpackb(storage.read(rel), raw=False)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise CorruptSnapshotError(where, version, f"unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptSnapshotError(where, version, f"unknown manifest format {manifest!r:.80}")
    if manifest.get("version") != version:
        raise CorruptSnapshotError(
            where, version, f"manifest says version {manifest.get('version')}"
        )
    for entry in manifest.get("files", []):
        _check_name(entry.get("name"), where, version)
        digest = entry.get("sha256")
        if (
            not isinstance(digest, str)
            or len(digest) != 64
            or not all(c in "0123456789abcdef" for c in digest)
        ):
            raise CorruptSnapshotError(where, version, f"bad file hash {digest!r}")
    return manifest


def download_snapshot(
    storage: Storage, version: int, target_dir: str, threads: int = 8
) -> dict[str, Any]:
    """Materialise the snapshot of ``version`` into the empty ``target_dir``,
    downloading files in parallel and checking every hash."""
    manifest = read_manifest(storage, version)
    where = f"{storage.uri.rstrip('/')}/{manifest_name(version)}"
    os.makedirs(target_dir, exist_ok=True)

    def fetch(entry: dict[str, Any]) -> None:
        local = os.path.join(target_dir, entry["name"])
        try:
            storage.download(content_name(entry["sha256"]), local)
        except FileNotFoundError as exc:
            raise CorruptSnapshotError(where, version, f"missing file: {exc}") from None
        if _sha256(local) != entry["sha256"]:
            raise CorruptSnapshotError(
                where, version, f"{entry['name']} does not match its sha256 {entry['sha256']}"
            )

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fetch, manifest["files"]))
    return manifest
