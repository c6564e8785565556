"""Conditional create on object stores: write an object only if its name is free.

The fence between two attempts of one batch (:func:`~sessionstore.checkpoint.partition.lineage.publish`)
needs a write that refuses an existing name, atomically, at the store. ``pyarrow.fs``
offers none for S3 or GCS, so :class:`ConditionalCreate` makes that one request with
each store's own client, reaching the same endpoint with the same credentials as the
``pyarrow.fs`` filesystem built from the same storage options:

* **S3**: ``PutObject`` with ``If-None-Match: *`` (boto3, the ``s3`` extra). S3
  answers 412 ``PreconditionFailed`` when the key exists, and 409
  ``ConditionalRequestConflict`` when another conditional write of the key is under
  way; both say "not yours (yet)": the caller reads the name and decides.
* **GCS**: a JSON API upload with ``ifGenerationMatch=0`` (google-auth's
  ``AuthorizedSession``, the ``gcs`` extra): 412 when the object exists. The upload
  is a *multipart* one (metadata and bytes in one request), the form Google's own
  client uses for small objects. Why google-auth and not google-cloud-storage: this
  is one request, and google-cloud-storage would add six packages (api-core,
  cloud-core, resumable-media, crc32c, protobuf, proto-plus) and a retry layer of
  its own under ours (retry.py: never attempts squared), for nothing more.

The same request replaces a changelog only if it is still the version read
(:meth:`ConditionalCreate.replace`): S3 ``If-Match: <ETag>`` (412 when it changed,
404 when it is gone), GCS ``ifGenerationMatch=<generation>``.

A changelog is a few KB to a few MB, already in memory: one request carries it
whole, and the store shows it only once complete (atomic, as every upload here).

Without the library (the extra not installed), or with a storage option that
changes how objects are written and that is not mapped here (``default_metadata``),
:attr:`ConditionalCreate.available`
is False and one warning per process says so and names the extra: the fence then
looks before it writes, as on any other ``pyarrow.fs`` target (docs/durability.md
says what that guarantees). The library is imported, and the client built, at the
first commit, not when a checkpoint is opened for reading; clients are shared by
every storage of the process with the same options.

Errors are ``OSError`` worded so that :mod:`~sessionstore.checkpoint.storage.retry` tells a
transient one (a 5xx, throttling, a reset connection) from a permanent one; the
caller runs each request under the retry policy.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from sessionstore.process import this_process

__all__ = ["ConditionalCreate", "ConditionalCreateUnsupported", "EXTRAS"]

log = logging.getLogger(__name__)

#: The extra that installs each store's client.
EXTRAS = {"s3": "sessionstore[s3]", "gcs": "sessionstore[gcs]"}
#: Storage options not mapped onto the store's own client: with one of them set the
#: conditional create would write otherwise than pyarrow (metadata), so it is not used.
_UNMAPPED = {"s3": ("default_metadata",), "gcs": ("default_metadata",)}
#: Seconds a GCS request may take (pyarrow's GCS options have no timeout to copy).
_GCS_TIMEOUT_S = (10.0, 60.0)
_GCS_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"

#: ``put(path, data, match) -> bool``: ``path`` is ``bucket/key``. With ``match``
#: None, a create: True if written, False if the name was taken (or another
#: conditional write of it was under way). Else a replacement of the version
#: ``match`` names (S3's ETag, GCS's generation): False if the object is another
#: version by now, or gone.
Create = Callable[[str, bytes, "str | None"], bool]

#: The once-per-process event of :func:`_warn_once`, by store (:mod:`sessionstore.process`).
LOOK_BEFORE_WRITE_WARNING = "look_before_write"


class ConditionalCreateUnsupported(NotImplementedError):
    """The store answered a conditional create as a request it does not implement
    (an S3-compatible store without ``If-None-Match``: 501, or a 400 naming the
    header): the fence looks before it writes there from then on."""


def _warn_once(key: str, uri: str, why: str, fix: str) -> None:
    if not this_process().first_time(LOOK_BEFORE_WRITE_WARNING, key):
        return
    log.warning(
        "sessionstore: %s, so a changelog on %s is published by looking before writing: "
        "two attempts of one batch whose uploads overlap can both pass the look and the "
        "later object stays (a later load then fails with LineageError rather than mix "
        "them). The driver's coordinator, when reachable, still decides; for a fence at "
        "the store itself %s (docs/durability.md, Lineage).",
        why, uri, fix,
    )  # fmt: skip


class ConditionalCreate:
    """Creates objects on one S3 or GCS endpoint only under free names.

    ``kind`` is ``"s3"`` or ``"gcs"``; ``options`` are the typed options the
    ``pyarrow.fs`` filesystem got. Nothing is imported or built until first use."""

    def __init__(self, kind: str, options: dict[str, Any], uri: str) -> None:
        if kind not in EXTRAS:
            raise ValueError(f"no conditional create for {kind!r} storage ({uri})")
        self.kind, self._options, self._uri = kind, dict(options), uri
        self._create: Create | None = None
        self._why: str | None = None
        self._fix: str | None = None
        self._built = False
        self._build_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ConditionalCreate({self.kind!r}, {self._uri!r})"

    @property
    def available(self) -> bool:
        """Whether the store's client is installed and the options map onto it (else
        one warning per process, naming the extra)."""
        return self._get() is not None

    def why_unavailable(self) -> str | None:
        """Why :attr:`available` is False (None when it is True), without the
        warning: what planning names in its own."""
        self._get(warn=False)
        return self._why

    def __call__(self, path: str, data: bytes) -> bool:
        """Create ``path`` (``bucket/key``) holding ``data`` unless it exists: True if
        written, False if the name was taken. One request; transient errors raise
        (the caller retries)."""
        return self._put(path, data, None)

    def replace(self, path: str, data: bytes, tag: str) -> bool:
        """Replace ``path`` by ``data`` only if it is still the version ``tag``
        names (:meth:`Storage.read_tagged`: S3's ``If-Match: <ETag>``, GCS's
        ``ifGenerationMatch=<generation>``): True if written, False if it changed
        or went meanwhile. One request, as :meth:`__call__`."""
        return self._put(path, data, tag)

    def _put(self, path: str, data: bytes, match: str | None) -> bool:
        create = self._get()
        if create is None:
            raise NotImplementedError(f"{self._uri} offers no conditional create here")
        try:
            return create(path, data, match)
        except ConditionalCreateUnsupported as exc:
            why = f"the store does not implement conditional writes ({exc})"
            with self._build_lock:
                self._create, self._why = None, why  # available is False from now on
            _warn_once(f"{self.kind}:unsupported:{self._uri}", self._uri, why,
                       "use a store that implements them")  # fmt: skip
            raise

    def _get(self, warn: bool = True) -> Create | None:
        with self._build_lock:
            if not self._built:
                self._create, self._why, self._fix = self._build()
                self._built = True
            create, why, fix = self._create, self._why, self._fix
        if create is None and warn and fix is not None:
            _warn_once(f"{self.kind}:{why}", self._uri, why, fix)
        return create

    def _build(self) -> tuple[Create | None, str | None, str | None]:
        """The store's put, or None with why and what to do about it."""
        unmapped = [k for k in _UNMAPPED[self.kind] if self._options.get(k)]
        if unmapped:
            names = ", ".join(unmapped)
            why = f"the conditional create does not support the storage option {names}"
            return None, why, f"leave out {names}"
        try:
            builder = _s3 if self.kind == "s3" else _gcs
            return builder(self._options), None, None
        except ImportError as exc:
            return None, f"{exc.name or exc} is not installed", f"install {EXTRAS[self.kind]}"


# ----------------------------------------------------------------------------- S3
def _s3(options: dict[str, Any]) -> Create:
    import botocore.exceptions as errors  # the s3 extra (boto3 brings botocore)

    client = _s3_client(options)
    put = client.meta.service_model.operation_model("PutObject")
    if not {"IfNoneMatch", "IfMatch"} <= set(put.input_shape.members):  # before Nov. 2024
        raise ImportError("boto3 too old", name="a boto3 that knows S3's conditional writes")

    def create(path: str, data: bytes, match: str | None) -> bool:
        bucket, _, key = path.partition("/")
        condition = {"IfNoneMatch": "*"} if match is None else {"IfMatch": match}
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, **condition)
        except errors.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            if match is not None and (status == 404 or code == "NoSuchKey"):
                return False  # the version to replace is gone
            message = exc.response.get("Error", {}).get("Message", "")
            headers = ("if-none-match", "if-match")
            if status == 501 or code == "NotImplemented" or (
                status == 400 and any(h in f"{code} {message}".lower() for h in headers)
            ):
                raise ConditionalCreateUnsupported(
                    f"S3 PutObject with {next(iter(condition))} refused: {code} "
                    f"(HTTP {status}): {message}"
                ) from None
            raise OSError(f"S3 PutObject failed: {code} (HTTP {status}): {message}") from None
        except errors.BotoCoreError as exc:  # connection, timeout, credentials
            raise OSError(f"S3 PutObject failed: {exc}") from None
        return True

    return create


def _s3_client(options: dict[str, Any]) -> Any:
    """A boto3 S3 client for what ``pyarrow.fs.S3FileSystem(**options)`` reaches: the
    same endpoint, region, addressing, timeouts and credentials (explicit ones, none
    for ``anonymous``, else the SDK's default chain, as pyarrow's AWS SDK has it),
    and no retries of its own. One per process and options."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    key = json.dumps(options, sort_keys=True, default=str)
    # options -> client, in the process's "s3_clients" slot (sessionstore.process)
    clients: dict[str, Any] = this_process().get_or_make("s3_clients", dict)
    if key in clients:
        return clients[key]

    endpoint = options.get("endpoint_override") or None
    scheme = options.get("scheme") or "https"
    if endpoint and "://" not in endpoint:
        endpoint = f"{scheme}://{endpoint}"
    virtual = bool(options.get("force_virtual_addressing")) or not endpoint
    config: dict[str, Any] = {
        "retries": {"total_max_attempts": 1, "mode": "standard"},  # ours retry
        "s3": {"addressing_style": "virtual" if virtual else "path"},
    }
    if "request_checksum_calculation" in Config.OPTION_DEFAULTS:  # botocore >= 1.36
        # a plain PUT, as pyarrow's: S3-compatible stores that reject the newer
        # default checksum headers accept it
        config["request_checksum_calculation"] = "when_required"
    if options.get("anonymous"):
        config["signature_version"] = UNSIGNED
    if options.get("connect_timeout") is not None:
        config["connect_timeout"] = float(options["connect_timeout"])
    if options.get("request_timeout") is not None:
        config["read_timeout"] = float(options["request_timeout"])
    proxies = _proxies(options.get("proxy_options"))
    if proxies:
        config["proxies"] = proxies
    if options.get("role_arn"):
        session, keys = _assumed_role(options), {}
    else:
        session = boto3.session.Session()
        keys = {
            "aws_access_key_id": options.get("access_key") or None,
            "aws_secret_access_key": options.get("secret_key") or None,
            "aws_session_token": options.get("session_token") or None,
        }
    client = session.client(
        "s3",
        region_name=options.get("region") or None,
        endpoint_url=endpoint,
        use_ssl=scheme != "http",
        verify=options.get("tls_ca_file_path") or None,
        config=Config(**config),
        **keys,
    )
    return clients.setdefault(key, client)


def _assumed_role(options: dict[str, Any]) -> Any:
    """A boto3 session whose credentials are ``role_arn``'s, assumed through STS
    from the default credential chain (as pyarrow does: it refuses ``role_arn``
    with explicit keys), with ``session_name``, ``external_id`` and
    ``load_frequency`` (the assumed session's seconds), renewed before they
    expire."""
    import boto3
    import botocore.session
    from botocore.credentials import (
        AssumeRoleCredentialFetcher,
        CredentialProvider,
        DeferredRefreshableCredentials,
    )
    from botocore.exceptions import NoCredentialsError

    source = boto3.session.Session(region_name=options.get("region") or None)
    extra: dict[str, Any] = {
        "RoleSessionName": options.get("session_name") or f"sessionstore-{uuid.uuid4().hex[:12]}"
    }
    if options.get("external_id"):
        extra["ExternalId"] = options["external_id"]
    if options.get("load_frequency"):
        extra["DurationSeconds"] = int(options["load_frequency"])

    def fetch() -> dict[str, Any]:
        credentials = source.get_credentials()
        if credentials is None:
            raise NoCredentialsError()
        fetcher = AssumeRoleCredentialFetcher(
            client_creator=source.client,
            source_credentials=credentials,
            role_arn=options["role_arn"],
            extra_args=extra,
        )
        return fetcher.fetch_credentials()

    assumed = DeferredRefreshableCredentials(refresh_using=fetch, method="assume-role")

    class AssumedRole(CredentialProvider):
        METHOD = "assume-role"

        def load(self) -> Any:
            return assumed

    core = botocore.session.Session()
    core.get_component("credential_provider").insert_before("env", AssumedRole())
    return boto3.session.Session(botocore_session=core, region_name=options.get("region") or None)


def _proxies(proxy: Any) -> dict[str, str] | None:
    """pyarrow's ``proxy_options`` (a URI, or scheme/host/port/username/password) as
    botocore's ``proxies``."""
    if not proxy:
        return None
    if isinstance(proxy, str):
        url = proxy
    else:
        auth = ""
        if proxy.get("username"):
            auth = f"{quote(str(proxy['username']), safe='')}:{quote(str(proxy.get('password', '')), safe='')}@"
        url = f"{proxy.get('scheme', 'http')}://{auth}{proxy['host']}:{proxy['port']}"
    return {"http": url, "https": url}


# ---------------------------------------------------------------------------- GCS
def _gcs(options: dict[str, Any]) -> Create:
    import google.auth.exceptions as auth_errors  # the gcs extra
    from google.auth.transport.requests import AuthorizedSession

    endpoint = options.get("endpoint_override")
    scheme = options.get("scheme") or "https"
    base = f"{scheme}://{endpoint}" if endpoint else "https://storage.googleapis.com"
    if endpoint and "://" in endpoint:
        base = endpoint
    sessions: list[Any] = []  # built at the first request: credentials may need a lookup

    def create(path: str, data: bytes, match: str | None) -> bool:
        bucket, _, name = path.partition("/")
        boundary = uuid.uuid4().hex
        body = b"".join((
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
            json.dumps({"name": name}).encode(),
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
            data,
            f"\r\n--{boundary}--\r\n".encode(),
        ))  # fmt: skip
        try:
            if not sessions:
                sessions.append(AuthorizedSession(_gcs_credentials(options)))
            response = sessions[0].post(
                f"{base}/upload/storage/v1/b/{quote(bucket, safe='')}/o",
                params={"uploadType": "multipart", "ifGenerationMatch": match or "0"},
                data=body,
                headers={"Content-Type": f"multipart/related; boundary={boundary}"},
                timeout=_GCS_TIMEOUT_S,
            )
        except auth_errors.TransportError as exc:  # reaching the token endpoint
            raise ConnectionError(f"GCS credentials: connection failed: {exc}") from None
        except auth_errors.GoogleAuthError as exc:
            raise PermissionError(f"GCS credentials: {exc}") from None
        if response.status_code in (409, 412) or (match and response.status_code == 404):
            return False
        if response.status_code >= 300:
            raise OSError(
                f"GCS upload failed: HTTP {response.status_code} {response.reason}: "
                f"{' '.join(response.text.split())[:300]}"
            )
        return True

    return create


def _gcs_credentials(options: dict[str, Any]) -> Any:
    """The credentials ``pyarrow.fs.GcsFileSystem(**options)`` uses: none when
    ``anonymous``, the ``access_token`` (until ``credential_token_expiration``), an
    impersonated ``target_service_account``, else Google's application default
    credentials."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials

    if options.get("anonymous"):
        return AnonymousCredentials()
    if options.get("access_token"):
        from google.oauth2.credentials import Credentials

        expiry = options.get("credential_token_expiration")
        if expiry is not None and expiry.tzinfo is not None:  # google-auth wants naive UTC
            from datetime import UTC

            expiry = expiry.astimezone(UTC).replace(tzinfo=None)
        return Credentials(token=options["access_token"], expiry=expiry)
    source, _ = google.auth.default(scopes=[_GCS_SCOPE])
    target = options.get("target_service_account")
    if target:
        from google.auth import impersonated_credentials

        return impersonated_credentials.Credentials(
            source_credentials=source, target_principal=target, target_scopes=[_GCS_SCOPE]
        )
    return source
