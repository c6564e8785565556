"""Rows as columns: a reader's rows a few thousand at a time, one list per field.

A dump of a large store handles millions of rows, and a dict per row passing
through every step (reading, the partition, progress, formatting) costs several
times what reading a row does. A :class:`RowChunk` holds consecutive rows of one
shape (the same fields in the same order) as a list per field, so each step works
on a few thousand rows per call. Its :meth:`RowChunk.rows` are the dicts the rows
would have been: ``chunks_of`` and ``rows_of`` turn one form into the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import Any

__all__ = ["CHUNK_ROWS", "RowChunk", "chunks_of", "rows_of", "limited"]

#: Rows per chunk: enough that per-chunk work vanishes, few enough that a chunk's
#: rows take little memory. Read when a read or a write starts (a size left
#: unsaid), so that a test can cross chunk boundaries with a few hundred rows.
CHUNK_ROWS = 4096


@dataclass(frozen=True, slots=True)
class RowChunk:
    """``size`` rows, each with the fields ``names`` (in that order): the values
    of field ``names[i]`` are ``columns[i]``, one per row."""

    names: tuple[str, ...]
    columns: tuple[list[Any], ...]
    size: int

    @classmethod
    def of_columns(cls, columns: dict[str, list[Any]]) -> RowChunk:
        """The rows of ``{field: values}`` (equal lengths, at least one field)."""
        values = tuple(columns.values())
        return cls(tuple(columns), values, len(values[0]))

    def rows(self) -> Iterator[dict[str, Any]]:
        """Each row as a dict, fields in order."""
        if not self.names:
            return ({} for _ in range(self.size))
        return map(
            dict, map(partial(zip, self.names, strict=True), zip(*self.columns, strict=True))
        )

    def column(self, name: str) -> list[Any] | None:
        """The values of field ``name``, or None if the rows have no such field."""
        return self.columns[self.names.index(name)] if name in self.names else None

    def replace(self, name: str, values: list[Any]) -> RowChunk:
        """The rows with field ``name`` (which they have) holding ``values``."""
        at = self.names.index(name)
        return RowChunk(
            self.names, (*self.columns[:at], values, *self.columns[at + 1 :]), self.size
        )

    def with_first(self, name: str, values: list[Any]) -> RowChunk:
        """``{name: value, **row}`` of each row: field ``name`` first, unless the
        rows have one already, which then keeps its values (and moves first)."""
        if name in self.names:
            at = self.names.index(name)
            names = (name, *self.names[:at], *self.names[at + 1 :])
            columns = (self.columns[at], *self.columns[:at], *self.columns[at + 1 :])
            return RowChunk(names, columns, self.size)
        return RowChunk((name, *self.names), (values, *self.columns), self.size)

    def take(self, rows: list[int]) -> RowChunk:
        """The rows at the positions ``rows``, in that order."""
        return RowChunk(self.names, tuple([c[i] for i in rows] for c in self.columns), len(rows))

    def slice(self, start: int, stop: int) -> RowChunk:
        """The rows ``start`` to ``stop`` (exclusive; within the chunk)."""
        stop = min(stop, self.size)
        return RowChunk(self.names, tuple(c[start:stop] for c in self.columns), stop - start)


def chunks_of(rows: Iterable[dict[str, Any]], size: int | None = None) -> Iterator[RowChunk]:
    """``rows`` as chunks of at most ``size`` (None: :data:`CHUNK_ROWS`) consecutive
    rows of one shape. Where ``rows`` raises, the rows before the error come first
    (as a chunk), then the error: what a row-by-row consumer would have seen."""
    size = size or CHUNK_ROWS
    names: tuple[str, ...] | None = None
    buffered: list[dict[str, Any]] = []
    try:
        for row in rows:
            shape = tuple(row)
            if shape != names or len(buffered) == size:
                if buffered:
                    yield _chunk(names, buffered)
                names, buffered = shape, []
            buffered.append(row)
    except Exception:
        if buffered:
            yield _chunk(names, buffered)
        raise
    if buffered:
        yield _chunk(names, buffered)


def _chunk(names: tuple[str, ...], rows: list[dict[str, Any]]) -> RowChunk:
    return RowChunk(names, tuple([row[n] for row in rows] for n in names), len(rows))


def rows_of(chunks: Iterable[RowChunk]) -> Iterator[dict[str, Any]]:
    """The rows of ``chunks``, one dict each."""
    for chunk in chunks:
        yield from chunk.rows()


def limited(chunks: Iterator[RowChunk], limit: int) -> Iterator[RowChunk]:
    """The first ``limit`` rows of ``chunks``; no chunk is asked for once they are
    given (as ``islice`` of rows, whose refusals it keeps)."""
    islice((), limit)  # a limit islice refuses is refused here, with its words
    left = limit
    while left > 0:
        chunk = next(chunks, None)
        if chunk is None:
            return
        if chunk.size >= left:
            yield chunk.slice(0, left)
            return
        left -= chunk.size
        yield chunk
