"""``spark.read.format("sessionstore")``: a store as a DataFrame with typed columns.

Options: ``path`` (a checkpoint root URI, or a job's local database directory),
``store`` (required); ``operator`` (required when there are several);
``batchId`` (the version to read: the state after that many batches; default the
latest), ``partition``, ``key`` and ``asOf`` (versioned stores), ``keySchema`` and
``valueSchema`` (DDL, see below), ``raw``, ``allowPickle`` and
``storage.<option>`` for ``pyarrow.fs``. A store whose checkpoint records the
``pickle`` serde is refused (one line naming it and the option) unless
``.option("allowPickle", "true")``: unpickling runs whatever code the writer of
the checkpoint put there (docs/security.md). One Spark partition reads one state partition (a checkpoint version
is restored into a temporary directory; a local database is opened as a RocksDB
secondary).

Columns: ``partition_id``, the key field(s), then ``start``/``end`` (session and
window stores), ``valid_from``/``valid_to`` (versioned), ``timestamp``/``offset``
(message stores), ``window``/``count`` (count windows), and ``value``.

Stores of aggregating operators (``sessionize``, ``window_aggregate``) hold
accumulators; their ``value`` is the operator's output instead, a struct of the
aggregates by name (for example ``value.clicks``), from the output plan the operator
recorded with its state. ``.option("raw", "true")`` reads the stored accumulators.

Types: keys and values are stored as msgpack, without a schema. The reader infers
Spark types from the first rows of the store (ints are ``bigint``, floats
``double``, dicts structs, lists arrays; ints and floats together widen to
``double``, other conflicts fall back to JSON text). A tuple key becomes one column
per field (``key_0``, ``key_1``, ... or the names of ``keySchema``). Give
``keySchema`` (for example ``"user string, region string"``) or ``valueSchema``
(for example ``"count bigint, total double"``, or ``"string"`` for JSON text) to
skip inference; a value that does not fit its column type becomes JSON text when
the column is a string, and an error naming the row otherwise.

A processor store (``transform_with_state``) is read by state variable, as Spark's
``statestore`` reader reads a transformWithState operator's:
``.option("stateVarName", NAME)`` (with ``flattenCollectionTypes``, default true)
or ``.option("readRegisteredTimers", "true")``; ``store`` defaults to the
operator's processor store. Columns: ``key`` (a struct; ``keySchema`` names its
fields), the variable's columns typed by its recorded schemas, ``partition_id``
(see :mod:`sessionstore.tools.processor_rows`; the rows of
``sessionstore dump --state-var``).
"""

from __future__ import annotations

import json
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from sessionstore.tools.processor_rows import TTL_FIELD, timer_rows, variable_rows
from sessionstore.tools.reader import (
    RowFilter,
    open_source,
    store_kind,
    store_rows,
    variable_declaration,
)

__all__ = ["SessionStoreDataSource", "register", "infer_type"]

_TIME_COLUMNS = {
    "session": ["start", "end"],
    "window": ["start", "end"],
    "messages": ["timestamp", "offset"],
    "versioned": ["valid_from", "valid_to"],
    "kv": [],
}
_SAMPLE = 100


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, Decimal):  # an exact decimal aggregate: its digits
        return str(value)
    if isinstance(value, date | time):  # a held row's timestamp, date or time
        return value.isoformat()
    if isinstance(value, timedelta):
        return str(value)
    return json.dumps(value, default=str)


def _infer(value: Any) -> Any:
    """The type of a decoded msgpack value: a Spark type name, ``("array", t)`` or
    ``("struct", [(name, t), ...])``; ``None`` when the value says nothing (null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double"
    if isinstance(value, bytes):
        return "binary"
    if isinstance(value, datetime):  # a held row's timestamp (aware) or timestamp_ntz
        return "timestamp" if value.tzinfo is not None else "timestamp_ntz"
    if isinstance(value, date):
        return "date"
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        return ("struct", [(k, _infer(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return ("array", _widen([_infer(v) for v in value]))
    return "string"


def _widen(types: list[Any]) -> Any:
    """One type for several samples: equal types stay, bigint and double give double,
    structs merge their fields, anything else falls back to string (JSON text)."""
    known = [t for t in types if t is not None]
    if not known:
        return None
    first = known[0]
    if all(t == first for t in known):
        return first
    if {t for t in known if isinstance(t, str)} == {"bigint", "double"} and all(
        isinstance(t, str) for t in known
    ):
        return "double"
    if all(isinstance(t, tuple) and t[0] == "struct" for t in known):
        fields: dict[str, list[Any]] = {}
        for t in known:
            for name, ft in t[1]:
                fields.setdefault(name, []).append(ft)
        return ("struct", [(name, _widen(ts)) for name, ts in fields.items()])
    if all(isinstance(t, tuple) and t[0] == "array" for t in known):
        return ("array", _widen([t[1] for t in known]))
    return "string"


def _ddl(t: Any) -> str:
    """Spark DDL of an inferred type (unknown, all-null columns are strings)."""
    if t is None:
        return "string"
    if isinstance(t, str):
        return t
    if t[0] == "array":
        return f"array<{_ddl(t[1])}>"
    return "struct<" + ", ".join(f"`{n}`: {_ddl(ft)}" for n, ft in t[1]) + ">"


def infer_type(values: list[Any]) -> str:
    """The Spark DDL type that fits every one of ``values``."""
    return _ddl(_widen([_infer(v) for v in values]))


def ddl_parts(text: str) -> list[str]:
    """``text`` split at the commas outside ``<...>`` and ``(...)`` (the fields of
    a ``"name type, name type"`` list, or a map's key and value types), stripped.
    Spark's own DDL parser needs a SparkContext, which data source workers and the
    offline processor tester do not have."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _fields(ddl: str) -> list[tuple[str, str]]:
    """``[(name, type)]`` of a ``"name type, name type"`` list."""
    parts = ddl_parts(ddl)
    out = []
    for part in parts:
        name_type = part.strip().split(None, 1)
        if len(name_type) != 2:
            raise ValueError(f"cannot read {part.strip()!r} in {ddl!r} as 'name type'")
        out.append((name_type[0].strip("`").rstrip(":"), name_type[1].strip()))
    return out


#: How a data source user opts in to reading pickled stores.
PICKLE_OPTION = '.option("allowPickle", "true")'


def _open(s: dict[str, Any]) -> Any:
    """The source of the settings ``s``, its operator's state where the settings
    found it: pickled stores only with ``allowPickle``."""
    source = open_source(s["uri"], s["storage"], s["allow_pickle"], PICKLE_OPTION)
    if s["state_uri"] is not None:
        source.pin(s["operator"], s["state_uri"], s["layout"], s["key_types"])
    return source


class SessionStoreDataSource(DataSource):
    """Batch reads of sessionstore state."""

    @classmethod
    def name(cls) -> str:
        return "sessionstore"

    def _settings(self) -> dict[str, Any]:
        opts = {k.lower(): v for k, v in self.options.items()}
        timers = _flag("readRegisteredTimers", opts.get("readregisteredtimers"))
        if timers and opts.get("statevarname"):
            raise ValueError(
                "[STDS_CONFLICT_OPTIONS] The options ['readRegisteredTimers', 'stateVarName'] "
                "cannot be specified together. Please specify the one."
            )
        processor = bool(opts.get("statevarname")) or timers
        for required in ("path",) if processor else ("path", "store"):
            if not opts.get(required):
                raise ValueError(f"the sessionstore source needs .option({required!r}, ...)")
        storage = {k[len("storage.") :]: v for k, v in opts.items() if k.startswith("storage.")}
        allow_pickle = _flag("allowPickle", opts.get("allowpickle"))
        source = open_source(opts["path"], storage or None, allow_pickle, PICKLE_OPTION)
        operator = opts.get("operator")
        if not operator:
            known = source.operators()
            if len(known) != 1:
                raise ValueError(
                    f"{opts['path']} has operators {known}; pick one with .option('operator', ...)"
                )
            operator = known[0]
        source.check_pickle(operator)  # before any schema sampling or task
        store = opts.get("store") or _processor_store(source, operator)
        return {
            "uri": opts["path"],
            # the state's root, read once: every task reads the state this planning
            # listed, never the generation of a rescale that switches meanwhile
            "state_uri": source.state_uri(operator) if not source.local else None,
            # and how its rows are named: the layout and key types that state records
            "layout": source.layout(operator) if not source.local else None,
            "key_types": source.key_types(operator) if not source.local else None,
            "operator": operator,
            "store": store,
            "state_var": opts.get("statevarname"),
            "timers": timers,
            "flatten": _flag("flattenCollectionTypes", opts.get("flattencollectiontypes", "true")),
            "version": int(opts["batchid"]) if opts.get("batchid") else None,
            "partition": int(opts["partition"]) if opts.get("partition") else None,
            "key": opts.get("key"),
            "as_of": int(opts["asof"]) if opts.get("asof") else None,
            "key_schema": opts.get("keyschema"),
            "value_schema": opts.get("valueschema"),
            "raw": _flag("raw", opts.get("raw")),
            "storage": storage or None,
            "allow_pickle": allow_pickle,
        }

    def _sample(self, s: dict[str, Any]) -> list[dict[str, Any]]:
        rows = store_rows(
            _open(s), s["operator"], s["store"],
            None if s["partition"] is None else [s["partition"]], s["version"],
            RowFilter(key=s["key"], as_of=s["as_of"]), _SAMPLE, raw=s["raw"],
        )  # fmt: skip
        return list(rows)

    def schema(self) -> Any:
        s = self._settings()
        kind = store_kind(_open(s), s["operator"], s["store"])
        if kind == "processor" and (s["state_var"] or s["timers"]):
            sample = [] if s["key_schema"] else self._sample(s)  # keys named: no sampling
            return _processor_schema(s, self._key_columns(s, sample))
        if kind not in _TIME_COLUMNS:
            # a processor store mixes variables of different shapes in one store
            raise ValueError(
                f"the sessionstore data source reads a {kind} store ({s['store']!r}) by "
                f'state variable: .option("stateVarName", NAME), or its timers: '
                f'.option("readRegisteredTimers", "true")'
            )
        needs_sample = s["key_schema"] is None or s["value_schema"] is None
        sample = self._sample(s) if needs_sample else []
        columns = ["partition_id int", *self._key_columns(s, sample)]
        columns += [f"{c} bigint" for c in _row_columns(kind, sample[:1])]
        value_type = s["value_schema"]
        if value_type is None:
            value_type = infer_type([r["value"] for r in sample])
        elif " " in value_type.strip() and not value_type.strip().startswith("struct<"):
            fields = ", ".join(f"`{n}`: {t}" for n, t in _fields(value_type))
            value_type = f"struct<{fields}>"
        columns.append(f"value {value_type}")
        return ", ".join(columns)

    def _key_columns(self, s: dict[str, Any], sample: list[dict[str, Any]]) -> list[str]:
        if s["key_schema"] is not None:
            if " " not in s["key_schema"].strip():
                return [f"key {s['key_schema'].strip()}"]
            return [f"`{n}` {t}" for n, t in _fields(s["key_schema"])]
        keys = [r["key"] for r in sample]
        if keys and all(isinstance(k, tuple) for k in keys) and len({len(k) for k in keys}) == 1:
            return [f"key_{i} {infer_type([k[i] for k in keys])}" for i in range(len(keys[0]))]
        return [f"key {infer_type(keys)}"]

    def reader(self, schema: Any) -> DataSourceReader:
        s = self._settings()
        kind = store_kind(_open(s), s["operator"], s["store"])
        if kind == "processor":
            return _ProcessorReader(s, schema)
        names = [f.name for f in schema.fields]
        before_value = names[: names.index("value")] if "value" in names else names
        n = len(_COUNT_WINDOW_COLUMNS)
        finished_windows = (
            kind == "kv" and not s["raw"] and before_value[-n:] == _COUNT_WINDOW_COLUMNS
        )
        return _Reader(
            s, schema, _TIME_COLUMNS[kind] + (_COUNT_WINDOW_COLUMNS if finished_windows else [])
        )


#: What a finished count-window row adds before its value (see ``store_rows``).
_COUNT_WINDOW_COLUMNS = ["window", "count"]


def _row_columns(kind: str, sample: list[dict[str, Any]]) -> list[str]:
    """The columns of a ``kind`` store's rows between key and value: its time
    columns, and a finished count window's ``window`` and ``count``."""
    columns = list(_TIME_COLUMNS[kind])
    if sample:
        columns += [c for c in _COUNT_WINDOW_COLUMNS if c in sample[0]]
    return columns


def _flag(option: str, text: str | None) -> bool:
    """A boolean option: true or false (any case), default false."""
    if text is None or text.lower() == "false":
        return False
    if text.lower() == "true":
        return True
    raise ValueError(f"option {option!r} must be 'true' or 'false', got {text!r}")


def _converter(data_type: Any, column: str):
    """A function that makes a decoded value fit ``data_type``."""
    from pyspark.sql.types import ArrayType, DoubleType, StringType, StructType

    if isinstance(data_type, StringType):
        return _text
    if isinstance(data_type, DoubleType):
        return lambda v: None if v is None else float(v)
    if isinstance(data_type, StructType):
        parts = [(f.name, _converter(f.dataType, f"{column}.{f.name}")) for f in data_type.fields]

        def struct(v: Any) -> Any:
            if v is None:
                return None
            if not isinstance(v, dict):
                raise ValueError(f"column {column!r} is a struct, but a row holds {v!r:.80}")
            return tuple(convert(v.get(name)) for name, convert in parts)

        return struct
    if isinstance(data_type, ArrayType):
        inner = _converter(data_type.elementType, f"{column}[]")
        return lambda v: None if v is None else [inner(x) for x in v]
    return lambda v: v


class _Reader(DataSourceReader):
    def __init__(self, settings: dict[str, Any], schema: Any, time_columns: list[str]) -> None:
        self.settings = settings
        self.time_columns = time_columns
        self.columns = [f.name for f in schema.fields]
        self.converters = {f.name: _converter(f.dataType, f.name) for f in schema.fields}

    def partitions(self) -> list[InputPartition]:
        return _input_partitions(self.settings)

    def read(self, partition: InputPartition):
        s = self.settings
        rows = store_rows(
            _open(s), s["operator"], s["store"], list(partition.value),
            s["version"], RowFilter(key=s["key"], as_of=s["as_of"]), raw=s["raw"],
        )  # fmt: skip
        names = self.columns
        value_at = names.index("value")
        # the schema is partition_id, key fields, the row's time columns, value
        time_columns = self.time_columns
        key_columns = names[1 : value_at - len(time_columns)]
        convert = self.converters
        for row in rows:
            key = row["key"]
            parts = list(key) if len(key_columns) > 1 else [key]
            if len(parts) != len(key_columns):
                raise ValueError(
                    f"key {key!r} has {len(parts)} fields, the schema {len(key_columns)}"
                )
            yield (
                row["partition"],
                *[convert[c](v) for c, v in zip(key_columns, parts, strict=True)],
                *[row[c] for c in time_columns],
                convert["value"](row["value"]),
            )


def _input_partitions(s: dict[str, Any]) -> list[InputPartition]:
    """One Spark partition per database of the state: the state partitions it
    holds (one, or a slab's: sessionstore.checkpoint.partition.identity); the one
    partition the ``partition`` option names."""
    if s["partition"] is not None:
        return [InputPartition([s["partition"]])]
    source = _open(s)
    layout = source.layout(s["operator"])
    if layout is None or layout[0] == layout[1]:
        return [InputPartition([p]) for p in source.partitions(s["operator"])]
    slabs, count = layout
    return [InputPartition(list(range(slab, count, slabs))) for slab in range(slabs)]


def _processor_store(source: Any, operator: str) -> str:
    """The only processor store of ``operator`` (``store`` may then be left out)."""
    names = [n for n, r in source.store_records(operator).items() if r.get("kind") == "processor"]
    if len(names) != 1:
        raise ValueError(
            f"operator {operator!r} has processor stores {names}; pick one with "
            ".option('store', ...)"
        )
    return names[0]


def _processor_schema(s: dict[str, Any], key_columns: list[str]) -> str:
    """Spark's ``statestore`` layout of a transformWithState variable (or of the
    timers, ``readRegisteredTimers``) as DDL: ``key`` (a struct of the grouping
    key: ``keySchema``, else inferred), the variable's columns
    (:mod:`sessionstore.tools.processor_rows`) typed by its recorded schemas (a
    value of a TTL variable wrapped as ``struct<value, ttlExpirationMs>``), then
    ``partition_id``. (DDL: a data source's ``schema`` runs where no SparkContext
    parses DDL, and Spark parses what it returns.)"""
    from pyspark.sql.types import StructType

    columns = [("key", f"struct<{', '.join(key_columns)}>")]
    if s["timers"]:
        columns.append(("expiration_timestamp_ms", "bigint"))
    else:
        record = _declared(s)
        value = _ddl_type(StructType.fromJson(record["value_schema"]))
        if record["ttl"]:
            value = f"struct<value: {value}, {TTL_FIELD}: bigint>"
        kind, flat = record["kind"], s["flatten"]
        if kind == "value":
            columns.append(("value", value))
        elif kind == "list":
            columns.append(("list_element", value) if flat else ("list_value", f"array<{value}>"))
        else:
            user_key = _ddl_type(StructType.fromJson(record["key_schema"]))
            if flat:
                columns += [("user_map_key", user_key), ("user_map_value", value)]
            else:
                columns.append(("map_value", f"map<{user_key}, {value}>"))
    return ", ".join(f"`{name}` {t}" for name, t in [*columns, ("partition_id", "int")])


def _ddl_type(data_type: Any) -> str:
    """Spark DDL of a PySpark type (field names quoted)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, StructType):
        fields = ", ".join(f"`{f.name}`: {_ddl_type(f.dataType)}" for f in data_type.fields)
        return f"struct<{fields}>"
    if isinstance(data_type, ArrayType):
        return f"array<{_ddl_type(data_type.elementType)}>"
    if isinstance(data_type, MapType):
        return f"map<{_ddl_type(data_type.keyType)}, {_ddl_type(data_type.valueType)}>"
    return data_type.simpleString()


def _declared(s: dict[str, Any]) -> dict[str, Any]:
    """The recorded declaration of the variable ``stateVarName`` with ``ttl``
    (:func:`~sessionstore.tools.reader.variable_declaration`)."""
    record = variable_declaration(_open(s), s["operator"], s["store"], s["state_var"], s["version"])
    if record.get("value_schema") is None or (
        record["kind"] == "map" and record.get("key_schema") is None
    ):
        raise ValueError(
            f"state variable {s['state_var']!r} was declared without a parsed schema: "
            "its values have no types to read them by (dump it with the CLI)"
        )
    return record


def _spark_value(value: Any) -> Any:
    """A value of :mod:`sessionstore.tools.processor_rows` as a row field: a TTL
    variable's ``{"value", "ttlExpirationMs"}`` as a struct."""
    return (value["value"], value[TTL_FIELD]) if isinstance(value, dict) else value


class _ProcessorReader(DataSourceReader):
    """Rows of one state variable, or of the timers, of a processor store
    (:mod:`sessionstore.tools.processor_rows`), in the schema's column order."""

    def __init__(self, settings: dict[str, Any], schema: Any) -> None:
        self.settings = settings
        self.columns = [f.name for f in schema.fields]
        self.record = None if settings["timers"] else _declared(settings)

    def partitions(self) -> list[InputPartition]:
        return _input_partitions(self.settings)

    def read(self, partition: InputPartition):
        s, record = self.settings, self.record
        rows = store_rows(
            _open(s), s["operator"], s["store"], list(partition.value), s["version"],
            RowFilter(key=s["key"]),
        )  # fmt: skip
        if record is None:
            rows = timer_rows(rows)
        else:
            rows = variable_rows(rows, s["state_var"], record["kind"], record["ttl"], s["flatten"])
        for row in rows:
            key = row["key"]
            out = [key if isinstance(key, tuple) else (key,)]
            for column in self.columns[1:-1]:
                v = row[column]
                if column == "list_value":
                    v = [_spark_value(x) for x in v]
                elif column == "map_value":
                    v = {k: _spark_value(x) for k, x in v}
                else:
                    v = _spark_value(v)
                out.append(v)
            yield (*out, row["partition"])


def register(spark: Any) -> None:
    """Make ``spark.read.format("sessionstore")`` available in this session."""
    spark.dataSource.register(SessionStoreDataSource)
