"""Rewrite an operator's state with a Python function: ``sessionstore.rewrite``.

``fn`` is called with each row of a store as the reader shows it (``dump``'s
rows: ``{"partition", "key", "start", "end", "value"}`` for sessions, the value
finished into its aggregates where the operator recorded its output plan) and
returns the changed row, the row as it was, or None to delete it. Every returned
row is checked against the store before anything is written: the row's identity
(partition, key, times) cannot change, a changed aggregate must be one whose
result sets its accumulator (:mod:`sessionstore.operators.restate`) and of its
type, and the new stored value must pass the store's value serde. One refused
row stops the rewrite with nothing written.

The change itself (a new commit of the latest version replacing the retained
history, fenced against a running query, crash-safe) is change.py's, as for
``erase``; the function sees a partition's rows in its ``prepare`` step, and the
row change then replaces, keeps or drops the raw rows they came from.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sessionstore.checkpoint.offline.change import (
    DEFAULT_QUIET_S,
    ChangeError,
    ChangeTarget,
    check_idle,
    finish_change,
    open_change,
    pending_change,
    run_change,
)
from sessionstore.checkpoint.records.generation import state_root
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.encoding.session_key import TIMES_LEN, decode_times, times_of
from sessionstore.operators.aggregations import recorded_output, recorded_plan
from sessionstore.operators.restate import with_results
from sessionstore.stores.registry import row_splitter_of
from sessionstore.tools.reader import CheckpointSource, presented_rows

__all__ = ["rewrite", "plan_rewrite", "RewritePlan", "REWRITABLE_KINDS", "RowRewriter"]

#: The store kinds whose rows a rewrite can change.
REWRITABLE_KINDS = ("session",)
_IDENTITY = ("key", "start", "end")
_KEEP = object()


def _function_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}:{getattr(fn, '__qualname__', type(fn).__name__)}"


def _function_digest(fn: Callable[..., Any]) -> str:
    """A digest of what ``fn`` does (its code, constants, names, defaults and
    captured values), so that a rerun after a crash finishes its own interrupted
    rewrite once and another function of the same name is not taken for it."""
    target = fn if hasattr(fn, "__code__") else type(fn).__call__
    code = getattr(target, "__code__", None)
    parts: list[Any] = [type(fn).__qualname__]
    if code is not None:
        parts += [code.co_code, code.co_consts, code.co_names]
    parts.append(getattr(target, "__defaults__", None))
    parts.append(_captured(getattr(target, "__closure__", None) or ()))
    if target is not fn:
        parts.append(getattr(fn, "__dict__", None))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _captured(cells: tuple[Any, ...]) -> list[Any]:
    values = []
    for cell in cells:
        try:
            values.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            continue
    return values


class RowRewriter:
    """What ``fn`` makes of each row of one store, partition by partition: the
    ``prepare`` hook and the row change of :func:`~sessionstore.checkpoint.offline.change.run_change`."""

    def __init__(self, store: str, fn: Callable[[dict], Any], raw: bool) -> None:
        self.store, self.fn, self.raw = store, fn, raw
        self.counts = {"rows": 0, "changed": 0, "deleted": 0}
        #: ``(encoded key, start, end) -> new value bytes, or None (deleted)``
        self._decided: dict[tuple[bytes, int, int], bytes | None] = {}

    def prepare(self, partition: int, stores: dict[str, Any]) -> None:
        """Call ``fn`` on every row of the store in ``partition``, check what it
        returns and keep the decisions for :meth:`change`."""
        store = stores[self.store]
        self._decided = {}
        where = f"store {self.store!r}, partition {partition}"
        plan = None if self.raw else recorded_plan(store)
        finish = recorded_output(store)
        rows = presented_rows(store, store.kind, where, raw=self.raw)
        # the stored values beside the finished ones: the same rows in the same order
        stored = presented_rows(store, store.kind, where, raw=True) if plan else iter(())
        for row in rows:
            row = {"partition": partition, **row}
            kept = next(stored)["value"] if plan else row["value"]
            self.counts["rows"] += 1
            try:
                got = self.fn(copy.deepcopy(row))
            except Exception as exc:  # the row it failed on, for the user's own bug
                raise ChangeError(
                    f"{where}, row key={row['key']!r} start={row['start']} end={row['end']}: "
                    f"fn raised {type(exc).__name__}: {exc}"
                ) from exc
            decided = self._decide(store, row, got, (plan, kept, finish), where)
            if decided is not _KEEP:
                kb = store.encode_key(row["key"])
                self._decided[kb, int(row["start"]), int(row["end"])] = decided
                self.counts["changed" if decided is not None else "deleted"] += 1

    def _decide(self, store: Any, row: dict, got: Any, how: tuple, where: str) -> Any:
        """``_KEEP``, None (delete) or the new value bytes of ``row``; refuses a
        returned row that the store cannot hold."""
        if got is None:
            return None
        at = f"{where}, row key={row['key']!r} start={row['start']} end={row['end']}"
        if not isinstance(got, dict):
            raise ChangeError(f"{at}: fn returned {got!r:.200}, not a row (a dict) or None")
        for field in ("partition", *_IDENTITY):
            if field not in got or got[field] != row[field]:
                raise ChangeError(
                    f"{at}: fn changed {field!r} to {got.get(field)!r:.100}; a rewrite changes "
                    "values only (delete the row, and its key's state restarts)"
                )
        if set(got) != set(row):
            raise ChangeError(f"{at}: fn returned the fields {sorted(got)}, not {sorted(row)}")
        if got["value"] == row["value"] and type(got["value"]) is type(row["value"]):
            return _KEEP
        return self._stored(store, row["value"], got["value"], how, at)

    def _stored(self, store: Any, old: Any, new: Any, how: tuple, at: str) -> bytes:
        """The value bytes of the returned value ``new`` (``old`` before), with
        ``how``: ``(output plan or None, stored value, the plan's finish or None)``."""
        plan, stored, finish = how
        stored = stored if plan is not None else new
        try:
            if plan is not None:
                stored = with_results(plan, stored, old, new)
            elif finish is not None:
                finish(stored)  # an accumulator the plan cannot finish is refused
            return store.value_serde.dumps(stored)
        except Exception as exc:  # the aggregate's or the serde's own words
            raise ChangeError(f"{at}: fn returned the value {new!r:.200}: {exc}") from None

    def change(self, record: dict[str, Any], suffix: str, chunk: list) -> list:
        """The raw rows of ``record``'s family ``suffix`` with the decisions applied."""
        if record["name"] != self.store or not self._decided:
            return chunk
        split = row_splitter_of(record["kind"], suffix)
        if split is not None:  # a block of several sessions: a row per session
            chunk = [row for raw, value in chunk for row in split(raw, value)]
        index_first = suffix in ("open", "closing")  # end ‖ start ‖ enc(key)
        if not index_first and not suffix.lstrip("-").isdigit():
            return chunk
        out = []
        for raw, value in chunk:
            if index_first:
                (start, end), kb = decode_times(raw), raw[TIMES_LEN:]
            else:
                (start, end), kb = times_of(raw), raw[:-TIMES_LEN]
            decided = self._decided.get((kb, start, end), _KEEP)
            if decided is _KEEP or (decided is not None and suffix == "open"):
                out.append((raw, value))  # the end index holds no value
            elif decided is not None:
                out.append((raw, decided))
        return out


def _store_of(metadata: dict[str, Any], store: str | None, where: str) -> str:
    """The store to rewrite: ``store``, or the operator's only rewritable one."""
    kinds = {r["name"]: r["kind"] for r in metadata["stores"]}
    if store is None:
        found = [n for n, k in kinds.items() if k in REWRITABLE_KINDS]
        if len(found) != 1:
            raise ChangeError(
                f"{where} has the stores {sorted(kinds)}: name the one to rewrite (store=)"
            )
        return found[0]
    if store not in kinds:
        raise ChangeError(f"{where} has no store {store!r} (stores: {sorted(kinds)})")
    if kinds[store] not in REWRITABLE_KINDS:
        raise ChangeError(
            f"store {store!r} of {where} is a {kinds[store]} store; a rewrite changes "
            f"{', '.join(REWRITABLE_KINDS)} stores"
        )
    return store


@dataclass(frozen=True)
class RewritePlan:
    """A checked rewrite, for the Python and the Spark-job forms."""

    target: ChangeTarget
    store: str
    fn: Callable[[dict[str, Any]], Any]
    raw: bool
    audit: dict[str, Any]
    #: the result already: the interrupted rewrite finished was this one
    finished: dict[str, Any] | None = None
    resumed: str | None = None

    def rewriter(self) -> RowRewriter:
        """A fresh row change of this rewrite."""
        return RowRewriter(self.store, self.fn, self.raw)

    def check_partition(self, partition: int) -> dict[str, int]:
        """``fn`` on every row of ``partition`` with nothing written: its counts, or
        :class:`ChangeError` naming the first row the store cannot hold."""
        target, rewriter = self.target, self.rewriter()
        source = CheckpointSource(target.uri, target.storage_options, target.allow_pickle)
        with source.open(target.operator, partition, target.version) as (_, stores):
            rewriter.prepare(partition, stores)
        return rewriter.counts

    def result(self, version: int, counts: dict[str, int]) -> dict[str, Any]:
        """What :func:`rewrite` returns."""
        return {"operator": self.target.operator, "store": self.store, "version": version,
                **counts, "resumed": self.resumed}  # fmt: skip


def plan_rewrite(
    checkpoint: str,
    operator: str,
    fn: Callable[[dict[str, Any]], Any],
    store: str | None = None,
    raw: bool = False,
    storage_options: dict[str, Any] | None = None,
    force: bool = False,
    quiet_s: float = DEFAULT_QUIET_S,
    allow_pickle: bool = False,
) -> RewritePlan:
    """Every check of :func:`rewrite` before a row is read (a change a crash left
    committed is finished here); arguments as there."""
    if not callable(fn):
        raise ChangeError(f"fn must be a function of a row, got {fn!r:.100}")
    checkpoint = state_root(checkpoint, operator, storage_options)  # after a rescale
    storage = open_filesystem(checkpoint, storage_options).child(operator)
    resumed = pending_change(storage)
    if resumed is not None:
        finish_change(storage, resumed)
    target = open_change(checkpoint, operator, storage_options, allow_pickle)
    name = _store_of(target.metadata, store, f"{checkpoint}/{operator}")
    audit = {"change": "rewrite", "operator": operator, "store": name,
             "fn": _function_name(fn), "fn_digest": _function_digest(fn),
             "raw": raw}  # fmt: skip
    plan = RewritePlan(target, name, fn, raw, audit,
                       resumed=None if resumed is None else resumed["id"])  # fmt: skip
    if resumed is not None and all(resumed["audit"].get(k) == v for k, v in audit.items()):
        done = plan.result(resumed["version"], resumed["audit"]["counts"])
        return replace(plan, finished=done)
    if not force:
        check_idle(target, quiet_s)
    return plan


def rewrite(
    checkpoint: str,
    operator: str,
    fn: Callable[[dict[str, Any]], dict[str, Any] | None],
    store: str | None = None,
    raw: bool = False,
    storage_options: dict[str, Any] | None = None,
    force: bool = False,
    quiet_s: float = DEFAULT_QUIET_S,
    allow_pickle: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Rewrite the rows of ``store`` (default: the operator's only session store)
    of ``operator`` at ``checkpoint`` with ``fn``: called with each row as
    ``sessionstore dump`` shows it (``raw``: the stored accumulators instead of
    the aggregates), it returns the row changed, as it was, or None to delete it.
    Every returned row is checked before anything is written; a row the store
    cannot hold raises :class:`ChangeError` naming the row, the field and the
    value, and nothing changes. Only values change: a row's partition, key and
    times are its identity.

    The latest version V becomes a new commit holding the rewritten rows, and
    older versions are no longer loadable, as for :func:`sessionstore.erase`
    (same ``force``, ``quiet_s``: the query must be stopped). A change a crash left
    committed is finished first; when it was this same function's rewrite of this
    store, finishing it is the whole job (``fn`` is not applied twice).
    ``spark_integration.rewrite_state`` runs it as a Spark job.

    Returns ``{"operator", "store", "version", "rows", "changed", "deleted",
    "resumed"}``.
    """
    plan = plan_rewrite(checkpoint, operator, fn, store, raw, storage_options, force,
                        quiet_s, allow_pickle)  # fmt: skip
    if plan.finished is not None:
        return plan.finished
    rewriter = plan.rewriter()
    audit = plan.audit | {"counts": rewriter.counts}
    record = run_change(plan.target, rewriter.change, audit, progress, rewriter.prepare)
    return plan.result(record["version"], rewriter.counts)
