"""Per-task state metrics: collected at each commit, carried in the changelog header.

Every commit already uploads one object, its changelog, so the metrics of the task
that wrote version N travel in the header of changelog N (a ``metrics`` map with
its own ``format``; no extra request). ``sessionstore stats`` reads them back with
the ranged header reads ``sessionstore ls`` uses, and a Spark job gets the same
record from each task (see ``spark_integration/execution/metrics.py``).

One thing a changelog cannot hold is its own upload time. The timings of the
commit of version N (prepare, upload, apply) are therefore recorded in the local
database after the commit (``LAST_COMMIT_KEY``) and go into the header of
changelog N+1 as ``previous``; the newest version's commit time is known to the
task (and so to the Spark job) but not yet to the checkpoint. A partition restored
on another machine has no such record, and that one commit time stays unknown.

Header metrics (format 1), per task:

* ``rows_total``: RocksDB's estimate of the rows in the state after the commit;
* ``rows_updated``, ``rows_removed``: rows written and deleted by the commit;
* ``late_dropped``, ``emitted``: rows the operator dropped as late and emitted
  (None when the caller did not say, as with the provider used directly);
* ``load_kind`` (one of :data:`LOAD_KINDS`) and ``load_ms`` (the database's open
  and the version's load; a Spark task notes its whole wait, a handover's
  included);
* ``uploaded_bytes``: this changelog's bytes plus the snapshot bytes uploaded
  for the partition by this process since its previous commit;
* ``snapshot_lag``: versions since the newest snapshot that was uploaded;
* ``memory_bytes``: native memory of the databases the process holds open: the
  usage of its shared block cache, which is charged with their memtables;
* ``storage_retries``: object-store requests of the partition's storage that
  failed transiently and were tried again (sessionstore/checkpoint/storage/retry.py) since
  its previous commit in this process, maintenance included;
* ``repaired``: restores since the previous commit that went around an unusable
  snapshot (an older snapshot or version 0 plus the changelogs; load.py);
  absent in changelogs written before it (read as unknown);
* ``previous``: ``{version, prepare_ms, upload_ms, apply_ms}`` of the commit before.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

__all__ = [
    "METRICS_FORMAT",
    "LOAD_KINDS",
    "STATS_FIELDS",
    "TASK_FIELDS",
    "HEADER_FIELDS",
    "snapshot_lag",
    "millis",
    "commit_ms",
    "task_records",
    "summarize_batch",
]

METRICS_FORMAT = 1
#: How a task got its state: the database was open in the process already; it was
#: reopened from the local disk (handed over by another worker, or left there); the
#: local copy replayed changelogs to catch up; or it was restored from a snapshot
#: and changelogs.
LOAD_KINDS = ("warm", "handover", "replay", "restore")
#: The fields of one ``sessionstore stats`` row (one operator, one micro-batch).
STATS_FIELDS = (
    "operator", "batch", "partitions", "rows_total", "rows_updated", "rows_removed",
    "late_dropped", "emitted", "load_ms_max", "loads", "commit_ms_p50", "commit_ms_max",
    "uploaded_bytes", "snapshot_lag_max", "memory_bytes_max", "repaired",
)  # fmt: skip


#: The header metrics a commit records (the list above, without ``format`` and
#: ``previous``): the one list the provider's record, the coordinator's check of
#: task records and the tests follow.
HEADER_FIELDS = (
    "rows_total", "rows_updated", "rows_removed", "late_dropped", "emitted",
    "load_kind", "load_ms", "uploaded_bytes", "snapshot_lag", "memory_bytes",
    "storage_retries", "repaired",
)  # fmt: skip
#: The fields of a task's metrics record as a Spark task reports it (the header
#: metrics without ``previous``, the commit's own timings, and which partition and
#: batch): a coordinator takes records with these fields only.
TASK_FIELDS = frozenset(HEADER_FIELDS) | {
    "format", "version", "prepare_ms", "upload_ms", "apply_ms", "commit_ms", "partition",
    "batch",
}  # fmt: skip


def snapshot_lag(version: int, interval: int, pending: Iterable[int]) -> int:
    """Versions since the newest uploaded snapshot, at ``version``: snapshots are
    taken every ``interval`` versions and ``pending`` ones wait for their upload
    here (version 0, the empty state, counts as a snapshot)."""
    waiting = set(pending)
    newest = version - version % interval
    while newest > 0 and newest in waiting:
        newest -= interval
    return version - max(newest, 0)


def millis(seconds: float) -> float:
    """Seconds as milliseconds, to the microsecond (what the records hold)."""
    return round(seconds * 1000, 3)


def commit_ms(timings: dict[str, Any] | None) -> float | None:
    """The whole commit time of a ``previous`` record (prepare + upload + apply)."""
    if not timings:
        return None
    return round(timings["prepare_ms"] + timings["upload_ms"] + timings["apply_ms"], 3)


def task_records(headers: dict[int, dict[str, Any]], partition: int) -> dict[int, dict[str, Any]]:
    """Per version, the task record of one partition from its changelog headers
    (``{version: header}``): the header's metrics, ``rows_total`` from its store
    stats when it has none (changelogs written before metrics existed), and
    ``commit_ms`` from the next version's header."""
    out = {}
    for version, header in headers.items():
        metrics = dict(header.get("metrics") or {})
        if "rows_total" not in metrics and header.get("stats"):
            metrics["rows_total"] = sum(s.get("keys", 0) for s in header["stats"].values())
        after = (headers.get(version + 1) or {}).get("metrics") or {}
        previous = after.get("previous")
        known = previous is not None and previous.get("version") == version
        metrics["commit_ms"] = commit_ms(previous) if known else None
        metrics["partition"] = partition
        out[version] = metrics
    return out


def _total(records: list[dict[str, Any]], field: str) -> int | None:
    values = [r[field] for r in records if r.get(field) is not None]
    return sum(values) if values else None


def _max(records: list[dict[str, Any]], field: str) -> Any:
    values = [r[field] for r in records if r.get(field) is not None]
    return max(values) if values else None


def summarize_batch(operator: str, batch: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``sessionstore stats`` row: the task records of one micro-batch (version
    ``batch + 1``) of ``operator``, over its partitions. Sums and maxima skip
    unknown values and are None when no partition knows them."""
    loads: dict[str, int] = {}
    for r in records:
        if r.get("load_kind"):
            loads[r["load_kind"]] = loads.get(r["load_kind"], 0) + 1
    commits = [r["commit_ms"] for r in records if r.get("commit_ms") is not None]
    return {
        "operator": operator,
        "batch": batch,
        "partitions": len(records),
        "rows_total": _total(records, "rows_total"),
        "rows_updated": _total(records, "rows_updated"),
        "rows_removed": _total(records, "rows_removed"),
        "late_dropped": _total(records, "late_dropped"),
        "emitted": _total(records, "emitted"),
        "load_ms_max": _max(records, "load_ms"),
        "loads": dict(sorted(loads.items())),
        "commit_ms_p50": round(statistics.median(commits), 3) if commits else None,
        "commit_ms_max": max(commits) if commits else None,
        "uploaded_bytes": _total(records, "uploaded_bytes"),
        "snapshot_lag_max": _max(records, "snapshot_lag"),
        "memory_bytes_max": _max(records, "memory_bytes"),
        "repaired": _total(records, "repaired"),
    }
