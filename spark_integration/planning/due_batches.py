"""Due batches: a micro-batch for what time made due, when no row arrives.

sessionstore's operators run in ``mapInArrow``, so Spark runs them only in the
micro-batches it starts, and it starts one only when a source has new data or a
stateful operator of its own asks for one (``shouldRunAnotherBatch``, which a
``mapInArrow`` cannot answer). What a batch made due (sessions and windows that
the shared event time closed: they close at the *next* batch's start) would then
wait for the next row, maybe forever.

So each event-time aggregator (``sessionize``, ``window_aggregate``) unions into
its input, before its shuffle, a small streaming source of its own, the **due
source** (PySpark's Python data source API): it never yields a row, and its offset
advances only when something is due. Spark asks every source for its latest
offset at each trigger; an advanced offset is new data to Spark, so it runs a
micro-batch, whose tasks start from the shared event time the last batch left and
emit what it closes.

What is due is read from the checkpoint, never from driver memory, so it works the
same under Spark Connect (where the driver's Python is not ours: Spark runs the
source's reader in a Python worker of its own) and after a restart:

* the newest committed batch ``b`` is the newest version of partition 0 minus one
  (every partition commits every batch, with rows or without): one existence
  check per trigger once known, a listing the first time;
* something is due after ``b`` when the shared event time after ``b`` (the largest
  of the partitions' durable records, :func:`durable_event_time`) is later than
  after ``b - 1``: batch ``b + 1`` then starts from a later time than batch ``b``
  did, so it may close sessions and windows. That is the rule of Spark's own
  operators, which run one batch without data whenever the watermark moved (the
  watermark is that time minus the delay); the records are read once per batch.

The offset is ``{"due_after": b}``, the newest batch after which something was
due. It is a function of the checkpoint, so a restarted reader answers as the
first one did; a batch that only advances it has no rows, so its replay (from
Spark's offset log) loads the same version and emits the same rows; a due-only
batch moves no event time, so it makes nothing due and no batch follows it: no
busy loop. Needs the Python source's admission API (Spark 4.2+, where
``latestOffset`` is given the start offset); on older Spark the operators run
without the due source, as before.

``availableNow``: the due source is a ``SupportsTriggerAvailableNow`` source, so
Spark asks it for its offset before every batch of the run (a source without it is
asked once, before the first), and the run ends when no source moved: after the
due-only batch that follows its last data batch, as Spark's own operators end it
with their batch without data. ``prepareForTriggerAvailableNow`` pins nothing: what
becomes due comes from the run's own batches, never from outside, and stops
after one due-only batch. ``Trigger.Once`` runs one batch per run whatever the
sources say, so what that batch made due is emitted by the next run.

Spark refuses to restart a query whose sources differ from its checkpoint's, so
whether an operator has a due source is decided when its checkpoint is new and
kept for its life (the ``due_batches`` marker next to ``_metadata``, carried by
``sessionstore repartition``): a checkpoint started before due batches, or with
them turned off, keeps running without them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import warnings
from dataclasses import dataclass, field
from typing import Any

from sessionstore.checkpoint.records.event_time import MissingEventTimeError, durable_event_time
from sessionstore.checkpoint.records.layout import (
    DUE_BATCHES_MARKER,
    changelog_name,
    newest_committed,
)
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from spark_integration.conf.backend import CONF_PREFIX, StateBackend
from spark_integration.conf.spark_session import is_connect

__all__ = [
    "DUE_BATCHES_CONF",
    "due_batches_allowed",
    "OFFSET_FIELD",
    "DueSourceUnrunnable",
    "DueTimes",
    "with_due_batches",
    "due_source_name",
]

log = logging.getLogger(__name__)

#: Spark conf: ``false`` leaves the due source out (what time made due then waits
#: for the next row). Spark's ``spark.sql.streaming.noDataMicroBatches.enabled``
#: set to ``false`` does the same.
DUE_BATCHES_CONF = CONF_PREFIX + "dueBatches.enabled"
NO_DATA_CONF = "spark.sql.streaming.noDataMicroBatches.enabled"
#: The due source's offset field: the newest batch after which something was due.
OFFSET_FIELD = "due_after"


@dataclass
class DueTimes:
    """What the due source of one operator reads: its checkpoint, name and
    partition count (picklable: it ships to the Python worker that runs the
    source), and what it remembers between triggers."""

    backend: StateBackend
    name: str
    num_partitions: int
    _storage: Storage | None = field(default=None, repr=False)
    _newest: int | None = None
    _times: dict[int, int | None] = field(default_factory=dict, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"backend": self.backend, "name": self.name, "num_partitions": self.num_partitions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def storage(self) -> Storage:
        """The operator's directory in the checkpoint."""
        if self._storage is None:
            b = self.backend
            self._storage = open_filesystem(b.checkpoint_uri, b.storage_options).child(self.name)
        return self._storage

    def newest_batch(self) -> int:
        """The newest batch partition 0 committed (-1 before any)."""
        storage = self.storage()
        if self._newest is None:
            self._newest = newest_committed(storage, 1) - 1
        while storage.exists(f"0/{changelog_name(self._newest + 2)}"):
            self._newest += 1
        return self._newest

    def event_time_after(self, batch: int) -> int | None:
        """The shared event time after ``batch`` (its durable records, read once)."""
        if batch not in self._times:
            self._times[batch] = durable_event_time(self.storage(), batch, self.num_partitions)
            while len(self._times) > 4:
                del self._times[min(self._times)]
        return self._times[batch]

    def due_after(self, batch: int) -> bool:
        """Whether batch ``batch + 1`` starts from a later event time than ``batch``
        did, so that it may close sessions and windows (see the module doc)."""
        if batch < 0:
            return False
        after = self.event_time_after(batch)
        before = self.event_time_after(batch - 1)
        return after is not None and (before is None or after > before)

    def latest(self, start: dict[str, Any] | None) -> dict[str, Any]:
        """The due source's latest offset, given the ``start`` of the next batch:
        ``start`` itself unless a batch after it made something due."""
        known = -1 if not start else int(start.get(OFFSET_FIELD, -1))
        try:
            newest = self.newest_batch()
            if newest > known and self.due_after(newest):
                return {OFFSET_FIELD: newest}
        except (MissingEventTimeError, FileNotFoundError) as exc:
            # a batch not yet committed everywhere: asked again at the next trigger
            log.debug("sessionstore: due source of %r: %s", self.name, exc)
        return {OFFSET_FIELD: known}


def due_source_name(times: DueTimes) -> str:
    """The short name the due source of ``times``'s operator is registered under:
    one per checkpoint location and operator."""
    b = times.backend
    digest = hashlib.sha256(repr((b.checkpoint_uri, times.name)).encode()).hexdigest()[:16]
    return f"sessionstore_due_{digest}"


def _source_class(times: DueTimes, schema_json: str) -> type:
    """A Python data source class for ``times``' operator (a class of its own, so
    that its settings, storage options included, travel pickled with it and never
    as source options, which Spark shows in plans)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    try:
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow as AvailableNow
    except ImportError:  # a PySpark without it asks the source once per availableNow run
        AvailableNow = object  # type: ignore[assignment,misc]

    class DueReader(DataSourceStreamReader, AvailableNow):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            self.times = times

        def initialOffset(self) -> dict[str, Any]:
            return {OFFSET_FIELD: -1}

        def prepareForTriggerAvailableNow(self) -> None:
            # nothing to pin (module doc, availableNow): implementing it is what
            # makes Spark ask latestOffset before every batch of the run
            pass

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
            return self.times.latest(start)

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
            return []

        def read(self, partition: InputPartition) -> Any:
            return iter(())

        def commit(self, end: dict[str, Any]) -> None:
            pass

    class DueSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return due_source_name(times)

        def schema(self) -> Any:
            from pyspark.sql.types import StructType

            return StructType.fromJson(json.loads(schema_json))

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return DueReader()

    return DueSource


class DueSourceUnrunnable(RuntimeError):
    """A checkpoint whose operator reads a due source was restarted where the driver
    cannot start the Python that Spark runs Python data sources with."""


def driver_python_problem(spark: Any) -> str | None:
    """Why the driver cannot start the Python that Spark runs a Python data source's
    planning with, or ``None`` when it can (or cannot be known: under Connect the
    server decides).

    Spark runs that planning on the driver with ``PYSPARK_PYTHON``, the executors'
    Python. The usual way to ship a virtualenv (``spark-submit --archives
    env.tar.gz#environment`` with ``PYSPARK_PYTHON=./environment/bin/python``) names
    a path that exists in each executor's working directory but, in client deploy
    mode, not in the driver's, so every Python data source fails there."""
    if is_connect(spark):
        return None
    python = str(spark.sparkContext.pythonExec)
    if os.sep in python:
        found = os.path.isfile(python) and os.access(python, os.X_OK)
    else:
        found = shutil.which(python) is not None
    if found:
        return None
    return (
        f"the executors' Python (PYSPARK_PYTHON / spark.pyspark.python = {python!r}) "
        f"does not exist on the driver (working directory {os.getcwd()!r}), and Spark "
        "runs a Python data source's planning on the driver with it"
    )


def due_batches_allowed(spark: Any) -> bool:
    """Whether the confs allow a due source: neither :data:`DUE_BATCHES_CONF` nor
    Spark's :data:`NO_DATA_CONF` turned off."""
    return all(
        str(spark.conf.get(key, "true")).strip().lower() not in ("false", "0", "no")
        for key in (DUE_BATCHES_CONF, NO_DATA_CONF)
    )


def _enabled(spark: Any, name: str, allowed: bool) -> bool:
    """Whether a due source may be added: Spark 4.2+, the confs ``allowed`` it, and a
    driver that can run it (else a warning says what the query loses and why)."""
    major, minor = (int(p) for p in spark.version.split(".")[:2])
    if (major, minor) < (4, 2) or not allowed:
        return False
    problem = driver_python_problem(spark)
    if problem is not None:
        warnings.warn(
            f"sessionstore: operator {name!r} runs without due batches, so on a quiet "
            f"stream its results wait for the next row: {problem}. Set "
            "spark.pyspark.python to the driver's Python and "
            "spark.sql.execution.pyspark.python to the executors' (or run in cluster "
            "deploy mode; docs/event-time.md, Quiet streams).",
            stacklevel=4,
        )
        return False
    return True


def _decided(spark: Any, times: DueTimes, allowed: bool | None) -> bool:
    """Whether the operator's query reads a due source, decided once per checkpoint:
    Spark refuses to restart a query whose sources differ from those its checkpoint
    recorded. A checkpoint with the marker (:data:`DUE_BATCHES_MARKER`) keeps it; one
    with committed versions and no marker (written without due batches, or by a
    release before them) keeps running without; a new one follows the confs, and
    gets the marker when it has the source."""
    storage = times.storage()
    if storage.exists(DUE_BATCHES_MARKER):
        problem = driver_python_problem(spark)
        if problem is not None:
            raise DueSourceUnrunnable(
                f"sessionstore: operator {times.name!r}: its checkpoint reads a due "
                f"source, which Spark cannot start here: {problem}. Set "
                "spark.pyspark.python to the driver's Python and "
                "spark.sql.execution.pyspark.python to the executors' (or run in "
                "cluster deploy mode; docs/event-time.md, Quiet streams)."
            )
        return True
    if newest_committed(storage, 1) > 0:
        log.info(
            "sessionstore: operator %r: its checkpoint was started without due batches, "
            "so it keeps running without them (a quiet stream's results wait for the "
            "next row); a new checkpoint gets them", times.name,
        )  # fmt: skip
        return False
    if allowed is None:
        allowed = due_batches_allowed(spark)
    if not _enabled(spark, times.name, allowed):
        return False
    storage.write_atomic(DUE_BATCHES_MARKER, b"1")
    return True


def with_due_batches(
    df: Any,
    backend: StateBackend,
    name: str,
    num_partitions: int,
    kind: type = DueTimes,
    *,
    allowed: bool | None = None,
) -> Any:
    """``df`` (an operator's streaming input, before its shuffle) with the operator's
    due source unioned in (see the module doc); ``df`` itself for a batch input, on
    Spark before 4.2, with due batches turned off (:data:`DUE_BATCHES_CONF`) when
    the checkpoint is new, or for a checkpoint started without them. ``kind`` says
    when something is due: :class:`DueTimes` or a subclass (``DueTimers`` for
    processor timers, spark_integration/planning/due_timers.py). ``allowed``: whether
    the confs allow a due source, from the operator's conf snapshot
    (:mod:`spark_integration.planning.operator_conf`); None reads them here."""
    spark = df.sparkSession
    if not df.isStreaming:
        return df
    times = kind(backend, name, num_partitions)
    if not _decided(spark, times, allowed):
        return df
    source = _source_class(times, df.schema.json())
    spark.dataSource.register(source)
    due = spark.readStream.format(due_source_name(times)).load()
    return df.unionByName(due)
