"""The first request a process makes to a checkpoint's object store: answered within
a bounded time, and a failure explained in one line.

Without credentials or a network, an object store's client can wait a long time
before it says anything: Google's client retried for 15 minutes by default, and
one request to an endpoint that accepts a connection and never answers waits for
curl's two minutes on GCS (pyarrow offers no timeout there). So the CLI, the
``sessionstore`` data source and a query's planning first :func:`reach` the store:
one cheap request (the root's file info) under the retry policy of
:mod:`sessionstore.checkpoint.storage.retry`, its time capped at
:data:`FIRST_CONTACT_SECONDS` (30 s) or at ``retry_max_seconds`` when the storage
options set it (``spark.sessionstore.retry.maxSeconds``, ``--retry-max-seconds``,
``StateBackend(retry_max_seconds=)``), in a helper thread that the caller stops
waiting for at that bound whatever pyarrow does.

The per-attempt bounds are pyarrow's own: on S3 the AWS client's connect timeout
(1 s) and its stall timeout (``request_timeout``, 3 s without a byte), with one
attempt per call (:func:`~sessionstore.checkpoint.storage.filesystem.open_filesystem`
sets ``retry_strategy``); on GCS ``retry_time_limit`` (1 s there); the retries are
ours. A failure becomes a :class:`StoreUnreachableError` whose one line names the
URI, what happened, the credentials and endpoint that were tried, and how to fix
it. A store reached once is not probed again by the same process.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import urlparse

from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem, secret_values
from sessionstore.checkpoint.storage.retry import (
    MAX_SECONDS_OPTION,
    RetryCounter,
    RetryPolicy,
    is_transient,
    policy_from_options,
)
from sessionstore.errors import SessionStoreError
from sessionstore.process import this_process

__all__ = ["FIRST_CONTACT_SECONDS", "StoreUnreachableError", "first_contact_seconds", "reach"]

#: How long a first contact may take unless ``retry_max_seconds`` says otherwise.
FIRST_CONTACT_SECONDS = 30.0
#: How long the caller waits before ``waiting`` (a spinner) is shown.
QUIET_SECONDS = 1.0
#: The longest cause a message quotes from the client's error.
_CAUSE_CHARS = 240

#: The once-per-process event of a store reached, by location and options
#: (:mod:`sessionstore.process`).
REACHED = "store_reached"


class StoreUnreachableError(SessionStoreError, OSError):
    """The first request to a checkpoint's store failed or got no answer in time.
    ``timed_out``: no answer at all (the request may still be running)."""

    def __init__(self, message: str, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def first_contact_seconds(storage_options: dict[str, Any] | None) -> float:
    """The bound on a first contact: ``retry_max_seconds`` when the options set it
    (at least 1 s), else :data:`FIRST_CONTACT_SECONDS`."""
    options = dict(storage_options or {})
    if options.get(MAX_SECONDS_OPTION) is None:
        return FIRST_CONTACT_SECONDS
    return max(1.0, policy_from_options("", options).max_seconds)


def _is_local(uri: str) -> bool:
    scheme = urlparse(str(uri)).scheme.lower()
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def reach(
    uri: str,
    storage_options: dict[str, Any] | None = None,
    waiting: Callable[[], AbstractContextManager[Any]] | None = None,
) -> Storage:
    """The :class:`~sessionstore.checkpoint.storage.filesystem.Storage` at ``uri``, after
    one request to it answered within :func:`first_contact_seconds` (a local path
    is not probed). ``waiting`` (a spinner) is entered while the caller waits past
    :data:`QUIET_SECONDS`. A failure or no answer in time raises
    :class:`StoreUnreachableError`; bad options raise as ``open_filesystem`` does."""
    options = dict(storage_options or {})
    if _is_local(uri):
        return open_filesystem(uri, options)
    key = repr((str(uri), tuple(sorted((k, str(v)) for k, v in options.items()))))
    if this_process().marked(REACHED, key):
        return open_filesystem(uri, options)
    seconds = first_contact_seconds(options)
    storage = open_filesystem(uri, options)  # constructing a client sends nothing
    base = storage.retry
    policy = RetryPolicy(base.max_attempts, min(base.max_seconds, seconds))
    counter = RetryCounter()
    outcome: dict[str, Any] = {}

    def transient(exc: BaseException) -> bool:
        outcome["last"] = exc  # what a timeout reports, if the next attempt hangs
        return is_transient(exc)

    def probe() -> None:
        try:
            policy.call(lambda: storage.fs.get_file_info(storage.root), counter, transient)
            outcome["ok"] = True
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc

    started = time.monotonic()
    worker = threading.Thread(target=probe, name="sessionstore-first-contact", daemon=True)
    worker.start()
    worker.join(min(QUIET_SECONDS, seconds))
    if worker.is_alive():
        left = max(0.0, seconds - (time.monotonic() - started))
        if waiting is None:
            worker.join(left)
        else:
            with waiting():
                worker.join(left)
    elapsed = time.monotonic() - started
    if "ok" in outcome:
        this_process().mark(REACHED, key)
        return storage
    error = outcome.get("error")
    if error is not None and (
        not isinstance(error, OSError) or isinstance(error, SessionStoreError)
    ):
        raise error
    if error is not None:
        what = f"{_cause(error, options)} ({_attempts(counter.retries + 1)} in {elapsed:.1f} s)"
    elif "last" in outcome:
        what = (
            f"no answer within {seconds:g} s, after {_attempts(counter.retries)} that failed: "
            f"{_cause(outcome['last'], options)}"
        )
    else:
        what = f"no answer within {seconds:g} s"
    raise StoreUnreachableError(_explained(uri, options, what, seconds), error is None) from error


def _attempts(n: int) -> str:
    return f"{n} attempt{'s' if n != 1 else ''}"


def _cause(error: BaseException, options: dict[str, Any]) -> str:
    """The client's error, short: the original of a retried one, on one line,
    secrets masked, GCS's status wrapping dropped."""
    original = error.__context__ if error.__suppress_context__ and error.__context__ else error
    text = " ".join(str(original).split())
    for secret in secret_values(options):
        text = text.replace(secret, "***")
    token = "OAuth2 access token" in text  # GCS: the credential step failed
    for marker in ("with a last message of ", "The underlying error message was: "):
        if marker in text:
            text = text.split(marker, 1)[1]
    text = text.split(" error_info=", 1)[0].removeprefix("google::cloud::Status(")
    text = text.removeprefix("PerformWork() - ")
    if token:
        text = f"could not get an OAuth2 access token: {text}"
    if len(text) > _CAUSE_CHARS:
        text = text[: _CAUSE_CHARS - 3].rstrip() + "..."
    return text


def _explained(uri: str, options: dict[str, Any], what: str, seconds: float) -> str:
    """One line: the URI, what happened, what was tried, how to fix it."""
    scheme = urlparse(str(uri)).scheme.lower()
    if scheme in ("gs", "gcs"):
        credentials, endpoint, fix = _gcs(options)
    elif scheme in ("s3", "s3a"):
        credentials, endpoint, fix = _s3(options)
    else:
        parsed = urlparse(str(uri))
        credentials = "the Hadoop client's configuration"
        endpoint = f"{parsed.hostname or 'default'}:{parsed.port or 8020}"
        fix = "check that the namenode is up and reachable from here"
    longer = (
        f"or allow more than {seconds:g} s with --retry-max-seconds (CLI), "
        "spark.sessionstore.retry.maxSeconds or StateBackend(retry_max_seconds=)"
    )
    return (
        f"cannot reach {uri}: {what}; tried {credentials} at {endpoint}; to fix: {fix}, "
        f"check that this machine reaches {endpoint}, {longer}"
    )


def _on(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _gcs(options: dict[str, Any]) -> tuple[str, str, str]:
    """GCS: the credentials pyarrow's client uses, its endpoint, and the fix."""
    scheme = options.get("scheme") or "https"
    override = options.get("endpoint_override")
    endpoint = f"{scheme}://{override}" if override else "https://storage.googleapis.com"
    if _on(options.get("anonymous", False)):
        return "anonymous access", endpoint, "drop anonymous=true if the bucket is not public"
    if options.get("access_token"):
        return ("the access_token storage option", endpoint,
                "pass a valid access_token (and credential_token_expiration)")  # fmt: skip
    steps = []
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if path:
        state = "" if os.path.exists(path) else ", a file that does not exist"
        steps.append(f"GOOGLE_APPLICATION_CREDENTIALS={path}{state}")
    else:
        steps.append("GOOGLE_APPLICATION_CREDENTIALS (not set)")
    config = os.environ.get("CLOUDSDK_CONFIG") or (
        os.path.join(os.environ.get("APPDATA", ""), "gcloud")
        if os.name == "nt"
        else os.path.expanduser("~/.config/gcloud")
    )
    adc = os.path.join(config, "application_default_credentials.json")
    steps.append(f"gcloud's {adc} ({'found' if os.path.exists(adc) else 'not found'})")
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    steps.append(f"the GCE metadata server {host}")
    credentials = "Google application default credentials: " + ", then ".join(steps)
    fix = (
        "set GOOGLE_APPLICATION_CREDENTIALS to a service account key file or run "
        "'gcloud auth application-default login' (a public bucket: storage option "
        "anonymous=true)"
    )
    return credentials, endpoint, fix


def _s3(options: dict[str, Any]) -> tuple[str, str, str]:
    """S3: the credentials the AWS client uses, its endpoint, and the fix."""
    override = options.get("endpoint_override")
    if override:
        scheme = options.get("scheme") or "https"
        endpoint = override if "://" in override else f"{scheme}://{override}"
    else:
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = (
            options.get("region") or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        )  # fmt: skip
        endpoint = endpoint or f"https://s3.{region}.amazonaws.com"
    fix = (
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE (or the storage "
        "options access_key and secret_key; a public bucket: anonymous=true)"
    )
    if _on(options.get("anonymous", False)):
        return "anonymous access", endpoint, fix
    if options.get("access_key"):
        return "the access_key/secret_key storage options", endpoint, fix
    steps = []
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        steps.append("AWS_ACCESS_KEY_ID (set)")
    else:
        steps.append("AWS_ACCESS_KEY_ID (not set)")
    profile = os.environ.get("AWS_PROFILE", "default")
    shared = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.expanduser(
        "~/.aws/credentials"
    )
    steps.append(
        f"profile {profile!r} in {shared} ({'found' if os.path.exists(shared) else 'not found'})"
    )
    steps.append("the EC2/ECS instance metadata service")
    return "the AWS default credential chain: " + ", then ".join(steps), endpoint, fix
