"""Object storage behind one interface (``pyarrow.fs``), chosen from a URI.

``open_filesystem(uri, storage_options)`` is the only place that looks at a scheme:
``file://`` or a plain path, ``s3://bucket/prefix``, ``gs://bucket/prefix`` and
``hdfs://host:port/path``. Everything else works on a :class:`Storage`, which adds
atomic writes (a reader never sees half a file, a failed write leaves nothing at
the name, a local write is on disk once it returns) and clear errors.

S3 settings come from ``storage_options`` (``endpoint_override``, ``region``,
``access_key``, ``secret_key``, ``session_token``, ``scheme``, ...) or the standard
AWS environment (``allow_delayed_open`` defaults to true here: small objects are
then one PUT each); GCS settings (``project_id``, ``anonymous``, ``access_token``,
``endpoint_override``, ``retry_time_limit``, ...) or Google's application default
credentials. Options arrive as text from Spark's conf and the CLI, so
:func:`open_filesystem` converts the ones ``pyarrow.fs`` wants typed (booleans,
seconds). Credentials are never logged or shown: :func:`redact` masks them, and
error messages never contain them.

Requests to an object store are retried by the policy of
:mod:`sessionstore.checkpoint.storage.retry` (its options ``retry_max_attempts`` and
``retry_max_seconds`` travel with the storage options and never reach
``pyarrow.fs``), at one place, :meth:`Storage._call`, which every request goes
through. Transfers stream in chunks of :data:`CHUNK_BYTES`: a file of any size
costs that much memory, not its size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import urlparse

import pyarrow.fs as pafs

from sessionstore.checkpoint.storage.conditional_create import ConditionalCreate
from sessionstore.checkpoint.storage.flush_group import flush_file, flush_paths
from sessionstore.checkpoint.storage.retry import RetryCounter, RetryPolicy, policy_from_options
from sessionstore.errors import SessionStoreError

__all__ = [
    "Storage", "open_filesystem", "redact", "is_secret_option", "secret_values",
    "UnknownSchemeError", "StorageOptionError",
]  # fmt: skip

T = TypeVar("T")

_SECRET_WORDS = ("secret", "token", "password", "key")
#: Options that carry credentials without a secret word in their name: an S3
#: proxy's URI or map (its user and password) and the external id of a role to
#: assume (a shared secret of the role's trust policy).
_SECRET_OPTIONS = frozenset({"proxy_options", "external_id"})
#: Options with a secret word in their name that hold no secret.
_NOT_SECRET = frozenset({"region", "credential_token_expiration"})
#: Bytes a transfer holds at once (one ranged GET each on S3 and GCS; a file below
#: it costs the same requests as a whole read).
CHUNK_BYTES = 8 * 1024 * 1024
#: The largest object written straight to its name on S3 and GCS: below S3's
#: smallest part (5 MiB) and GCS's upload buffer (8 MiB), so nothing is sent before
#: the stream closes. Larger ones go to a hidden name first (see ``Storage._write``).
SINGLE_PUT_BYTES = 5 * 1024 * 1024


class UnknownSchemeError(SessionStoreError, ValueError):
    def __init__(self, uri: str) -> None:
        scheme = urlparse(uri).scheme
        super().__init__(
            f"unsupported storage URI scheme {scheme!r} in {uri!r}: use file://, a local "
            "path, s3://, gs:// or hdfs://"
        )


class StorageOptionError(SessionStoreError, ValueError):
    """A storage option ``pyarrow.fs`` does not know, or a value of the wrong type."""


def is_secret_option(key: str) -> bool:
    """Whether storage option ``key`` holds a credential (never shown, logged or
    put on a command line)."""
    return key in _SECRET_OPTIONS or (
        any(w in key.lower() for w in _SECRET_WORDS) and key not in _NOT_SECRET
    )


def redact(options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` with every credential-like value replaced by ``***``."""
    return {k: ("***" if is_secret_option(k) else v) for k, v in (options or {}).items()}


def secret_values(options: dict[str, Any] | None) -> tuple[str, ...]:
    """The text of every secret option's value, to mask wherever a message could
    quote it: a map's values (a proxy's ``username``, ``password``) one by one, as
    a client quotes them so."""
    found: list[str] = []
    for key, value in (options or {}).items():
        if not is_secret_option(key) or not value:
            continue
        if isinstance(value, dict):
            found += [str(v) for k, v in value.items() if v and k in ("username", "password")]
        else:
            found.append(str(value))
    return tuple(found)


# Options whose pyarrow type is not text. Values from Spark's conf or the CLI are
# text, and pyarrow takes any string as a true boolean ("false" included).
_BOOLEAN = {
    "anonymous", "background_writes", "allow_delayed_open", "allow_bucket_creation",
    "allow_bucket_deletion", "check_directory_existence_before_creation",
    "force_virtual_addressing",
}  # fmt: skip
_REAL = {"request_timeout", "connect_timeout"}  # S3, seconds
_INTEGER = {"load_frequency"}  # S3, seconds
_SECONDS = {"retry_time_limit"}  # GCS: a timedelta
_TIME = {"credential_token_expiration"}  # GCS: a datetime


def _typed(uri: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with text values converted to the types ``pyarrow.fs`` expects;
    :class:`StorageOptionError` names the option and its value (masked if secret)."""
    out = dict(options)
    for key, value in options.items():
        if not isinstance(value, str):
            if key in _SECONDS and isinstance(value, int | float):
                out[key] = timedelta(seconds=value)
            continue
        text = value.strip()
        try:
            if key in _BOOLEAN:
                if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                out[key] = text.lower() in ("true", "1", "yes")
            elif key in _REAL:
                out[key] = float(text)
            elif key in _INTEGER:
                out[key] = int(text)
            elif key in _SECONDS:
                out[key] = timedelta(seconds=float(text))
            elif key in _TIME:
                moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
                out[key] = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        except ValueError:
            kind = (
                "true or false" if key in _BOOLEAN
                else "an ISO-8601 time" if key in _TIME
                else "a number of seconds"
            )  # fmt: skip
            shown = "***" if is_secret_option(key) else repr(value)
            raise StorageOptionError(
                f"storage option {key}={shown} for {uri}: expected {kind}"
            ) from None
    return out


def _make(
    uri: str, cls: type, *args: Any, defaults: dict[str, Any] | None = None, **options: Any
) -> pafs.FileSystem:
    """``cls(*args, **defaults, **options)``; a bad option becomes a
    :class:`StorageOptionError` naming the options given (pyarrow's messages never
    show values, so no secret leaks)."""
    try:
        return cls(*args, **{**(defaults or {}), **_typed(uri, options)})
    except (TypeError, AttributeError) as exc:
        raise StorageOptionError(
            f"bad storage options for {uri} ({', '.join(sorted(options)) or 'none'}): {exc}"
        ) from None


def open_filesystem(uri: str, storage_options: dict[str, Any] | None = None) -> Storage:
    """A :class:`Storage` rooted at ``uri``, with the retry policy the options give
    (:func:`~sessionstore.checkpoint.storage.retry.policy_from_options`)."""
    options = dict(storage_options or {})
    try:
        retry = policy_from_options(str(uri), options)
    except ValueError as exc:
        raise StorageOptionError(f"bad retry option: {exc}") from None
    parsed = urlparse(str(uri))
    scheme = parsed.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        path = parsed.path if scheme == "file" else str(uri)
        return Storage(pafs.LocalFileSystem(), os.path.abspath(path), uri, retry=retry)
    secrets = secret_values(options)
    if scheme in ("s3", "s3a"):
        # Without delayed open, pyarrow's S3 writes every object as a multipart
        # upload: 3 requests (create, part, complete) for a changelog of a few KB.
        # With it, an object below the part size (10 MB) is one PutObject, as
        # atomic (apache/arrow#40557); larger ones are multipart still.
        defaults: dict[str, Any] = {"allow_delayed_open": True}
        # Background writes queue every part of a large upload in memory while it
        # is sent (a 96 MB file took 126 MB); without them a part is sent as it is
        # written, so an upload holds about one part (small objects are one PUT
        # at close either way, and snapshots upload several files at once).
        defaults["background_writes"] = False
        # one attempt per call: ours retries (retry.py: never attempts squared)
        defaults["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=1)
        fs = _make(str(uri), pafs.S3FileSystem, defaults=defaults, **options)
        create = ConditionalCreate("s3", _typed(str(uri), options), str(uri))
        root = f"{parsed.netloc}{parsed.path}".rstrip("/")
        return Storage(fs, root, uri, secrets, retry, conditional_create=create)
    if scheme in ("gs", "gcs"):
        # pyarrow's default is to retry each call for 15 minutes; ours retries.
        # One second, not zero: Google's client checks its limit before the first
        # attempt too, and refuses every call at zero.
        defaults = {"retry_time_limit": timedelta(seconds=1)}
        fs = _make(str(uri), pafs.GcsFileSystem, defaults=defaults, **options)
        create = ConditionalCreate("gcs", _typed(str(uri), options), str(uri))
        root = f"{parsed.netloc}{parsed.path}".rstrip("/")
        return Storage(fs, root, uri, secrets, retry, conditional_create=create)
    if scheme == "hdfs":
        host = parsed.hostname or "default"
        fs = _make(str(uri), pafs.HadoopFileSystem, host, parsed.port or 8020, **options)
        return Storage(fs, parsed.path.rstrip("/") or "/", uri, secrets, retry)
    raise UnknownSchemeError(str(uri))


class Storage:
    """Files under one root of a ``pyarrow.fs.FileSystem``, addressed by relative path.

    Every failure is re-raised as the same ``OSError`` type with a message naming the
    file by its URI (``gs://bucket/object``: pyarrow's GCS errors name neither) and
    with the values of secret options masked. On an object store, a transient
    failure is first retried by ``retry`` (a local disk is not: its errors do not
    pass); :attr:`retries` counts the retried attempts, children included.
    ``conditional_create`` (S3 and GCS) gives :meth:`write_exclusive` on an object
    store."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        root: str,
        uri: str,
        secrets: tuple[str, ...] = (),
        retry: RetryPolicy | None = None,
        counter: RetryCounter | None = None,
        conditional_create: ConditionalCreate | None = None,
    ) -> None:
        self.fs, self.root, self.uri = fs, root.rstrip("/") or "/", str(uri)
        self._local = isinstance(fs, pafs.LocalFileSystem)
        #: S3 and GCS publish an upload whole when it completes; HDFS and other
        #: stores show a file while it is written
        self._whole_put = fs.type_name in ("s3", "gcs")
        self._secrets = secrets
        self.retry = retry or RetryPolicy()
        self._counter = counter or RetryCounter()
        self._create = conditional_create

    @property
    def local(self) -> bool:
        """Whether this is a local filesystem (``link`` is its exclusive create)."""
        return self._local

    @property
    def retries(self) -> int:
        """Attempts that failed transiently and were tried again, by this storage and
        every storage made from it by :meth:`child`."""
        return self._counter.retries

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

    def where(self, rel: str) -> str:
        """``rel`` for a message: its URI (on object stores: bucket and object)."""
        return f"{self.uri.rstrip('/')}/{rel}" if rel else self.uri

    def _clean(self, text: str) -> str:
        """``text`` on one line (GCS statuses span several), secrets masked."""
        text = " ".join(text.split())
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @contextmanager
    def _naming(self, action: str, rel: str) -> Iterator[None]:
        """Re-raise an ``OSError`` of ``action`` on ``rel`` naming the file."""
        try:
            yield
        except OSError as exc:
            message = self._clean(f"cannot {action} {self.where(rel)}: {exc}")
            raise type(exc)(message) from None

    def _call(self, action: str, rel: str, fn: Callable[[], T]) -> T:
        """``fn()``, one request (or a few that are retried together), under the
        retry policy on an object store; its error names the file."""
        if self._local:
            with self._naming(action, rel):
                return fn()

        def attempt() -> T:
            with self._naming(action, rel):
                return fn()

        return self.retry.call(attempt, self._counter)

    def child(self, rel: str) -> Storage:
        """The storage rooted at ``rel`` below this one."""
        return Storage(
            self.fs, self.path(rel), f"{self.uri.rstrip('/')}/{rel}", self._secrets,
            self.retry, self._counter, self._create,
        )  # fmt: skip

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Write ``data`` so that readers see the old file or the whole new one, and
        a failed write leaves nothing new at ``rel`` (see :meth:`_write`)."""
        self._call("write", rel, lambda: self._write(rel, lambda out: out.write(data), len(data)))

    def _write(
        self,
        rel: str,
        fill: Callable[[Any], Any],
        size: int | None = None,
        publish: Callable[[str, str], None] = os.replace,
    ) -> None:
        """Create ``rel`` atomically with what ``fill(stream)`` writes (``size``
        bytes, when known): a reader sees no object or the whole one, and an
        exception leaves nothing at ``rel``.

        A local file is written beside the target, flushed to disk and made
        visible by ``publish(tmp, target)`` (``os.replace``, or ``os.link``, which
        refuses an existing name), then its directory is flushed too: once this
        returns, a power loss keeps it (inside a
        :func:`~sessionstore.checkpoint.storage.flush_group.flush_group`, once the
        group ends).
        pyarrow cannot abort an upload (apache/arrow#40502): a stream that ends
        in an exception is closed, and the close completes the upload with what
        was sent. So only an object of at most :data:`SINGLE_PUT_BYTES` in
        memory goes to its name directly on S3 and GCS (the client sends
        nothing before the close, and the close is one request that publishes
        all of it or nothing); anything else, and every write on HDFS and other
        stores (which show a file while it is written), goes to a hidden
        temporary name first and is moved to ``rel`` once whole."""
        if self._local:
            self._write_local(rel, fill, publish)
        elif self._whole_put and size is not None and size <= SINGLE_PUT_BYTES:
            with self.fs.open_output_stream(self.path(rel)) as out:
                fill(out)
        else:
            self._write_aside(rel, fill)

    def _write_local(
        self, rel: str, fill: Callable[[Any], Any], publish: Callable[[str, str], None]
    ) -> None:
        target = self.path(rel)
        parent = os.path.dirname(target)
        changed = _make_dirs(parent)
        tmp = _aside(target)
        try:
            with open(tmp, "wb") as out:
                fill(out)
                flush_file(out, target)  # the name it has once published
            try:
                publish(tmp, target)
            except FileExistsError:
                # another writer's file, which the caller reads and may adopt: its
                # writer may flush it only at the end of its own flush group
                flush_paths([target, parent, *changed])
                raise
        finally:
            with suppress(OSError):  # gone already if a replace consumed it
                os.unlink(tmp)
        flush_paths([parent, *changed])

    def _write_aside(self, rel: str, fill: Callable[[Any], Any]) -> None:
        """Write to a hidden name beside ``rel`` (listings skip it), then move it
        to ``rel``: an S3 or GCS copy, whole or not at all, or a rename; the
        hidden object is deleted whatever happened."""
        target = self.path(rel)
        tmp, moved = _aside(target), False
        if not self._whole_put:  # a store with directories
            self.fs.create_dir(target.rpartition("/")[0], recursive=True)
        try:
            with self.fs.open_output_stream(tmp) as out:
                fill(out)
            try:
                self.fs.move(tmp, target)
            except OSError:
                # HDFS renames only to a free name: a reader sees the old file or
                # none for a moment, never a part
                if self._whole_put or self.fs.get_file_info(target).type != pafs.FileType.File:
                    raise
                self.fs.delete_file(target)
                self.fs.move(tmp, target)
            moved = True
        finally:
            if not moved:
                with suppress(OSError):  # perhaps never made
                    self.fs.delete_file(tmp)

    @property
    def exclusive_create(self) -> bool:
        """Whether :meth:`write_exclusive` can refuse to replace a file: on a local
        filesystem (``link`` fails on an existing name), and on S3 and GCS when
        their client is installed (a conditional create, conditional_create.py;
        pyarrow exposes no precondition). The first call on an object store
        imports that client."""
        return self._local or (self._create is not None and self._create.available)

    def write_exclusive(self, rel: str, data: bytes) -> bool:
        """Write ``data`` atomically unless ``rel`` exists: True if written, False
        if another writer's file was there first (it is left as it was; on S3
        also while another conditional write of it is under way: read it to
        know). Only where :attr:`exclusive_create` holds. On an object store one
        request, under the retry policy (a refusal is an answer, not retried)."""
        if not self._local:
            if not self.exclusive_create:
                raise NotImplementedError(f"{self.uri} offers no exclusive create")
            create = self._create
            return self._call("write", rel, lambda: create(self.path(rel), data))
        with self._naming("write", rel):
            try:
                self._write(rel, lambda out: out.write(data), len(data), publish=os.link)
            except FileExistsError:
                return False
        return True

    def fence_gap(self) -> str | None:
        """Why :meth:`write_exclusive` cannot refuse a taken name here (None when it
        can), without the warning a commit would log: what planning names."""
        if self._local:
            return None
        if self._create is None:
            return f"{self.fs.type_name} storage offers no conditional create"
        return self._create.why_unavailable()

    def replace_if(self, rel: str, data: bytes, tag: str) -> bool:
        """Replace ``rel`` by ``data`` only if it is still the version ``tag`` names
        (:meth:`read_tagged`; S3 ``If-Match``, GCS ``ifGenerationMatch``): True if
        written, False if it changed or went meanwhile. Where
        :attr:`exclusive_create` holds on an object store; one request under the
        retry policy."""
        if self._local or not self.exclusive_create:
            raise NotImplementedError(f"{self.uri} offers no conditional replace")
        create = self._create
        return self._call("write", rel, lambda: create.replace(self.path(rel), data, tag))

    def within(self, seconds: float) -> Storage:
        """This storage, whose retries start no attempt later than ``seconds`` from
        the first (where a write must land before a deadline or not at all)."""
        retry = dataclasses.replace(self.retry, max_seconds=min(self.retry.max_seconds, seconds))
        return Storage(
            self.fs, self.root, self.uri, self._secrets, retry, self._counter, self._create
        )

    def upload_file(self, local_path: str, rel: str) -> None:
        """Copy a local file to ``rel`` (atomically, as write_atomic), streamed:
        :data:`CHUNK_BYTES` in memory at a time however large the file."""
        self.upload_files([local_path], rel)

    def read_tagged(self, rel: str) -> tuple[bytes, str | None]:
        """The whole file, and the tag of the version read for :meth:`replace_if`
        (S3: its ETag, GCS: its generation, from the HEAD before the read; None
        elsewhere). Should the object change between the two, the tag is the older
        version's, and a replacement conditional on it is refused."""

        def attempt() -> tuple[bytes, str | None]:
            with self.fs.open_input_file(self.path(rel)) as f:
                size = f.size()
                data = f.read_at(size, 0) if size else b""
                meta = f.metadata() if self._whole_put else {}
            tag = meta.get("ETag") or meta.get("generation") if meta else None
            return data, tag.decode() if tag else None

        with self._missing(rel):
            return self._call("read", rel, attempt)

    def read(self, rel: str, length: int | None = None) -> bytes:
        """The whole file, or its first ``length`` bytes (a ranged read on object
        stores); ``FileNotFoundError`` names the URI when it is missing."""

        def attempt() -> bytes:
            # A random-access file learns its size first (on S3 and GCS a HEAD:
            # pyarrow's Python API takes no FileInfo that would spare it), then
            # reads it in one GET; an input stream reads an object in chunks of
            # 256 KB, one GET each.
            with self.fs.open_input_file(self.path(rel)) as f:
                size = f.size()
                wanted = size if length is None else min(length, size)
                # GCS answers a ranged read of nothing (an empty object) with 416
                return f.read_at(wanted, 0) if wanted else b""

        with self._missing(rel):
            return self._call("read", rel, attempt)

    def digest(self, rel: str) -> str:
        """The sha256 (hex) of ``rel``'s bytes, read in chunks of
        :data:`CHUNK_BYTES` (one ranged GET each on S3 and GCS)."""

        def attempt() -> str:
            h = hashlib.sha256()
            with self.fs.open_input_file(self.path(rel)) as f:
                for chunk in _chunks(f):
                    h.update(chunk)
            return h.hexdigest()

        with self._missing(rel):
            return self._call("read", rel, attempt)

    @contextmanager
    def _missing(self, rel: str) -> Iterator[None]:
        """A missing file's error, whichever way the backend words it, as a
        ``FileNotFoundError`` naming its URI."""
        try:
            yield
        except OSError as exc:
            text = str(exc).lower()
            if isinstance(exc, FileNotFoundError) or "not found" in text or "no such" in text:
                raise FileNotFoundError(f"{self.where(rel)} does not exist") from None
            raise

    def exists(self, rel: str) -> bool:
        return self._call(
            "look up", rel,
            lambda: self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound,
        )  # fmt: skip

    def list(self, rel: str = "") -> list[str]:
        """Names of the files directly below ``rel`` (empty if it does not exist)."""
        return sorted(self.stamps(rel))

    def stamps(self, rel: str = "") -> dict[str, tuple[int | None, int | None]]:
        """``name -> (size, modification time in ns)`` of the files directly below
        ``rel``, from the same one listing as :meth:`list` (an object rewritten
        since shows another stamp)."""
        selector = pafs.FileSelector(self.path(rel), allow_not_found=True, recursive=False)
        infos = self._call("list", rel, lambda: self.fs.get_file_info(selector))
        return {
            info.base_name: (info.size, info.mtime_ns)
            for info in infos
            if info.type == pafs.FileType.File and not info.base_name.startswith(".")
        }

    def list_files(self, rel: str = "") -> list[str]:
        """Paths of the files at any depth below ``rel``, relative to it (empty if it
        does not exist). On S3 and GCS one listing request per 1000 objects, as
        :meth:`list`."""
        base = self.path(rel)
        selector = pafs.FileSelector(base, allow_not_found=True, recursive=True)
        infos = self._call("list", rel, lambda: self.fs.get_file_info(selector))
        return sorted(
            info.path[len(base) :].strip("/")
            for info in infos
            if info.type == pafs.FileType.File and not info.base_name.startswith(".")
        )

    def has_files(self, rel: str = "") -> bool:
        """Whether any file lies below ``rel``, at any depth (False if it does not
        exist; a file at ``rel`` itself counts)."""

        def attempt() -> bool:
            info = self.fs.get_file_info(self.path(rel))
            if info.type == pafs.FileType.File:
                return True
            selector = pafs.FileSelector(self.path(rel), allow_not_found=True, recursive=True)
            return any(
                i.type == pafs.FileType.File and not i.base_name.startswith(".")
                for i in self.fs.get_file_info(selector)
            )

        return self._call("list", rel, attempt)

    def list_dirs(self, rel: str = "") -> list[str]:
        """Names of the directories directly below ``rel``."""
        # pyarrow's GCS listing shows no directory that is only implied by the names
        # of the objects below it (apache/arrow#35993), which is every directory
        # here, so on GCS the names come from a recursive listing.
        recursive = self.fs.type_name == "gcs"
        base = self.path(rel)
        selector = pafs.FileSelector(base, allow_not_found=True, recursive=recursive)
        infos = self._call("list", rel, lambda: self.fs.get_file_info(selector))
        names = set()
        for info in infos:
            parts = info.path[len(base) :].strip("/").split("/")
            if info.type == pafs.FileType.Directory or (recursive and len(parts) > 1):
                names.add(parts[0])
        return sorted(names)

    def size(self, rel: str) -> int:
        return self._call("look up", rel, lambda: self.fs.get_file_info(self.path(rel)).size or 0)

    def delete(self, rel: str) -> None:
        try:
            self._call("delete", rel, lambda: self.fs.delete_file(self.path(rel)))
        except FileNotFoundError:
            pass
        except OSError as exc:
            if not _says_missing(exc):
                raise

    def delete_dir(self, rel: str) -> None:
        """Delete the folder ``rel`` and everything below it (nothing if it does not
        exist). On S3 a listing and one DeleteObjects per 1000 objects, where
        :meth:`delete` of each would cost a HEAD, a DELETE and a PUT apiece."""
        try:
            self._call("delete", rel, lambda: self.fs.delete_dir(self.path(rel)))
        except FileNotFoundError:
            pass
        except OSError as exc:
            if not _says_missing(exc):
                raise

    def download(self, rel: str, local_path: str) -> None:
        """Copy ``rel`` to the local file ``local_path``, streamed: at most
        :data:`CHUNK_BYTES` in memory however large the file (on S3 and GCS a HEAD
        and one ranged GET per chunk: a small file costs what :meth:`read` does). A
        retried attempt starts the local file again."""

        def attempt() -> None:
            with self.fs.open_input_file(self.path(rel)) as f, open(local_path, "wb") as out:
                for chunk in _chunks(f):
                    out.write(chunk)

        with self._missing(rel):
            self._call("read", rel, attempt)

    def upload_files(self, local_paths: list[str], rel: str) -> None:
        """Write the local files one after the other to ``rel`` (atomically, as
        :meth:`upload_file`), streamed: :data:`CHUNK_BYTES` in memory at a time
        however large they are (a snapshot's pack)."""

        size = sum(os.path.getsize(p) for p in local_paths)
        if size <= SINGLE_PUT_BYTES:
            # read whole before the stream opens: a direct PUT is published by the
            # stream's close even after an exception, so only bytes already in
            # memory may go that way (one request for a small pack or file)
            data = b"".join(_read_local(p) for p in local_paths)
            self._call("write", rel, lambda: self._write(rel, lambda out: out.write(data), size))
            return

        def fill(out: Any) -> None:
            for local_path in local_paths:
                with open(local_path, "rb") as f:
                    shutil.copyfileobj(f, out, CHUNK_BYTES)

        self._call("write", rel, lambda: self._write(rel, fill))  # aside, then moved


def _chunks(f: Any) -> Iterator[bytes]:
    """The bytes of the open input file ``f``, :data:`CHUNK_BYTES` at a time (one
    ranged GET each on S3 and GCS); an object shorter than its size is an error."""
    size, offset = f.size(), 0
    while offset < size:
        chunk = f.read_at(min(CHUNK_BYTES, size - offset), offset)
        if not chunk:
            raise OSError(f"the object ended at byte {offset} of {size}")
        yield chunk
        offset += len(chunk)


def _read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _aside(target: str) -> str:
    """A hidden temporary name beside ``target`` (listings skip names with a dot)."""
    head, _, name = target.rpartition("/")
    return f"{head}/.{name}.{uuid.uuid4().hex}.tmp"


def _make_dirs(path: str) -> list[str]:
    """Create the directory ``path`` and its missing parents; the directories that
    gained an entry (to flush after: :func:`~sessionstore.checkpoint.storage.flush_group.flush_paths`)."""
    created, probe = [], path
    while probe and not os.path.isdir(probe):
        created.append(probe)
        probe = os.path.dirname(probe)
    os.makedirs(path, exist_ok=True)
    return [os.path.dirname(d) for d in created]


def _says_missing(exc: OSError) -> bool:
    """Whether a backend's error means the object was not there: some pyarrow
    filesystems raise a plain OSError worded "not found", others "does not exist"
    (deleting what is already gone is not an error). A missing bucket is a
    configuration error, never ignored."""
    text = str(exc).lower()
    return ("not found" in text or "does not exist" in text) and "bucket" not in text
