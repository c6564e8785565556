"""Object storage behind one interface (``pyarrow.fs``), chosen from a URI.

``open_filesystem(uri, storage_options)`` is the only place that looks at a scheme:
``file://`` or a plain path, ``s3://bucket/prefix``, ``gs://bucket/prefix`` and
``hdfs://host:port/path``. Everything else works on a :class:`Storage`, which adds
atomic writes (a reader never sees half a file) and clear errors.

S3 settings come from ``storage_options`` (``endpoint_override``, ``region``,
``access_key``, ``secret_key``, ``session_token``, ``scheme``, ...) or the standard
AWS environment. Credentials are never logged or shown: :func:`redact` masks them.
"""

from __future__ import annotations

import os
import uuid
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from sessionstore.errors import SessionStoreError

__all__ = ["Storage", "open_filesystem", "redact", "UnknownSchemeError"]

_SECRET_WORDS = ("secret", "token", "password", "key")


class UnknownSchemeError(SessionStoreError, ValueError):
    def __init__(self, uri: str) -> None:
        scheme = urlparse(uri).scheme
        super().__init__(
            f"unsupported storage URI scheme {scheme!r} in {uri!r}: use file://, a local "
            "path, s3://, gs:// or hdfs://"
        )


def redact(options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` with every credential-like value replaced by ``***``."""
    return {
        k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) and k != "region" else v)
        for k, v in (options or {}).items()
    }


def open_filesystem(uri: str, storage_options: dict[str, Any] | None = None) -> Storage:
    """A :class:`Storage` rooted at ``uri``."""
    options = dict(storage_options or {})
    parsed = urlparse(str(uri))
    scheme = parsed.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        path = parsed.path if scheme == "file" else str(uri)
        return Storage(pafs.LocalFileSystem(), os.path.abspath(path), uri)
    if scheme in ("s3", "s3a"):
        fs = pafs.S3FileSystem(**options)
        return Storage(fs, f"{parsed.netloc}{parsed.path}".rstrip("/"), uri)
    if scheme in ("gs", "gcs"):
        fs = pafs.GcsFileSystem(**options)
        return Storage(fs, f"{parsed.netloc}{parsed.path}".rstrip("/"), uri)
    if scheme == "hdfs":
        host = parsed.hostname or "default"
        fs = pafs.HadoopFileSystem(host, parsed.port or 8020, **options)
        return Storage(fs, parsed.path.rstrip("/") or "/", uri)
    raise UnknownSchemeError(str(uri))


class Storage:
    """Files under one root of a ``pyarrow.fs.FileSystem``, addressed by relative path."""

    def __init__(self, fs: pafs.FileSystem, root: str, uri: str) -> None:
        self.fs, self.root, self.uri = fs, root.rstrip("/") or "/", str(uri)
        self._local = isinstance(fs, pafs.LocalFileSystem)

    def __repr__(self) -> str:
        return f"Storage({self.uri!r})"

    @property
    def location(self) -> str:
        """Where these files are, the same however the URI was spelled (a relative
        or absolute path, ``file://``, a trailing slash, ``s3a://`` for ``s3://``):
        the filesystem type and the resolved root."""
        root = os.path.realpath(self.root) if self._local else self.root
        return f"{self.fs.type_name}:{root}"

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def child(self, rel: str) -> Storage:
        """The storage rooted at ``rel`` below this one."""
        return Storage(self.fs, self.path(rel), f"{self.uri.rstrip('/')}/{rel}")

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Write ``data`` so that readers see the old file or the whole new one."""
        target = self.path(rel)
        parent = target.rsplit("/", 1)[0]
        if self._local:
            # write then rename: rename is atomic on a local filesystem
            self.fs.create_dir(parent, recursive=True)
            tmp = f"{parent}/.{target.rsplit('/', 1)[1]}.{uuid.uuid4().hex}.tmp"
            with self.fs.open_output_stream(tmp) as out:
                out.write(data)
            os.replace(tmp, target)
        else:
            # an object store PUT becomes visible whole, on close
            with self.fs.open_output_stream(target) as out:
                out.write(data)

    def upload_file(self, local_path: str, rel: str) -> None:
        """Copy a local file to ``rel`` (atomically, as write_atomic)."""
        with open(local_path, "rb") as f:
            self.write_atomic(rel, f.read())

    def read(self, rel: str, length: int | None = None) -> bytes:
        """The whole file, or its first ``length`` bytes (a ranged read on object
        stores); ``FileNotFoundError`` names the URI when it is missing."""
        try:
            if length is not None:
                with self.fs.open_input_file(self.path(rel)) as f:
                    return f.read_at(min(length, f.size()), 0)
            with self.fs.open_input_stream(self.path(rel)) as f:
                return f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.uri.rstrip('/')}/{rel} does not exist") from None
        except OSError as exc:
            if "not found" in str(exc).lower() or "no such" in str(exc).lower():
                raise FileNotFoundError(f"{self.uri.rstrip('/')}/{rel} does not exist") from None
            raise

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound

    def list(self, rel: str = "") -> list[str]:
        """Names of the files directly below ``rel`` (empty if it does not exist)."""
        selector = pafs.FileSelector(self.path(rel), allow_not_found=True, recursive=False)
        return sorted(
            info.path.rsplit("/", 1)[-1]
            for info in self.fs.get_file_info(selector)
            if info.type == pafs.FileType.File and not info.base_name.startswith(".")
        )

    def list_dirs(self, rel: str = "") -> list[str]:
        """Names of the directories directly below ``rel``."""
        selector = pafs.FileSelector(self.path(rel), allow_not_found=True, recursive=False)
        return sorted(
            info.base_name
            for info in self.fs.get_file_info(selector)
            if info.type == pafs.FileType.Directory
        )

    def size(self, rel: str) -> int:
        return self.fs.get_file_info(self.path(rel)).size or 0

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self.path(rel))
        except FileNotFoundError:
            pass
        except OSError as exc:
            if "not found" not in str(exc).lower():
                raise

    def download(self, rel: str, local_path: str) -> None:
        data = self.read(rel)
        with open(local_path, "wb") as f:
            f.write(data)
