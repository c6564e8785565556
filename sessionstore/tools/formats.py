"""The formats ``sessionstore dump`` and ``get`` write rows in: JSON lines, CSV, a
table and Parquet.

Rows come as chunks (:mod:`sessionstore.tools.row_chunks`) and JSON lines, CSV and
Parquet are written a chunk at a time, each column of a chunk turned into text or
an Arrow array in one pass. What is written is what writing each row on its own
writes, byte for byte: a JSON line is ``json.dumps(row, default=str)`` with bytes
as text (UTF-8, undecodable bytes as escapes); CSV and Parquet have keys, values
and aggregates as text (JSON unless a string) and one column per aggregate of an
aggregating operator's value; the table shows every row (widths need them all).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from itertools import repeat
from json.encoder import c_make_encoder, encode_basestring_ascii
from typing import Any, TextIO

from sessionstore.tools.reader import Aggregates, Instant
from sessionstore.tools.row_chunks import RowChunk, chunks_of, rows_of

__all__ = ["write_chunks", "PARQUET_GROUP_ROWS"]

#: ``json.dumps(value, default=str)``, one encoder for every row (``dumps`` with an
#: argument builds a new one per call: a tenth of a dump's time)
_JSON = json.JSONEncoder(default=str)

#: Rows per Parquet row group: memory stays flat for any store size.
PARQUET_GROUP_ROWS = 65536


def write_chunks(
    chunks: Iterator[RowChunk],
    fmt: str,
    out: TextIO | None,
    output: str | None,
    times: tuple[str, ...] = (),
) -> int:
    """The rows of ``chunks`` in ``fmt`` (``jsonl``, ``csv``, ``table`` or
    ``parquet``) to ``out`` (None: stdout), or for Parquet to the file ``output``;
    ``times``: the columns that are event times (timestamps in Parquet where the
    reader marked them :class:`Instant`). Returns the number of rows."""
    if fmt == "parquet":
        return _write_parquet(chunks, output, times)
    target = out or sys.stdout
    if fmt == "jsonl":
        return _write_json(chunks, target)
    if fmt == "csv":
        return _write_csv(chunks, target)
    from rich.console import Console
    from rich.table import Table

    materialised = [_columns(row) for row in rows_of(chunks)]  # widths need every row
    table = Table()
    for column in materialised[0] if materialised else ["partition", "key", "value"]:
        table.add_column(column)
    for row in materialised:
        table.add_row(*(str(_jsonable(v)) for v in row.values()))
    Console(width=200, file=out).print(table)
    return len(materialised)


# ----------------------------------------------------------------- JSON lines
def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, tuple):
        return list(value)
    return value


def _write_json(chunks: Iterator[RowChunk], out: TextIO) -> int:
    """JSON lines, a chunk per write."""
    total = 0
    for chunk in chunks:
        try:
            text = _json_lines(chunk)
        except Exception:  # row by row: the lines before a row that fails, then its error
            for row in chunk.rows():
                out.write(_json_line(row))
        else:
            out.write(text)
        total += chunk.size
    return total


def _json_line(row: dict[str, Any]) -> str:
    return _JSON.encode({k: _jsonable(v) for k, v in row.items()}) + "\n"


def _json_lines(chunk: RowChunk) -> str:
    """The rows of ``chunk`` as JSON lines, each ``"\\n"``-terminated: each
    column's values turned into JSON text, then the lines joined from them."""
    if not chunk.names:
        return "{}\n" * chunk.size
    if any(type(name) is not str for name in chunk.names):  # a row encodes them
        return "".join(map(_json_line, chunk.rows()))
    texts = [_json_texts(column) for column in chunk.columns]
    return _objects(chunk.names, texts, "}\n")


def _objects(names: tuple[str, ...], texts: list[list[str]], end: str) -> str:
    """JSON objects, one per row, of the fields ``names`` (str) whose values'
    texts are ``texts`` (a list per field), each closed by ``end``: the texts
    interleaved with the fixed parts (``{"name": ``, ``, "name": ``) in one list,
    joined once (cheaper than formatting a row at a time)."""
    fixed = [
        ("{" if i == 0 else ", ") + encode_basestring_ascii(name) + ": "
        for i, name in enumerate(names)
    ]
    rows, step = len(texts[0]), 2 * len(names) + 1
    parts: list[str | None] = [None] * (rows * step)
    for i, (head, column) in enumerate(zip(fixed, texts, strict=True)):
        parts[2 * i :: step] = [head] * rows
        parts[2 * i + 1 :: step] = column
    parts[step - 1 :: step] = [end] * rows
    return "".join(parts)


def _json_texts(values: list[Any], depth: int = 0) -> list[str]:
    """``_JSON.encode(_jsonable(value))`` of each of ``values``, a row's fields:
    the value's text in a JSON line (a row's encoding is its values' texts, in
    order); at ``depth`` > 0, values inside dicts, ``_JSON.encode(value)``. Columns
    of one plain type are turned into text together; so are dicts that all have
    the same keys (an aggregating operator's values), a column per key, down to
    :data:`_DICT_DEPTH`; anything else goes through the JSON encoder value by value."""
    kinds = set(map(type, values))
    if kinds <= {str}:
        return list(map(encode_basestring_ascii, values))
    if all(kind is _NONE or (issubclass(kind, int) and kind is not bool) for kind in kinds):
        # int's repr is its JSON, as the encoder writes it for any int but a bool
        if _NONE in kinds:
            return ["null" if v is None else int.__repr__(v) for v in values]
        if values.count(values[0]) == len(values):  # one number (a partition)
            return [int.__repr__(values[0])] * len(values)
        return list(map(int.__repr__, values))
    if depth < _DICT_DEPTH and kinds <= {dict, Aggregates} and values:
        texts = _dict_texts(values, depth)
        if texts is not None:
            return texts
    if depth == 0 and any(issubclass(kind, bytes) for kind in kinds):
        values = list(map(_jsonable, values))  # a row's own bytes show as text, nested ones not
    encode = _encoder()
    if encode is None:
        return list(map(_JSON.encode, values))
    return list(map("".join, map(encode, values, repeat(0))))


_NONE = type(None)
#: How deep dicts of dicts are turned into text a column per key.
_DICT_DEPTH = 2


def _dict_texts(values: list[dict[str, Any]], depth: int) -> list[str] | None:
    """The JSON of ``values``, dicts, where all have the same str keys in the same
    order (the encoder writes a dict's items in order): each key's values turned
    into text as a column; None where they differ."""
    shapes = set(map(tuple, values))
    if len(shapes) != 1:
        return None
    (keys,) = shapes
    if any(type(key) is not str for key in keys):
        return None
    if not keys:
        return ["{}"] * len(values)
    columns = [_json_texts([value[key] for value in values], depth + 1) for key in keys]
    return _objects(keys, columns, "}\n").split("\n")[:-1]  # texts hold no raw newline


def _encoder() -> Any:
    """The C encoder ``_JSON.encode`` builds for each call (``json.encoder``), built
    once for many values; None where there is none (an interpreter without it)."""
    if c_make_encoder is None:
        return None
    try:
        return c_make_encoder(
            {}, _JSON.default, encode_basestring_ascii, _JSON.indent, _JSON.key_separator,
            _JSON.item_separator, _JSON.sort_keys, _JSON.skipkeys, _JSON.allow_nan,
        )  # fmt: skip
    except TypeError:  # another interpreter's arguments
        return None


# ------------------------------------------------------------------ flat rows
def _columns(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its :class:`Aggregates` value spread into one column per aggregate
    (named ``value.<name>`` where the name is taken by another column)."""
    value = row.get("value")
    if not isinstance(value, Aggregates):
        return row
    out = {k: v for k, v in row.items() if k != "value"}
    for name, result in value.items():
        out[f"value.{name}" if name in row else name] = result
    return out


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """A row for csv and parquet: keys, values and aggregates as text (JSON unless a
    string); the other columns (partition, times, offsets) are integers."""
    columns = _columns(row)
    text = {k for k in columns if k not in row} | {"key", "value"}  # aggregates, key, value
    return {k: _as_text(v) if k in text and v is not None else v for k, v in columns.items()}


def _as_text(value: Any) -> str:
    """Keys and values as text for flat formats: strings as they are, others JSON."""
    return value if isinstance(value, str) else _JSON.encode(_jsonable(value))


def _flat_chunks(chunk: RowChunk) -> Iterator[RowChunk]:
    """:func:`_flat` of the rows of ``chunk``: a column at a time, unless a value
    is :class:`Aggregates` (spread row by row)."""
    values = chunk.column("value")
    if values is not None and any(map(isinstance, values, repeat(Aggregates))):
        yield from chunks_of(map(_flat, chunk.rows()), chunk.size)
        return
    for name in ("key", "value"):
        column = chunk.column(name)
        if column is not None:
            chunk = chunk.replace(name, _texts(column))
    yield chunk


def _texts(values: list[Any]) -> list[Any]:
    """:func:`_as_text` of each of ``values`` but None (which stays None)."""
    kinds = set(map(type, values))
    if not any(issubclass(kind, str) or kind is _NONE for kind in kinds):
        return _json_texts(values)
    if kinds <= {str, _NONE}:
        return values
    others = iter(_json_texts([v for v in values if v is not None and not isinstance(v, str)]))
    return [v if v is None or isinstance(v, str) else next(others) for v in values]


# ------------------------------------------------------------------------ CSV
def _write_csv(chunks: Iterator[RowChunk], out: TextIO) -> int:
    """CSV with a header of the first row's columns; a row of other columns is
    refused or padded as ``csv.DictWriter`` does."""
    import csv

    header, plain, total = None, csv.writer(out), 0
    for chunk in chunks:
        total += chunk.size
        try:
            flats: Iterator[RowChunk] = iter(list(_flat_chunks(chunk)))
        except Exception:  # row by row: the rows before a row that fails, then its error
            flats = chunks_of(map(_flat, chunk.rows()))
        for flat in flats:
            if header is None:
                header = csv.DictWriter(out, fieldnames=list(flat.names))
                header.writeheader()
            if flat.names == tuple(header.fieldnames):
                plain.writerows(zip(*flat.columns, strict=True))
            else:
                header.writerows(flat.rows())
    return total


# -------------------------------------------------------------------- Parquet
def _write_parquet(
    chunks: Iterator[RowChunk], output: str, times: tuple[str, ...] = (),
    group: int = PARQUET_GROUP_ROWS,
) -> int:  # fmt: skip
    """Row groups of ``group`` rows, so memory stays flat for any store size;
    ``times``: the event-time columns (see :func:`_parquet_schema`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer, total, stored, flat, pending = None, 0, [], [], 0
    try:
        for chunk in chunks:
            total, pending = total + chunk.size, pending + chunk.size
            if writer is None:
                stored.append(chunk)  # the first row group's rows choose the schema
            flat.extend(_flat_chunks(chunk))
            while pending >= group:
                rows, flat = _split(flat, group)
                if writer is None:
                    schema = _parquet_schema(_split(stored, group)[0], rows, times)
                    writer, stored = pq.ParquetWriter(output, schema), []
                _write_group(writer, rows)
                del rows  # the group's objects go before the next group's come
                pending -= group
        if pending:
            if writer is None:
                writer = pq.ParquetWriter(output, _parquet_schema(stored, flat, times))
            _write_group(writer, flat)
        elif writer is None:
            empty = pa.schema([("partition", pa.int64()), ("key", pa.string()),
                               ("value", pa.string())])  # fmt: skip
            pq.write_table(empty.empty_table(), output)
    finally:
        if writer is not None:
            writer.close()
    return total


def _split(chunks: list[RowChunk], rows: int) -> tuple[list[RowChunk], list[RowChunk]]:
    """The first ``rows`` rows of ``chunks`` (which hold that many), and the rest."""
    head: list[RowChunk] = []
    for i, chunk in enumerate(chunks):
        if chunk.size >= rows:
            head.append(chunk.slice(0, rows))
            rest = [chunk.slice(rows, chunk.size)] if chunk.size > rows else []
            return head, rest + chunks[i + 1 :]
        head.append(chunk)
        rows -= chunk.size
    return head, []


def _parquet_schema(stored: list[RowChunk], flat: list[RowChunk], times: tuple[str, ...]) -> Any:
    """The file's schema, by the first row group: ``stored``, its rows as read, and
    ``flat``, as written. A row's own columns are integers, except the key (and a
    processor store's state variable name), and event times of an operator whose
    input time was a timestamp, which are timestamps (UTC, milliseconds): when a
    time of the row group is an :class:`Instant` (the store's operator records that
    its times are timestamps), so that a column whose first values are all null (a
    version's open ``valid_to``) gets the type of its siblings. Everything else
    (keys, values, aggregates) is text."""
    import pyarrow as pa

    ints = {n for n in stored[0].names if n not in ("key", "value", "state")}
    stamped = any(
        isinstance(v, Instant) for chunk in stored for n in times for v in chunk.column(n) or ()
    )
    instants = set(times) & ints if stamped else set()
    instant = pa.timestamp("ms", tz="UTC")
    return pa.schema(
        [
            (n, instant if n in instants else pa.int64() if n in ints else pa.string())
            for n in flat[0].names
        ]
    )


def _write_group(writer: Any, chunks: list[RowChunk]) -> None:
    """One row group of the rows of ``chunks``: each field's values of every row
    (None where a row lacks it), as ``Table.from_pylist`` gathers and converts
    them, field by field (each field's values are let go once in Arrow)."""
    import pyarrow as pa

    arrays = []
    for field in writer.schema:
        values: list[Any] = []
        for chunk in chunks:
            column = chunk.column(field.name)
            values.extend([None] * chunk.size if column is None else column)
        arrays.append(pa.array(values, type=field.type))
    writer.write_table(pa.Table.from_arrays(arrays, schema=writer.schema))
