"""The processor core: what a StatefulProcessor's handle, its state variables and
its runner share, behind public methods.

One :class:`ProcessorCore` per handle owns

* the processor store and the grouping-key arity (a single column's key is
  stored as its value, several as a tuple, as every operator of sessionstore
  encodes keys);
* the life-cycle state (:class:`HandleState`), which the runner moves and the
  handle checks;
* the batch's times: processing time (what TTL expiry is measured against) and
  watermark;
* the current key's :class:`KeyScope`: the first access to any variable of a key
  loads all of them in one multi-get, calls work on the loaded Python objects,
  and :meth:`ProcessorCore.end_key` writes back the variables that changed, once;
* the registry of the defined variables (what a key's load reads and the
  write-back and TTL pass consult), duck-typed: each has ``encoded``, ``ttl_ms``,
  ``purge(payload)`` and ``min_expiry(payload)``;
* the current key's timers (a sorted list of expiry times, mirrored in the
  store's timer index) and the TTL pass.

The handle (:mod:`~sessionstore.operators.processors.handle`) adds Spark's API
and life-cycle checks on top, the variables
(:mod:`~sessionstore.operators.processors.state`) their semantics, and the runner
(:mod:`~sessionstore.operators.processors.runner`) Spark's order of calls; each of
them imports this module, and this module none of them.
"""

from __future__ import annotations

import bisect
from typing import Any

from sessionstore.encoding.keys import decode_key, encoded_length
from sessionstore.errors import StatefulProcessorError
from sessionstore.stores.processor import TIMERS_VAR

__all__ = ["ProcessorCore", "KeyScope", "HandleState"]


class HandleState:
    """Spark's ``StatefulProcessorHandleState`` values, in life-cycle order."""

    CREATED, INITIALIZED, DATA_PROCESSED, TIMER_PROCESSED, CLOSED = (
        "CREATED", "INITIALIZED", "DATA_PROCESSED", "TIMER_PROCESSED", "CLOSED"
    )  # fmt: skip
    ORDER = (CREATED, INITIALIZED, DATA_PROCESSED, TIMER_PROCESSED, CLOSED)


class KeyScope:
    """The loaded variables of one grouping key while its handler runs.

    A variable's hot calls read ``payloads`` directly once ``loaded`` (a dict
    look-up, no call into the core) and add their encoded name to ``dirty`` when
    they change it."""

    __slots__ = ("key", "key_bytes", "payloads", "loaded", "loaded_expiry", "dirty")

    def __init__(self, key: Any, key_bytes: bytes) -> None:
        self.key = key
        self.key_bytes = key_bytes
        self.payloads: dict[bytes, Any] = {}
        self.loaded = False
        #: earliest expiry of each TTL variable as loaded (its TTL index entry)
        self.loaded_expiry: dict[bytes, int | None] = {}
        self.dirty: set[bytes] = set()


class ProcessorCore:
    """Store, key scope, batch times, variables and timers of one processor
    handle (see the module doc). ``store`` is None while a driver plans the
    query: variables are then only declared, no key is ever processed.
    ``timers`` says whether the time mode has timers: without them a key's load
    does not read its (always absent) timer list."""

    def __init__(self, store: Any, key_arity: int = 1, timers: bool = True) -> None:
        self.store = store
        self.key_arity = key_arity
        self.timers_enabled = timers
        self.state = HandleState.CREATED
        #: processing time of the batch in ms (-1: none); TTL is measured against it
        self.processing_ms = -1
        #: event-time watermark of the batch in ms (-1: none)
        self.watermark_ms = -1
        #: the current key, None between keys
        self.scope: KeyScope | None = None
        #: encoded name -> the defined variable
        self.variables: dict[bytes, Any] = {}
        # what a key's load reads, and its TTL variables: worked out once per
        # change of the variables, not per key
        self._load_plan: tuple[list[bytes], list[tuple[bytes, Any]]] | None = None

    # ------------------------------------------------------------- batch
    def begin_batch(self, processing_ms: int, watermark_ms: int) -> None:
        """Set the times of the batch about to run."""
        self.processing_ms = processing_ms
        self.watermark_ms = watermark_ms

    def add_variable(self, variable: Any) -> None:
        """Register a defined variable: keys load it, write it back and purge it."""
        self.variables[variable.encoded] = variable
        self._load_plan = None

    def remove_variable(self, encoded: bytes) -> None:
        """Forget a variable (``deleteIfExists``): keys no longer load or write it."""
        self.variables.pop(encoded, None)
        self._load_plan = None

    # --------------------------------------------------------- key scopes
    def store_key(self, key: tuple) -> Any:
        """The stored form of the key tuple ``key``."""
        return key[0] if self.key_arity == 1 else key

    def key_of(self, key_bytes: bytes) -> tuple:
        """The key tuple of an encoded grouping key."""
        stored = decode_key(key_bytes)
        return (stored,) if self.key_arity == 1 else tuple(stored)

    def encode_key(self, key: tuple) -> bytes:
        """The encoded grouping key of the key tuple ``key``."""
        return self.store.encode_key(self.store_key(key))

    def begin_key(self, key: tuple, key_bytes: bytes | None = None) -> None:
        """Make ``key`` (a tuple of grouping values) the current key; its variables
        are loaded on first use."""
        self.scope = KeyScope(key, self.encode_key(key) if key_bytes is None else key_bytes)

    def end_key(self) -> None:
        """Write back the current key's changed variables and TTL index entries."""
        scope, self.scope = self.scope, None
        if scope is None or not scope.dirty:
            return
        store = self.store
        kb = scope.key_bytes
        variables = self.variables
        for encoded in scope.dirty:
            payload = scope.payloads.get(encoded)
            var = variables.get(encoded)
            if var is not None and var.ttl_ms is not None:
                old = scope.loaded_expiry.get(encoded)
                # items written in this batch expire after it (ttl > 0): only an
                # item loaded with an expiry at or before the batch time can have
                # expired, so a map or list without one is not copied to purge it
                if old is not None and old <= self.processing_ms:
                    payload = var.purge(payload)
                new = var.min_expiry(payload)
                if old != new:
                    if old is not None:
                        store.index_delete(store.ttl_cf, old, kb + encoded)
                    if new is not None:
                        store.index_put(store.ttl_cf, new, kb + encoded)
            store.write(kb, encoded, payload)

    def current(self, operation: str) -> KeyScope:
        """The current key's scope; Spark's error naming ``operation`` outside a key."""
        scope = self.scope
        if scope is None:
            raise StatefulProcessorError(
                "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE",
                f"Failed to perform stateful processor operation={operation} with invalid "
                f"handle state={self.state}: no grouping key is being processed.",
            )
        return scope

    def current_store_key(self, operation: str) -> Any:
        """The stored form of the current key (for the session and versioned
        stores, which take keys as every operator does)."""
        return self.store_key(self.current(operation).key)

    def _load(self, scope: KeyScope) -> None:
        plan = self._load_plan
        if plan is None:
            variables = list(self.variables)
            if self.timers_enabled:
                variables.append(TIMERS_VAR)
            ttl = [(e, v) for e, v in self.variables.items() if v.ttl_ms is not None]
            plan = self._load_plan = (variables, ttl)
        variables, ttl = plan
        payloads = self.store.load(scope.key_bytes, variables)
        scope.payloads = dict(zip(variables, payloads, strict=True))
        scope.loaded = True
        if ttl:
            scope.loaded_expiry = {e: var.min_expiry(scope.payloads[e]) for e, var in ttl}

    def payload(self, encoded: bytes) -> Any:
        """A variable's payload for the current key (loading the key's variables on
        first use; Spark's error outside a key)."""
        scope = self.scope
        if scope is None:
            scope = self.current("state access")
        if not scope.loaded:
            self._load(scope)
        return scope.payloads.get(encoded)

    def set_payload(self, encoded: bytes, payload: Any) -> None:
        """Change a variable's payload for the current key (written back by
        :meth:`end_key`)."""
        scope = self.scope
        if scope is None:
            scope = self.current("state update")
        if not scope.loaded:
            self._load(scope)
        scope.payloads[encoded] = payload
        scope.dirty.add(encoded)

    # ------------------------------------------------------------- timers
    def timers(self) -> list[int]:
        """The current key's timers, earliest first (a copy)."""
        return list(self.payload(TIMERS_VAR) or ())

    def register_timer(self, ts: int) -> None:
        """Add a timer at ``ts`` to the current key (no-op if it has one), in its
        list and at once in the timer index (what firing reads)."""
        times = self.timers()
        i = bisect.bisect_left(times, ts)
        if i < len(times) and times[i] == ts:
            return
        times.insert(i, ts)
        self.set_payload(TIMERS_VAR, times)
        self.store.index_put(self.store.timers_cf, ts, self.scope.key_bytes)

    def delete_timer(self, ts: int) -> None:
        """Remove the current key's timer at ``ts`` (no-op if absent)."""
        times = self.timers()
        i = bisect.bisect_left(times, ts)
        if i == len(times) or times[i] != ts:
            return
        del times[i]
        self.set_payload(TIMERS_VAR, times or None)
        self.store.index_delete(self.store.timers_cf, ts, self.scope.key_bytes)

    def due_timers(self, threshold: int) -> list[tuple[int, bytes]]:
        """``(expiry, encoded key)`` of every timer with expiry at or before
        ``threshold`` (Spark's test is inclusive), in (expiry, key) order: one range
        read of the timer index."""
        return self.store.index_before(self.store.timers_cf, threshold + 1)

    def next_timer(self) -> int | None:
        """The expiry of the earliest pending timer of any key (None if none)."""
        return self.store.index_first(self.store.timers_cf)

    # ---------------------------------------------------------------- TTL
    def next_expiry(self) -> int | None:
        """The earliest TTL expiry of any value (None if none, or no variable has a
        TTL: then nothing would clean it, and nothing is due)."""
        if not self.has_ttl():
            return None
        return self.store.index_first(self.store.ttl_cf)

    def has_ttl(self) -> bool:
        """Whether any defined variable has a TTL."""
        return any(v.ttl_ms is not None for v in self.variables.values())

    def clean_expired(self, limit: int) -> int:
        """Remove expired values of at most ``limit`` (key, variable) pairs whose
        earliest expiry has passed: a range read of the TTL index from its start,
        never a scan of every key. Returns how many pairs it visited."""
        store = self.store
        due = store.index_before(store.ttl_cf, self.processing_ms + 1, limit)
        for ts, suffix in due:
            # the entry goes; the write-back adds the variable's next expiry, if any
            store.index_delete(store.ttl_cf, ts, suffix)
            n = encoded_length(suffix)
            encoded = suffix[n:]
            if encoded not in self.variables:  # a variable this processor no longer defines
                continue
            self.begin_key(self.key_of(suffix[:n]), suffix[:n])
            self.set_payload(encoded, self.payload(encoded))  # purged on write-back
            self.end_key()
        return len(due)
