"""StateBackend: where a streaming job keeps its sessionstore state."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sessionstore.checkpoint.partition.orphans import DEFAULT_ORPHAN_GRACE_S, check_orphan_grace
from sessionstore.checkpoint.storage.filesystem import redact
from sessionstore.checkpoint.storage.private_dir import user_root
from sessionstore.checkpoint.storage.retry import (
    MAX_ATTEMPTS_OPTION,
    MAX_SECONDS_OPTION,
    policy_from_options,
)
from sessionstore.engine.memory import check_memory_max_mb
from spark_integration.conf.spark_session import driver_conf

if TYPE_CHECKING:  # the provider and its stores load where state is served, not here
    from sessionstore.checkpoint.partition.provider import CommitObserver

__all__ = ["StateBackend", "CONF_PREFIX", "CONF_KEYS", "STORAGE_PREFIX"]

CONF_PREFIX = "spark.sessionstore."
#: Every key ``StateBackend.from_conf`` reads (besides ``storage.<option>``).
CONF_KEYS = (
    "checkpointUri", "localDir", "snapshotInterval", "retainVersions", "memory.maxMB",
    "retry.maxAttempts", "retry.maxSeconds",
    "gc.orphanGraceSeconds", "allowPickle",
)  # fmt: skip
STORAGE_PREFIX = CONF_PREFIX + "storage."


@dataclass(frozen=True)
class StateBackend:
    """Checkpoint location and settings, shipped to every task.

    ``checkpoint_uri``: object storage for changelogs and snapshots (``file://``,
    a path, ``s3://``, ``gs://``, ``hdfs://``). ``local_dir``: where executors keep
    their RocksDB databases (default: ``<tmp>/sessionstore-local-<uid>/<hash of the
    checkpoint URI>``). A local database records which checkpoint it belongs to, so
    queries that share a ``local_dir`` never read each other's state.
    ``memory_max_mb``: the RocksDB memory budget of each Python worker, in MiB: one
    block cache and one write-buffer manager shared by every partition database the
    worker holds (default 256; see docs/internals.md, "Memory", for the arithmetic
    per executor). ``commit_observer``: called in the executors at each step of every commit (see
    :data:`~sessionstore.checkpoint.partition.provider.CommitObserver`), for metrics, tracing
    or fault injection; it travels to them pickled with the backend, so give a
    picklable object with a stable ``repr`` (warm providers are kept per setting).
    ``retry_max_attempts``, ``retry_max_seconds``: the retry policy of object-store
    requests (default 10 attempts within 120 s; sessionstore/checkpoint/storage/retry.py),
    applied in every process that opens the checkpoint: they travel in
    ``storage_options`` (as ``retry_max_attempts`` and ``retry_max_seconds``, which
    never reach ``pyarrow.fs``).
    ``orphan_grace_s``: how long a content file nothing references stays before the
    orphan sweep deletes it (default 600 s; it must exceed the longest snapshot
    upload: docs/durability.md, "Garbage collection").
    ``allow_pickle``: read (and keep writing) processor state whose checkpoint
    records the pickle serde. No release writes it, and unpickling runs whatever
    code the writer of the checkpoint stored, so without it such a checkpoint is
    refused (docs/security.md); set it only if you trust every writer of the bucket.
    """

    checkpoint_uri: str
    local_dir: str | None = None
    snapshot_interval: int = 10
    retain_versions: int = 100
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)
    commit_observer: CommitObserver | None = None
    memory_max_mb: int | None = None
    retry_max_attempts: int | None = None
    retry_max_seconds: float | None = None
    orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S
    allow_pickle: bool = False

    def __post_init__(self) -> None:
        if type(self.allow_pickle) is not bool:
            raise ValueError(f"allow_pickle must be True or False, got {self.allow_pickle!r}")
        if not isinstance(self.checkpoint_uri, str) or not self.checkpoint_uri:
            raise ValueError(
                f"checkpoint_uri must be a non-empty string, got {self.checkpoint_uri!r}"
            )
        for name in ("snapshot_interval", "retain_versions"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        # a process that only unpickles a backend (a due source's reader, a planner)
        # never runs this, and never imports the provider for it
        from sessionstore.checkpoint.partition.provider import MIN_RETAIN_VERSIONS

        if self.retain_versions < MIN_RETAIN_VERSIONS:  # refused on the driver, not in tasks
            raise ValueError(
                f"retain_versions must be at least {MIN_RETAIN_VERSIONS}, "
                f"got {self.retain_versions!r}"
            )
        check_memory_max_mb(self.memory_max_mb)
        self._set_retry()
        try:
            check_orphan_grace(self.orphan_grace_s)
        except ValueError as exc:
            raise ValueError(f"{exc} (conf key {CONF_PREFIX}gc.orphanGraceSeconds)") from None

    def _set_retry(self) -> None:
        """Check the retry settings here, on the driver, rather than in the tasks
        (the storage layer's :func:`~sessionstore.checkpoint.storage.retry.policy_from_options`
        reads them, as every process that opens the checkpoint will), keep them as
        numbers, and add them to ``storage_options``, in which they travel."""
        given = {
            MAX_ATTEMPTS_OPTION: self.retry_max_attempts,
            MAX_SECONDS_OPTION: self.retry_max_seconds,
        }
        given = {k: v for k, v in given.items() if v is not None}
        if not given:
            return
        try:
            policy = policy_from_options(self.checkpoint_uri, dict(given))
        except ValueError as exc:
            raise ValueError(
                f"{exc}: retry_max_attempts / retry_max_seconds (conf keys "
                f"{CONF_PREFIX}retry.maxAttempts / retry.maxSeconds)"
            ) from None
        numbers = {
            MAX_ATTEMPTS_OPTION: policy.max_attempts,
            MAX_SECONDS_OPTION: policy.max_seconds,
        }
        retry = {k: numbers[k] for k in given}
        object.__setattr__(self, "retry_max_attempts", retry.get(MAX_ATTEMPTS_OPTION))
        object.__setattr__(self, "retry_max_seconds", retry.get(MAX_SECONDS_OPTION))
        object.__setattr__(self, "storage_options", {**self.storage_options, **retry})

    def __repr__(self) -> str:
        return (
            f"StateBackend({self.checkpoint_uri!r}, local_dir={self.local_dir!r}, "
            f"snapshot_interval={self.snapshot_interval}, retain_versions={self.retain_versions}, "
            f"memory_max_mb={self.memory_max_mb}, orphan_grace_s={self.orphan_grace_s}, "
            f"allow_pickle={self.allow_pickle}, "
            f"storage_options={redact(self.storage_options)})"
        )

    @property
    def resolved_local_dir(self) -> str:
        """``local_dir``, or a directory of this checkpoint's own under the system's
        temporary directory (queries never share a default one)."""
        if self.local_dir:
            return self.local_dir
        digest = hashlib.sha256(self.checkpoint_uri.encode()).hexdigest()[:16]
        # one folder per OS user: it is created 0700 and checked from there down,
        # and another user's is refused (sessionstore.checkpoint.storage.private_dir)
        return os.path.join(user_root(), digest)

    @classmethod
    def from_conf(cls, spark: Any) -> StateBackend:
        """Build from ``spark.sessionstore.*`` keys of a SparkSession's conf:

        ``checkpointUri`` (required), ``localDir``, ``snapshotInterval``,
        ``retainVersions``, ``memory.maxMB``, ``retry.maxAttempts``,
        ``retry.maxSeconds``, ``gc.orphanGraceSeconds``, ``allowPickle`` (``true``
        or ``false``) and ``storage.<option>``
        (passed to ``pyarrow.fs``, for example
        ``spark.sessionstore.storage.endpoint_override``).
        """
        conf = spark.conf
        uri = conf.get(CONF_PREFIX + "checkpointUri", None)
        if not uri:
            raise ValueError(
                f"set {CONF_PREFIX}checkpointUri (for example s3://bucket/path) or pass a "
                "StateBackend explicitly"
            )
        # the SparkContext's conf (spark-submit --conf, the builder), then the
        # session's (spark.conf.set), which is where checkpointUri is read too
        settings = driver_conf(spark)
        settings.update(conf.getAll)
        options = {
            key[len(STORAGE_PREFIX) :]: value
            for key, value in settings.items()
            if key.startswith(STORAGE_PREFIX)
        }
        memory = conf.get(CONF_PREFIX + "memory.maxMB", None)
        attempts = settings.get(CONF_PREFIX + "retry.maxAttempts")
        seconds = settings.get(CONF_PREFIX + "retry.maxSeconds")
        grace = settings.get(CONF_PREFIX + "gc.orphanGraceSeconds")
        allow = str(settings.get(CONF_PREFIX + "allowPickle", "false")).strip().lower()
        if allow not in ("true", "false"):
            raise ValueError(f"{CONF_PREFIX}allowPickle must be true or false, got {allow!r}")
        return cls(
            checkpoint_uri=uri,
            local_dir=conf.get(CONF_PREFIX + "localDir", None),
            snapshot_interval=int(conf.get(CONF_PREFIX + "snapshotInterval", "10")),
            retain_versions=int(conf.get(CONF_PREFIX + "retainVersions", "100")),
            storage_options=options,
            memory_max_mb=None if memory is None else _positive_int("memory.maxMB", memory),
            # as given: the backend checks and converts them (the storage layer's rule)
            retry_max_attempts=attempts,
            retry_max_seconds=seconds,
            orphan_grace_s=DEFAULT_ORPHAN_GRACE_S if grace is None else _seconds(grace),
            allow_pickle=allow == "true",
        )


def _seconds(value: str) -> float:
    """The value of ``gc.orphanGraceSeconds`` as a number (its range is the
    backend's check), or a ValueError naming the key and value."""
    try:
        return float(value)
    except ValueError:
        raise ValueError(
            f"{CONF_PREFIX}gc.orphanGraceSeconds must be a number of seconds >= 0, got {value!r}"
        ) from None


def _positive_int(key: str, value: str) -> int:
    """``value`` of conf key ``key`` as a positive int, or a ValueError naming both."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{CONF_PREFIX}{key} must be a positive integer (MiB), got {value!r}")
    return number
