"""Several streaming queries of one test driven side by side in one SparkSession.

A test that compares runs (an uninterrupted reference and a run stopped and
restarted, ours and Spark's own operator, two partition counts) need not wait out
each run's micro-batches in turn: :class:`Streams` starts them together and drives
them in lockstep. At each step every running query gets its own next file, then
each is waited for, so the queries' waits overlap. Each query keeps its own source folder, checkpoint and output, and still
gets one file per micro-batch and processes it before its next file, exactly as
:func:`tests.spark.streams.run_stream` drives a lone query.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

Step = Callable[[], None]


class Streams:
    """Queries started by key, stepped together, and their rows per micro-batch.

    Use as a context manager: every query still running is stopped on leaving
    (also on an error)."""

    def __init__(self) -> None:
        self._queries: dict[Hashable, Any] = {}
        self._batches: dict[Hashable, list[list[dict]]] = {}

    def start(self, key: Hashable, out: Any, checkpoint: Path, mode: str = "append") -> None:
        """Start ``out`` in output ``mode`` on ``checkpoint``; its rows of each
        micro-batch are appended to :meth:`batches` of ``key`` (kept across a
        restart under the same key)."""
        assert key not in self._queries, f"query {key!r} is already running"
        collected = self._batches.setdefault(key, [])
        self._queries[key] = (
            out.writeStream.outputMode(mode)
            .option("checkpointLocation", str(checkpoint))
            .foreachBatch(lambda batch, _: collected.append([r.asDict() for r in batch.collect()]))
            .start()
        )

    def start_run(
        self, key: Hashable, run: tuple[Any, Path, Sequence[Step]], mode: str = "append"
    ) -> Sequence[Step]:
        """:meth:`start` the query of ``run`` (query, checkpoint, steps); its steps."""
        out, checkpoint, steps = run
        self.start(key, out, checkpoint, mode)
        return steps

    def step(self, writes: Mapping[Hashable, Step]) -> None:
        """Run each query's write (its next file), then let each of those queries
        process what it was given."""
        for write in writes.values():
            write()
        for key in writes:
            self._queries[key].processAllAvailable()

    def drive(self, steps: Mapping[Hashable, Sequence[Step]]) -> None:
        """Run each query's steps in lockstep (:meth:`step` by step index); a query
        with fewer steps sits out the later ones."""
        for i in range(max(map(len, steps.values()), default=0)):
            self.step({key: each[i] for key, each in steps.items() if i < len(each)})

    def stop(self, key: Hashable) -> None:
        """Stop the query of ``key`` (a later :meth:`start` may restart it)."""
        self._queries.pop(key).stop()

    def batches(self, key: Hashable) -> list[list[dict]]:
        """The rows of each micro-batch the query of ``key`` emitted."""
        return self._batches[key]

    def rows(self, key: Hashable) -> list[dict]:
        """Every row the query of ``key`` emitted."""
        return [row for rows in self._batches[key] for row in rows]

    def __enter__(self) -> Streams:
        return self

    def __exit__(self, *exc: object) -> None:
        while self._queries:
            _, query = self._queries.popitem()
            query.stop()


def run_together(
    runs: Mapping[Hashable, tuple[Any, Path, Sequence[Step]]], mode: str = "append"
) -> dict[Hashable, list[list[dict]]]:
    """Start every ``(out, checkpoint, steps)`` of ``runs``, drive them in lockstep
    to their last step and stop them: the rows of each micro-batch, by key."""
    with Streams() as streams:
        for key, (out, checkpoint, _) in runs.items():
            streams.start(key, out, checkpoint, mode)
        streams.drive({key: steps for key, (_, _, steps) in runs.items()})
        return {key: streams.batches(key) for key in runs}


def flat(batches: list[list[dict]]) -> list[dict]:
    """Every row of ``batches`` (as :func:`tests.spark.streams.run_stream` returns them)."""
    return [row for rows in batches for row in rows]
