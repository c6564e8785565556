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
and each packed file's).
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
    "referenced",
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


def upload_snapshot(
    storage: Storage,
    local_dir: str,
    version: int,
    threads: int = 8,
    known: set[str] | None = None,
    commit: str | None = None,
) -> dict[str, Any]:
    """Upload the checkpoint in ``local_dir`` as the snapshot of ``version``.

    Small files go up as one pack, large ones by content, in parallel (pyarrow
    releases the GIL during I/O), content already in ``known`` (names under
    ``files/``; listed when None) skipped; the manifest, naming ``commit``, is
    written last. Returns the manifest, with ``uploaded_bytes`` (what was new).
    """
    if known is None:
        known = set(storage.list(FILES_DIR))
    names = sorted(n for n in os.listdir(local_dir) if os.path.isfile(os.path.join(local_dir, n)))
    paths = {n: os.path.join(local_dir, n) for n in names}
    sizes = {n: os.path.getsize(p) for n, p in paths.items()}
    small = [n for n in names if sizes[n] < PACK_THRESHOLD]
    large = [n for n in names if sizes[n] >= PACK_THRESHOLD]
    pack, blob = None, b""
    if small:
        parts, entries, offset = [], [], 0
        for n in small:
            with open(paths[n], "rb") as f:
                data = f.read()
            digest = hashlib.sha256(data).hexdigest()
            entries.append({"name": n, "sha256": digest, "size": len(data), "offset": offset})
            parts.append(data)
            offset += len(data)
        blob = b"".join(parts)
        pack = {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob), "files": entries}
    with ThreadPoolExecutor(threads) as pool:
        digests = dict(zip(large, pool.map(_sha256, [paths[n] for n in large]), strict=True))
        todo = {d: paths[n] for n, d in digests.items() if d not in known}
        jobs = [pool.submit(storage.upload_file, p, content_name(d)) for d, p in todo.items()]
        if pack is not None and pack["sha256"] not in known:
            jobs.append(pool.submit(storage.write_atomic, content_name(pack["sha256"]), blob))
        for job in jobs:
            job.result()
    files = [{"name": n, "sha256": digests[n], "size": sizes[n]} for n in large]
    manifest = {"format": FORMAT, "version": version, "files": files, "pack": pack}
    if commit is not None:
        manifest["commit"] = commit
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
    pack = manifest.get("pack")
    packed = []
    if pack is not None:
        if not isinstance(pack, dict) or not isinstance(pack.get("size"), int):
            raise CorruptSnapshotError(where, version, f"bad pack {pack!r:.80}")
        _check_digest(pack.get("sha256"), where, version)
        packed = pack.get("files", [])
        for entry in packed:
            offset, size = entry.get("offset"), entry.get("size")
            if (
                not isinstance(offset, int)
                or not isinstance(size, int)
                or offset < 0
                or size < 0
                or offset + size > pack["size"]
            ):
                raise CorruptSnapshotError(
                    where, version, f"{entry.get('name')!r} lies outside the pack"
                )
    for entry in [*manifest.get("files", []), *packed]:
        _check_name(entry.get("name"), where, version)
        _check_digest(entry.get("sha256"), where, version)
    return manifest


def download_snapshot(
    storage: Storage, version: int, target_dir: str, threads: int = 8
) -> dict[str, Any]:
    """Materialise the snapshot of ``version`` into the empty ``target_dir``: the
    pack in one read, large files in parallel, every hash checked."""
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
        try:
            blob = storage.read(content_name(pack["sha256"]))
        except FileNotFoundError as exc:
            raise CorruptSnapshotError(where, version, f"missing pack: {exc}") from None
        if hashlib.sha256(blob).hexdigest() != pack["sha256"]:
            raise CorruptSnapshotError(
                where, version, f"the pack does not match its sha256 {pack['sha256']}"
            )
        for entry in pack["files"]:
            data = blob[entry["offset"] : entry["offset"] + entry["size"]]
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise CorruptSnapshotError(
                    where, version, f"{entry['name']} does not match its sha256 {entry['sha256']}"
                )
            with open(os.path.join(target_dir, entry["name"]), "wb") as f:
                f.write(data)

    with ThreadPoolExecutor(threads) as pool:
        jobs = [pool.submit(fetch, entry) for entry in manifest["files"]]
        if manifest.get("pack"):
            jobs.append(pool.submit(unpack, manifest["pack"]))
        for job in jobs:
            job.result()
    return manifest
