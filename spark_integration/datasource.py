"""``spark.read.format("sessionstore")``: a store of a checkpoint as a DataFrame.

Options: ``path`` (checkpoint root URI), ``operator``, ``store`` (required);
``batchId`` (the version to read: the state after that many batches; default the
latest), ``partition``, ``key`` and ``asOf`` (versioned stores), and
``storage.<option>`` for ``pyarrow.fs``. One Spark partition reads one state
partition, restored from the checkpoint into a temporary directory.

Columns: ``partition_id``, ``key`` (a string; JSON for non-string keys), then
``start``/``end`` (session and window stores), ``valid_from``/``valid_to``
(versioned), ``timestamp``/``offset`` (message stores), and ``value`` (JSON).
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from sessionstore.checkpoint.filesystem import open_filesystem
from sessionstore.inspect import partitions, store_kind, store_rows

__all__ = ["SessionStoreDataSource", "register"]

_COLUMNS = {
    "session": "start long, end long",
    "window": "start long, end long",
    "messages": "timestamp long, offset long",
    "versioned": "valid_from long, valid_to long",
    "kv": "",
}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return json.dumps(value, default=str)


class SessionStoreDataSource(DataSource):
    """Batch reads of sessionstore state."""

    @classmethod
    def name(cls) -> str:
        return "sessionstore"

    def _settings(self) -> dict[str, Any]:
        opts = {k.lower(): v for k, v in self.options.items()}
        for required in ("path", "operator", "store"):
            if not opts.get(required):
                raise ValueError(f"the sessionstore source needs .option({required!r}, ...)")
        storage = {k[len("storage.") :]: v for k, v in opts.items() if k.startswith("storage.")}
        return {
            "uri": opts["path"],
            "operator": opts["operator"],
            "store": opts["store"],
            "version": int(opts["batchid"]) if opts.get("batchid") else None,
            "partition": int(opts["partition"]) if opts.get("partition") else None,
            "key": opts.get("key"),
            "as_of": int(opts["asof"]) if opts.get("asof") else None,
            "storage": storage or None,
        }

    def schema(self) -> str:
        s = self._settings()
        kind = store_kind(open_filesystem(s["uri"], s["storage"]), s["operator"], s["store"])
        middle = _COLUMNS[kind]
        return f"partition_id int, key string, {middle + ', ' if middle else ''}value string"

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader(self._settings(), [f.name for f in schema.fields])


class _Reader(DataSourceReader):
    def __init__(self, settings: dict[str, Any], columns: list[str]) -> None:
        self.settings, self.columns = settings, columns

    def partitions(self) -> list[InputPartition]:
        s = self.settings
        if s["partition"] is not None:
            return [InputPartition(s["partition"])]
        root = open_filesystem(s["uri"], s["storage"])
        return [InputPartition(p) for p in partitions(root, s["operator"])]

    def read(self, partition: InputPartition):
        s = self.settings
        rows = store_rows(
            s["uri"], s["operator"], s["store"], [partition.value], s["version"], s["key"],
            s["as_of"], None, s["storage"],
        )  # fmt: skip
        for row in rows:
            out = []
            for column in self.columns:
                if column == "partition_id":
                    out.append(row["partition"])
                elif column in ("key", "value"):
                    out.append(_text(row[column]))
                else:
                    out.append(row.get(column))
            yield tuple(out)


def register(spark: Any) -> None:
    """Make ``spark.read.format("sessionstore")`` available in this session."""
    spark.dataSource.register(SessionStoreDataSource)
