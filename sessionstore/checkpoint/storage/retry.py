"""The retry policy of object-store requests: which errors are transient, how long
to wait between attempts, and when to give up.

Every request of a :class:`~sessionstore.checkpoint.storage.filesystem.Storage` on an object
store (S3, GCS, HDFS, any ``pyarrow.fs`` target but a local disk) runs through
:meth:`RetryPolicy.call`: a transient error (throttling such as S3's ``503 SlowDown``,
a 5xx, a timeout, a reset connection) is tried again after an exponential backoff
with full jitter (a random wait between 0 and ``min(max_delay, base_delay * 2**n)``,
so that the tasks a throttling store slowed down do not come back in step), until
``max_attempts`` attempts were made or ``max_seconds`` have passed since the first.
A permanent error (a missing object, a refused credential, a missing bucket, a bad
request) fails at once: retrying it only delays the message.

pyarrow's clients retry on their own as well (S3: 3 attempts; GCS: for 15 minutes).
:func:`~sessionstore.checkpoint.storage.filesystem.open_filesystem` turns those down to one
attempt (GCS: one second) unless the storage options set them (``retry_strategy``,
``retry_time_limit``), so that one
failing request is never ``attempts x attempts`` requests and the total time stays
bounded by ``max_seconds`` (plus the one attempt running when it passes: an
attempt's own length is bounded by the client's timeouts, ``connect_timeout`` and
``request_timeout`` on S3).

The policy travels with the storage options, as :data:`MAX_ATTEMPTS_OPTION` and
:data:`MAX_SECONDS_OPTION` (set from ``spark.sessionstore.retry.maxAttempts`` and
``spark.sessionstore.retry.maxSeconds``, ``StateBackend(retry_max_attempts=,
retry_max_seconds=)`` or the CLI's ``--retry-max-attempts`` and
``--retry-max-seconds``), so every process that opens the checkpoint (driver,
executors, state servers, the CLI) applies the same one.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "RetryPolicy",
    "RetryCounter",
    "MAX_ATTEMPTS_OPTION",
    "MAX_SECONDS_OPTION",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_SECONDS",
    "is_transient",
    "policy_from_options",
]

T = TypeVar("T")

#: Storage options of the policy (consumed by ``open_filesystem``, never passed to
#: ``pyarrow.fs``).
MAX_ATTEMPTS_OPTION = "retry_max_attempts"
MAX_SECONDS_OPTION = "retry_max_seconds"
#: With 20% of requests throttled, ten attempts all fail once in ten million
#: requests; two minutes outlast a store's usual throttling episode.
DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_MAX_SECONDS = 120.0

# Words of errors that a later attempt may not meet (lower case, as pyarrow's S3,
# GCS and HDFS clients word them).
_TRANSIENT = (
    "slowdown", "slow down", "slow_down", "throttl", "too many requests", "reduce your request",
    "service unavailable", "internal error",
    "internalerror", "internal_failure", "service_unavailable", "requesttimeout",
    "request_timeout", "timeout", "timed out", "deadline", "unavailable", "temporar",
    "try again", "connection", "couldn't connect", "could not connect", "reset by peer",
    "broken pipe", "network", "curlcode", "unexpected eof", "transfer closed", "resource_exhausted",
)  # fmt: skip
_STATUS = re.compile(r"\b(429|500|502|503|504)\b")
# Words of errors no retry cures; they win over the transient ones ("connection
# refused while fetching credentials" is a missing credential, not a blip).
_PERMANENT = (
    "not found", "does not exist", "no such", "nosuchkey", "nosuchbucket", "access denied",
    "access_denied", "accessdenied", "forbidden", "unauthorized", "unauthenticated",
    "permission", "credential", "invalid", "signature", "precondition", "not supported",
)  # fmt: skip


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc``, an object-store request's error, may pass if tried again."""
    if not isinstance(exc, OSError) or isinstance(
        exc, FileNotFoundError | FileExistsError | PermissionError | IsADirectoryError
        | NotADirectoryError,
    ):  # fmt: skip
        return False
    text = str(exc).lower()
    return (any(w in text for w in _TRANSIENT) or _STATUS.search(text) is not None) and not any(
        w in text for w in _PERMANENT
    )


class RetryCounter:
    """Attempts that failed and were retried, shared by a storage and its children
    (the state metrics' ``storage_retries``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.retries = 0

    def add(self) -> None:
        with self._lock:
            self.retries += 1


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``max_attempts`` attempts of a request, none started later than
    ``max_seconds`` after the first; waits between them grow from ``base_delay``
    by doubling up to ``max_delay``, each drawn uniformly from zero to that bound."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_seconds: float = DEFAULT_MAX_SECONDS
    base_delay: float = 0.05
    max_delay: float = 5.0
    #: the wait before attempt n+1, from the bound (tests pass a fixed one)
    jitter: Callable[[float], float] = field(
        default=lambda bound: random.uniform(0.0, bound), repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if type(self.max_attempts) is not int or self.max_attempts < 1:
            raise ValueError(
                f"retry max attempts must be a positive int, got {self.max_attempts!r}"
            )
        if (
            isinstance(self.max_seconds, bool)
            or not isinstance(self.max_seconds, int | float)
            or not self.max_seconds >= 0
        ):
            raise ValueError(f"retry max seconds must be a number >= 0, got {self.max_seconds!r}")

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        return self.jitter(min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))

    def call(
        self,
        fn: Callable[[], T],
        counter: RetryCounter | None = None,
        transient: Callable[[BaseException], bool] = is_transient,
    ) -> T:
        """``fn()``, tried again on a transient error while attempts and time are
        left; the last error is raised with what was tried added to its message
        (its type kept)."""
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except OSError as exc:
                if not transient(exc):
                    raise
                wait = self.delay(attempt)
                elapsed = time.monotonic() - start
                if attempt >= self.max_attempts or elapsed + wait > self.max_seconds:
                    raise _given_up(exc, attempt, elapsed, self) from None
            if counter is not None:
                counter.add()
            time.sleep(wait)


def _given_up(exc: OSError, attempts: int, elapsed: float, policy: RetryPolicy) -> OSError:
    what = (
        f"{exc} (tried {attempts} time{'s' if attempts > 1 else ''} in {elapsed:.1f} s; "
        f"retry limits: {policy.max_attempts} attempts, {policy.max_seconds:g} s, set by "
        "spark.sessionstore.retry.maxAttempts and .maxSeconds or --retry-max-attempts "
        "and --retry-max-seconds)"
    )
    try:
        return type(exc)(what)
    except Exception:  # an exception type with another constructor
        return OSError(what)


def policy_from_options(uri: str, options: dict[str, Any]) -> RetryPolicy:
    """The policy the storage options give (popping its entries from ``options``);
    ``ValueError`` names a bad value and the URI."""
    attempts = options.pop(MAX_ATTEMPTS_OPTION, None)
    seconds = options.pop(MAX_SECONDS_OPTION, None)
    try:
        return RetryPolicy(
            DEFAULT_MAX_ATTEMPTS if attempts is None else _number(attempts, int),
            DEFAULT_MAX_SECONDS if seconds is None else _number(seconds, float),
        )
    except ValueError as exc:
        raise ValueError(f"{exc} (for {uri})") from None


def _number(value: Any, kind: type) -> Any:
    if isinstance(value, str):
        text = value.strip()
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"expected {kind.__name__}, got {value!r}") from None
    return value
