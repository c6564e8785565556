"""Snapshots: a RocksDB checkpoint uploaded as content-addressed files plus a manifest.

``files/<sha256>`` holds each file of a checkpoint once, whatever its name, so an
SST file shared by many snapshots is uploaded once. Files under
:data:`PACK_THRESHOLD` (OPTIONS, MANIFEST, CURRENT, small SSTs: most of a
checkpoint's files, few of its bytes) go into one *pack*, itself a content file:
on object storage every file costs a request to upload, to download and to delete,
whatever its size (Spark zips RocksDB's non-SST files per version for the same
reason). ``snapshot/<N>.manifest`` (msgpack) lists the files of the snapshot of
version N::

    {"format": 2, "version": N, "commit": ...,      # the commit it holds (lineage.py)
     "files": [{"name": "000012.sst", "sha256": ..., "size": ...}],   # large files
     "pack": {"sha256": ..., "size": ...,                             # or None
              "files": [{"name": "CURRENT", "sha256": ..., "size": ..., "offset": ...}]}}

A manifest of any other format is refused, the error naming the manifest and its
format. ``commit`` (the id of the commit whose state the snapshot holds) may be
None (state written before any commit id).

The manifest is written last and atomically: a snapshot exists once its manifest
does. On download, names from the manifest are validated (plain file names only:
no path separators, no ``..``, nothing absolute), so a manifest can never make us
write outside the target directory, and every file's hash is checked (the pack's
and each packed file's). A manifest of any other shape (valid msgpack, but no
``files``, an entry that is not a map, a size that is not a count) is as corrupt
as an unreadable one: :class:`CorruptSnapshotError`, so a restore repairs around it
and maintenance never takes it as a base.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import Any

import msgpack

from sessionstore.checkpoint.records.layout import FILES_DIR, content_name, manifest_name
from sessionstore.checkpoint.storage.filesystem import Storage
from sessionstore.errors import SessionStoreError

__all__ = [
    "upload_snapshot",
    "download_snapshot",
    "read_manifest",
    "referenced",
    "content_sizes",
    "CorruptSnapshotError",
    "PACK_THRESHOLD",
]

FORMAT = 2
#: Files smaller than this go into the snapshot's pack.
PACK_THRESHOLD = 1 << 20


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


def _copy_range(src: Any, offset: int, size: int, path: str) -> str:
    """Copy ``size`` bytes of the open file ``src`` from ``offset`` to a new file at
    ``path``, a megabyte at a time; the sha256 of what was copied (short when
    ``src`` ends first)."""
    src.seek(offset)
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        while size > 0:
            chunk = src.read(min(size, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            out.write(chunk)
            size -= len(chunk)
    return digest.hexdigest()


def upload_snapshot(
    storage: Storage,
    local_dir: str,
    version: int,
    threads: int = 8,
    known: set[str] | None = None,
    commit: str | None = None,
    before_manifest: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Upload the checkpoint in ``local_dir`` as the snapshot of ``version``.

    Small files go up as one pack, large ones by content, in parallel (pyarrow
    releases the GIL during I/O), content already in ``known`` (names under
    ``files/``; listed when None) skipped; the manifest, naming ``commit``, is
    written last, after ``before_manifest()`` (which may raise to publish nothing).
    Returns the manifest, with ``uploaded_bytes`` (what was new).
    """
    if known is None:
        known = set(storage.list(FILES_DIR))
    names = sorted(n for n in os.listdir(local_dir) if os.path.isfile(os.path.join(local_dir, n)))
    paths = {n: os.path.join(local_dir, n) for n in names}
    sizes = {n: os.path.getsize(p) for n, p in paths.items()}
    small = [n for n in names if sizes[n] < PACK_THRESHOLD]
    large = [n for n in names if sizes[n] >= PACK_THRESHOLD]
    pack = None
    if small:  # hashed a file at a time, then uploaded streamed: never whole in memory
        entries, offset, whole = [], 0, hashlib.sha256()
        for n in small:
            with open(paths[n], "rb") as f:
                data = f.read()  # below PACK_THRESHOLD
            whole.update(data)
            digest = hashlib.sha256(data).hexdigest()
            entries.append({"name": n, "sha256": digest, "size": len(data), "offset": offset})
            offset += len(data)
        pack = {"sha256": whole.hexdigest(), "size": offset, "files": entries}
    with ThreadPoolExecutor(threads) as pool:
        digests = dict(zip(large, pool.map(_sha256, [paths[n] for n in large]), strict=True))
        todo = {d: paths[n] for n, d in digests.items() if d not in known}
        jobs = [pool.submit(storage.upload_file, p, content_name(d)) for d, p in todo.items()]
        if pack is not None and pack["sha256"] not in known:
            packed = [paths[n] for n in small]
            jobs.append(pool.submit(storage.upload_files, packed, content_name(pack["sha256"])))
        for job in jobs:
            job.result()
    files = [{"name": n, "sha256": digests[n], "size": sizes[n]} for n in large]
    manifest = {"format": FORMAT, "version": version, "files": files, "pack": pack}
    if commit is not None:
        manifest["commit"] = commit
    if before_manifest is not None:
        before_manifest()
    storage.write_atomic(manifest_name(version), msgpack.packb(manifest))
    uploaded = sum(os.path.getsize(p) for p in todo.values())
    if pack is not None and pack["sha256"] not in known:
        uploaded += pack["size"]
    return {**manifest, "uploaded_bytes": uploaded}


def referenced(manifest: dict[str, Any]) -> set[str]:
    """The content files (sha256 names under ``files/``) a manifest uses."""
    used = {f["sha256"] for f in manifest.get("files", [])}
    if manifest.get("pack"):
        used.add(manifest["pack"]["sha256"])
    return used


def content_sizes(manifest: dict[str, Any]) -> dict[str, int]:
    """``sha256 name -> size`` of the content files a (valid) manifest uses."""
    sizes = {f["sha256"]: f["size"] for f in manifest.get("files", [])}
    if manifest.get("pack"):
        sizes[manifest["pack"]["sha256"]] = manifest["pack"]["size"]
    return sizes


def _check_digest(digest: Any, where: str, version: int) -> None:
    if (
        not isinstance(digest, str)
        or len(digest) != 64
        or not all(c in "0123456789abcdef" for c in digest)
    ):
        raise CorruptSnapshotError(where, version, f"bad file hash {digest!r}")


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
    """The validated manifest of the snapshot of ``version`` (format 2: any other is
    refused by name)."""
    rel = manifest_name(version)
    where = f"{storage.uri.rstrip('/')}/{rel}"
    try:
        manifest = msgpack.unpackb(storage.read(rel), raw=False)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise CorruptSnapshotError(where, version, f"unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise CorruptSnapshotError(where, version, f"not a manifest: {manifest!r:.80}")
    if manifest.get("format") != FORMAT:
        raise CorruptSnapshotError(
            where, version,
            f"unknown manifest format {manifest.get('format')!r}; this sessionstore reads "
            f"format {FORMAT} only",
        )  # fmt: skip
    if manifest.get("version") != version:
        raise CorruptSnapshotError(
            where, version, f"manifest says version {manifest.get('version')}"
        )
    if not isinstance(manifest.get("commit"), str | None):
        raise CorruptSnapshotError(where, version, f"bad commit {manifest.get('commit')!r:.80}")
    _entries(manifest.get("files", _MISSING), "files", where, version)
    pack = manifest.get("pack")
    packed = []
    if pack is not None:
        if not isinstance(pack, dict) or not _is_size(pack.get("size")):
            raise CorruptSnapshotError(where, version, f"bad pack {pack!r:.80}")
        _check_digest(pack.get("sha256"), where, version)
        packed = _entries(pack.get("files", _MISSING), "pack files", where, version)
        for entry in packed:
            offset, size = entry.get("offset"), entry["size"]
            if not _is_size(offset) or offset + size > pack["size"]:
                raise CorruptSnapshotError(
                    where, version, f"{entry['name']!r} lies outside the pack"
                )
    return manifest


#: What a manifest without a list of files has in its place.
_MISSING = object()


def _is_size(value: Any) -> bool:
    return type(value) is int and value >= 0


def _entries(entries: Any, what: str, where: str, version: int) -> list[dict[str, Any]]:
    """``entries``, the manifest's list ``what``, if it is a list of files (each a
    map with a plain ``name``, a ``sha256`` and a ``size``): anything else
    (missing, ``[1]``, a size that is text) makes the snapshot corrupt, so that a
    restore repairs around it and maintenance never takes it as a base."""
    if not isinstance(entries, list):
        shown = "missing" if entries is _MISSING else f"not a list: {entries!r:.80}"
        raise CorruptSnapshotError(where, version, f"its {what} are {shown}")
    for entry in entries:
        if not isinstance(entry, dict) or not _is_size(entry.get("size")):
            raise CorruptSnapshotError(where, version, f"bad entry in its {what}: {entry!r:.80}")
        _check_name(entry.get("name"), where, version)
        _check_digest(entry.get("sha256"), where, version)
    return entries


def download_snapshot(
    storage: Storage, version: int, target_dir: str, threads: int = 8
) -> dict[str, Any]:
    """Materialise the snapshot of ``version`` into the empty ``target_dir``: the
    pack and the large files in parallel, every hash checked, each streamed (the
    pack is downloaded to a file there, checked, split and deleted), so memory
    does not grow with their size."""
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

    def unpack(pack: dict[str, Any]) -> None:
        local = os.path.join(target_dir, f".pack-{uuid.uuid4().hex}.tmp")
        try:
            try:
                storage.download(content_name(pack["sha256"]), local)
            except FileNotFoundError as exc:
                raise CorruptSnapshotError(where, version, f"missing pack: {exc}") from None
            if _sha256(local) != pack["sha256"]:
                raise CorruptSnapshotError(
                    where, version, f"the pack does not match its sha256 {pack['sha256']}"
                )
            with open(local, "rb") as blob:
                for entry in pack["files"]:
                    out = os.path.join(target_dir, entry["name"])
                    if _copy_range(blob, entry["offset"], entry["size"], out) != entry["sha256"]:
                        raise CorruptSnapshotError(
                            where,
                            version,
                            f"{entry['name']} does not match its sha256 {entry['sha256']}",
                        )
        finally:
            with suppress(OSError):
                os.unlink(local)

    with ThreadPoolExecutor(threads) as pool:
        jobs = [pool.submit(fetch, entry) for entry in manifest["files"]]
        if manifest.get("pack"):
            jobs.append(pool.submit(unpack, manifest["pack"]))
        for job in jobs:
            job.result()
    return manifest
