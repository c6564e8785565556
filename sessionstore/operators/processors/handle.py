"""The StatefulProcessorHandle a processor's ``init`` receives.

It implements PySpark's ``StatefulProcessorHandle`` (``getValueState``,
``getListState``, ``getMapState``, ``registerTimer``, ``deleteTimer``,
``listTimers``, ``deleteIfExists``) over a
:class:`~sessionstore.stores.processor.ProcessorStore`, plus sessionstore's
``getSessionState`` and ``getVersionedState``. It enforces Spark's life cycle
(state variables only in ``init``, timers only with a time mode and only while
keys are processed) with Spark's error conditions.

Schemas are opaque here (no pyspark): the engine that runs the processor passes a
``parse_schema`` callable that checks a schema (a ``StructType`` or DDL string)
and raises its own error for a bad one. A parsed schema with ``jsonValue()``
(PySpark's ``StructType``) is what each variable's values are encoded from
(:mod:`sessionstore.encoding.state_values`); the engine may instead pass the
declarations it parsed when it planned the query (``schemas``, from
:attr:`ProcessorHandle.schemas`), as executors cannot parse DDL strings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from sessionstore.encoding.keys import encode_key
from sessionstore.encoding.state_values import value_shaper
from sessionstore.errors import StatefulProcessorError
from sessionstore.operators.processors.core import HandleState, ProcessorCore
from sessionstore.operators.processors.state import (
    ListState,
    MapState,
    SessionState,
    ValueState,
    VersionedState,
)
from sessionstore.stores.base import check_store_name
from sessionstore.stores.processor import ProcessorStore

__all__ = ["ProcessorHandle", "HandleState", "extra_store_name"]


def extra_store_name(variable: str) -> str:
    """The store that holds the session or versioned state variable ``variable``."""
    return f"state-{variable}"


#: Spark's names of the time modes in its error messages.
_SPARK_MODE = {"None": "NoTime", "ProcessingTime": "ProcessingTime", "EventTime": "EventTime"}


class ProcessorHandle:
    """State and timers of a processor over one partition's processor store.

    ``open_store(kind, name, retention_ms)`` returns the extra stores that
    ``getSessionState``/``getVersionedState`` ask for (a Spark task takes them from
    its partition's loaded stores). ``key_arity`` is the number of grouping
    columns: a single column's key is stored as its value, several as a tuple, as
    every operator of sessionstore encodes keys. ``runtime_error(message)`` is
    what a call Spark's JVM refuses raises (PySpark's ``PySparkRuntimeError`` in
    Spark, a ``RuntimeError`` subclass); ``make_struct(names)`` builds the nested
    structs of values read back (PySpark's ``Row`` in Spark).

    The store, current key, batch times and timers live in :attr:`core` (a
    :class:`~sessionstore.operators.processors.core.ProcessorCore`), which the
    variables and the runner share.
    """

    def __init__(
        self,
        store: ProcessorStore | None,
        time_mode: str = "None",
        parse_schema: Callable[[Any], Any] | None = None,
        open_store: Callable[[str, str, int], Any] | None = None,
        key_arity: int = 1,
        runtime_error: Callable[[str], Exception] = RuntimeError,
        schemas: dict[str, dict[str, Any]] | None = None,
        make_struct: Callable[[list[str]], Callable[[tuple], Any]] | None = None,
    ) -> None:
        #: what the handle, its variables and the runner share
        self.core = ProcessorCore(store, key_arity, timers=time_mode != "None")
        #: the exception Spark's state clients raise where the JVM refused a call
        #: (the engine passes PySpark's ``PySparkRuntimeError``, a RuntimeError)
        self.runtime_error = runtime_error
        self._given_schemas = schemas or {}
        self._make_struct = make_struct
        #: variable -> {"kind", "value_schema", "key_schema"}: each variable's
        #: schemas in Spark's JSON form (None where the engine gave none)
        self.schemas: dict[str, dict[str, Any]] = {}
        self._time_mode = time_mode
        self._parse_schema = parse_schema or (lambda schema: schema)
        self._open_store = open_store
        self._variables: dict[str, Any] = {}
        #: extra stores asked for in init: variable -> (kind, retention_ms)
        self.extra_stores: dict[str, tuple[str, int]] = {}
        self.deleted: list[str] = []

    @property
    def state(self) -> str:
        """The life-cycle state (:class:`HandleState`), moved by the runner."""
        return self.core.state

    @state.setter
    def state(self, value: str) -> None:
        self.core.state = value

    # ------------------------------------------------------------- life cycle
    def _check_state(self, operation: str, *allowed: str) -> None:
        if self.state not in allowed:
            raise StatefulProcessorError(
                "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE",
                f"Failed to perform stateful processor operation={operation} with invalid "
                f"handle state={self.state}.",
            )

    def _define(self, operation: str, name: str, ttl_ms: int | None) -> None:
        self._check_state(operation, HandleState.CREATED)
        if not isinstance(name, str) or not name:
            raise StatefulProcessorError(
                "STATE_STORE_CANNOT_USE_COLUMN_FAMILY_WITH_INVALID_NAME",
                f"Failed to perform column family operation={operation} with invalid "
                f"name={name!r}. Column family name cannot be empty.",
            )
        if name in self._variables or name in self.extra_stores:
            raise StatefulProcessorError(
                "STATEFUL_PROCESSOR_DUPLICATE_STATE_VARIABLE_DEFINED",
                f"State variable with name {name} has already been defined in the "
                "StatefulProcessor.",
            )
        if ttl_ms is not None:
            if self._time_mode != "ProcessingTime":
                raise StatefulProcessorError(
                    "STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL",
                    f"Cannot use TTL for state={name} in timeMode="
                    f"{_SPARK_MODE[self._time_mode]}, use TimeMode.ProcessingTime() instead.",
                )
            if type(ttl_ms) is not int or ttl_ms <= 0:
                raise StatefulProcessorError(
                    "STATEFUL_PROCESSOR_TTL_DURATION_MUST_BE_POSITIVE",
                    f"TTL duration must be greater than zero for State store "
                    f"operation=update on state={name} (got {ttl_ms!r}).",
                )

    def getValueState(  # noqa: N802 - PySpark's names
        self,
        stateName: str,
        schema: Any,
        ttlDurationMs: int | None = None,  # noqa: N803
    ) -> ValueState:
        """A value state variable (call in ``init``)."""
        self._define("get_value_state", stateName, ttlDurationMs)
        self._declare(stateName, "value", schema)
        return self._add(stateName, ValueState(self.core, stateName, ttlDurationMs))

    def getListState(  # noqa: N802
        self,
        stateName: str,
        schema: Any,
        ttlDurationMs: int | None = None,  # noqa: N803
    ) -> ListState:
        """A list state variable (call in ``init``)."""
        self._define("get_list_state", stateName, ttlDurationMs)
        # a list without a TTL is held as its bare values (no expiry per element)
        self._declare(stateName, "list", schema, ttl=ttlDurationMs is not None)
        return self._add(stateName, ListState(self.core, stateName, ttlDurationMs))

    def getMapState(  # noqa: N802
        self,
        stateName: str,  # noqa: N803
        userKeySchema: Any,  # noqa: N803
        valueSchema: Any,  # noqa: N803
        ttlDurationMs: int | None = None,  # noqa: N803
    ) -> MapState:
        """A map state variable (call in ``init``)."""
        self._define("get_map_state", stateName, ttlDurationMs)
        key_parsed = self._parse_schema(userKeySchema)
        declared = self._declare(stateName, "map", valueSchema, key_parsed)
        key_json = declared["key_schema"]
        # the user-key schema's fields: as declared (parsed here, or on the driver
        # that planned the query), else those of an opaque parsed schema
        fields = key_json["fields"] if key_json else getattr(key_parsed, "fields", None)
        var = MapState(
            self.core, stateName, ttlDurationMs,
            key_fields=None if fields is None else len(fields),
            runtime_error=self.runtime_error,
        )  # fmt: skip
        return self._add(stateName, var)

    def _add(self, name: str, var: Any) -> Any:
        # values are converted as PySpark's state client converts them (nested
        # structs given as dicts by field name), so what a call reads back within
        # the batch is what Spark reads back from its store
        var.shape = value_shaper(self.schemas[name]["value_schema"], self._make_struct)
        var.runtime_error = self.runtime_error
        self._variables[name] = var
        self.core.add_variable(var)
        return var

    def _declare(
        self, name: str, kind: str, schema: Any, key_parsed: Any = None, ttl: bool = True
    ) -> dict[str, Any]:
        """Check the schemas and declare the variable to the store (its encoding;
        ``ttl``: whether a list's elements carry expiries); returns its declaration
        (kind and schemas in Spark's JSON form)."""
        value_json = _schema_json(self._parse_schema(schema))
        key_json = None if kind != "map" else _schema_json(key_parsed)
        declared = self._given_schemas.get(name)
        if declared is None or declared.get("kind") != kind:
            declared = {"kind": kind, "value_schema": value_json, "key_schema": key_json}
        self.schemas[name] = declared
        if self.core.store is not None:
            self.core.store.declare(
                name, kind, declared["value_schema"], declared["key_schema"], self._make_struct,
                ttl=ttl,
            )  # fmt: skip
        return declared

    def getSessionState(self, stateName: str, retention_ms: int) -> SessionState:  # noqa: N802,N803
        """sessionstore's session store for each key (call in ``init``): sessions
        stay visible for ``retention_ms`` behind the store's stream time."""
        return SessionState(
            self.core, self._extra("get_session_state", "session", stateName, retention_ms)
        )

    def getVersionedState(  # noqa: N802
        self,
        stateName: str,
        history_retention_ms: int,  # noqa: N803
    ) -> VersionedState:
        """sessionstore's versioned store for each key (call in ``init``)."""
        store = self._extra("get_versioned_state", "versioned", stateName, history_retention_ms)
        return VersionedState(self.core, store)

    def _extra(self, operation: str, kind: str, name: str, retention_ms: int) -> Any:
        self._define(operation, name, None)
        check_store_name(extra_store_name(name))
        if type(retention_ms) is not int or retention_ms <= 0:
            raise ValueError(
                f"{operation}: retention must be a positive int of ms, got {retention_ms!r}"
            )
        self.extra_stores[name] = (kind, retention_ms)
        if self._open_store is None:
            return None  # planning: the stores are only being declared
        return self._open_store(kind, extra_store_name(name), retention_ms)

    def deleteIfExists(self, stateName: str) -> None:  # noqa: N802,N803
        """Delete a state variable of every key (call in ``init``, for variables a
        processor no longer defines). A variable this ``init`` defined before is
        gone too: its calls raise as Spark's do (its iterators are empty), and a
        later ``get*State`` of the name defines it anew."""
        self._check_state("delete_if_exists", HandleState.CREATED)
        self.deleted.append(stateName)
        var = self._variables.pop(stateName, None)
        if var is not None:
            var.mark_deleted(self.runtime_error)
            self.core.remove_variable(var.encoded)
        if self.core.store is not None:
            self.core.store.delete_variable(encode_key(stateName))

    # ------------------------------------------------------------------ timers
    def _check_timers(self, operation: str) -> None:
        if self._time_mode == "None":
            raise StatefulProcessorError(
                "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE",
                f"Failed to perform stateful processor operation={operation} with invalid "
                f"timeMode={_SPARK_MODE[self._time_mode]}",
            )
        self._check_state(operation, HandleState.INITIALIZED, HandleState.DATA_PROCESSED)

    def registerTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        """Register a timer of the current key."""
        self._check_timers("register_timer")
        self.core.current("register_timer")
        self.core.register_timer(_timestamp(expiryTimestampMs))

    def deleteTimer(self, expiryTimestampMs: int) -> None:  # noqa: N802,N803
        """Delete a timer of the current key (no-op if absent)."""
        self._check_timers("delete_timer")
        self.core.current("delete_timer")
        self.core.delete_timer(_timestamp(expiryTimestampMs))

    def listTimers(self) -> Iterator[int]:  # noqa: N802
        """The current key's timers, earliest first."""
        self._check_timers("list_timers")
        self.core.current("list_timers")
        return iter(self.core.timers())


def _schema_json(parsed: Any) -> dict[str, Any] | None:
    """A parsed schema in Spark's JSON form (a struct), or None if it has none."""
    to_json = getattr(parsed, "jsonValue", None)
    if callable(to_json):
        parsed = to_json()
    if isinstance(parsed, dict) and parsed.get("type") == "struct":
        return parsed
    return None


def _timestamp(value: Any) -> int:
    if hasattr(value, "item") and hasattr(value, "dtype"):
        value = value.item()
    if type(value) is not int:
        raise TypeError(
            f"a timer's expiry must be an int of epoch ms, got {type(value).__name__} {value!r}"
        )
    return value
