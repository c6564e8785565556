"""The queries that tests/spark/test_connect.py runs on a classic and on a Spark
Connect session: each case takes a SparkSession of either kind and a fresh folder,
and returns its result as JSON-able data (columns, rows in a stable order).

A Python process holds one kind of session: PySpark switches the whole process to
Connect mode (``pyspark.sql.functions`` then builds Connect columns) and
``builder.remote`` refuses while a classic SparkContext exists. So the test runs the
classic side in its own process and the Connect side in this module run as a client
process::

    python -m tests.spark.connect_cases sc://127.0.0.1:PORT OUT.json

which writes ``{case: {"result": ..., "error": traceback or None}}`` plus the lines
the ``spark_integration`` loggers printed (``"log"``).
"""

from __future__ import annotations

import json
import logging
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.spark.streams import drive, json_source, without_due_batches, write_json
from tests.spark.test_sessionize import generated, rows_of

EVENTS = "user string, ts long, amount long"
ITEMS = "id string, item string, ts long"


def _ordered(rows: list[Any], columns: list[str]) -> list[list[Any]]:
    plain = [row.asDict(recursive=True) for row in rows]
    values = [[row[c] for c in columns] for row in plain]
    return sorted(values, key=json.dumps)


def _run_memory(spark: Any, out: Any, folder: Path, steps: list[Callable[[], None]]) -> dict:
    """Run ``out`` into a memory table (a sink both kinds of session read back),
    one step (one input file) per micro-batch; its columns and ordered rows."""
    name = f"q{random.Random().randrange(10**9)}"
    query = (
        out.writeStream.format("memory")
        .queryName(name)
        .outputMode("append")
        .option("checkpointLocation", str(folder / "spark-ckpt"))
        .start()
    )
    drive(query, steps)
    rows = spark.table(name).collect()
    return {"columns": out.columns, "rows": _ordered(rows, out.columns)}


def _events(seed: int) -> list[list[dict]]:
    """Three micro-batches of events of six users, some out of order, then two
    far-future events that close every session and window."""
    return [rows_of(rows) for rows in generated(seed, batches=3, per_batch=25)]


def _one_stream(
    spark: Any, folder: Path, batches: list[list[dict]], build: Callable, schema: str = EVENTS
) -> dict:
    source = folder / "in"
    out = build(json_source(spark, source, schema))
    steps = [lambda i=i, rows=rows: write_json(source, i, rows) for i, rows in enumerate(batches)]
    return _run_memory(spark, out, folder, steps)


def _backend(folder: Path) -> Any:
    from spark_integration import StateBackend

    return StateBackend(f"file://{folder}/state", local_dir=str(folder / "local"))


#: ``sessionize_case``'s arguments (its ``backend`` apart)
SESSIONS = {
    "key": "user", "timestamp": "ts", "gap": "5 seconds",
    "aggregations": {"n": "count", "spent": ("sum", "amount"), "entry": ("first", "amount")},
}  # fmt: skip


def bootstrap_case(spark: Any, folder: Path) -> dict:
    """``bootstrap_sessionize`` from the first batch of ``sessionize_case``'s
    events, then the query on the rest: its output (equal to ``sessionize_case``'s)
    and what the bootstrap returned."""
    from spark_integration import bootstrap_sessionize, sessionize

    batches = _events(1)
    history = spark.createDataFrame(batches[0], EVENTS)
    done = bootstrap_sessionize(history, **SESSIONS, backend=_backend(folder))
    with without_due_batches(spark):
        output = _one_stream(
            spark, folder, batches[1:],
            lambda stream: sessionize(stream, **SESSIONS, backend=_backend(folder)),
        )  # fmt: skip
    return {"output": output, "done": done}


def sessionize_case(spark: Any, folder: Path) -> dict:
    """A sessionize query with ``log_state_metrics`` on (its ``output`` and the
    ``metrics`` lines up to the first timing, which varies from run to run), then
    its state through ``spark.read.format("sessionstore")`` (``datasource``) and
    ``repartition_state`` on it (its row count, or the error it raises), then
    ``rewrite_state`` doubling ``n`` (its counts, the latest rows before and after)."""
    from spark_integration import log_state_metrics, sessionize

    def build(stream):
        return sessionize(stream, **SESSIONS, backend=_backend(folder))

    lines: list[str] = []
    # the listener hears every query of the session, and an earlier case's query
    # can report its last batch after it ended: keep this operator's lines
    # (sessionize's default name)
    listener = log_state_metrics(
        spark,
        out=lambda line: lines.append(line) if line.startswith("sessionstore sessionize ") else None,
    )
    try:
        with without_due_batches(spark):  # a metrics line per file's batch
            output = _one_stream(spark, folder, _events(1), build)
        wanted, deadline = len(_events(1)), time.monotonic() + 30
        while len(lines) < wanted and time.monotonic() < deadline:
            time.sleep(0.2)  # listeners hear of a batch after it ends
    finally:
        spark.streams.removeListener(listener)
    return {
        "output": output,
        "metrics": sorted(line.split(", load max")[0] for line in lines),
        "datasource": _read_state(spark, folder),
        "repartition_state": _repartition(spark, folder),
        "rewrite_state": _rewrite(spark, folder),
    }


def window_aggregate_case(spark: Any, folder: Path) -> dict:
    from spark_integration import window_aggregate

    def build(stream):
        return window_aggregate(
            stream, key="user", timestamp="ts", size="10 seconds", advance="5 seconds",
            grace="2 seconds", aggregations={"n": "count", "spent": ("sum", "amount")},
            backend=_backend(folder),
        )  # fmt: skip

    return _one_stream(spark, folder, _events(2), build)


def _two_streams(
    spark: Any, folder: Path, schemas: tuple[str, str], batches: list, build: Callable
) -> dict:
    left_src, right_src = folder / "left", folder / "right"
    left = json_source(spark, left_src, schemas[0])
    right = json_source(spark, right_src, schemas[1])
    out = build(left, right)

    # The right side (temporal_join's table) goes first, and the query takes it
    # before the left file is written: Spark asks the two file sources for their
    # offsets one after the other, so with both files written at once a batch
    # could see the left file and not the right one, and join older rates.
    steps = [
        lambda i=i, rows=rows, src=src: write_json(src, i, rows)
        for i, (lefts, rights) in enumerate(batches)
        for src, rows in ((right_src, rights), (left_src, lefts))
    ]
    return _run_memory(spark, out, folder, steps)


def temporal_join_case(spark: Any, folder: Path) -> dict:
    from spark_integration import temporal_join

    rng = random.Random(4)
    batches = [
        (
            [
                {
                    "currency": rng.choice("ABCD"),
                    "ts": b * 100 + rng.randrange(100),
                    "amount": rng.randrange(100),
                }
                for _ in range(10)
            ],
            [
                {
                    "currency": rng.choice("ABC"),
                    "rate_ts": b * 100 + rng.randrange(100),
                    "rate": rng.randrange(1, 9),
                }
                for _ in range(6)
            ],
        )  # fmt: skip
        for b in range(3)
    ]

    def build(stream, table):
        return temporal_join(
            stream, table, key="currency", stream_timestamp="ts", table_timestamp="rate_ts",
            history_retention=10**9, how="left", backend=_backend(folder),
        )  # fmt: skip

    schemas = ("currency string, ts long, amount long", "currency string, rate_ts long, rate long")
    return _two_streams(spark, folder, schemas, batches, build)


def window_join_case(spark: Any, folder: Path) -> dict:
    from spark_integration import window_join

    rng = random.Random(2)
    batches = [
        (
            [{"ad": rng.choice("xyz"), "click_ts": b * 100 + rng.randrange(100)} for _ in range(8)],
            [
                {"ad": rng.choice("xyz"), "view_ts": b * 100 + rng.randrange(100), "n": i}
                for i in range(8)
            ],
        )  # fmt: skip
        for b in range(3)
    ]

    def build(left, right):
        return window_join(
            left, right, key="ad", left_timestamp="click_ts", right_timestamp="view_ts",
            within="30 ms", grace="1 second", backend=_backend(folder),
        )  # fmt: skip

    schemas = ("ad string, click_ts long", "ad string, view_ts long, n long")
    return _two_streams(spark, folder, schemas, batches, build)


def _items(seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    return [
        [
            {"id": f"k{rng.randrange(4)}", "item": rng.choice("abcde"), "ts": b * 1000 + i * 10}
            for i in range(12)
        ]  # fmt: skip
        for b in range(3)
    ] + [[{"id": "flush", "item": "f", "ts": 10**6}]]


def transform_with_state_case(spark: Any, folder: Path) -> dict:
    from spark_integration import transform_with_state
    from tests.spark import processors as P

    def build(df):
        return transform_with_state(
            df, "id", P.RowTracker(), P.OUT_SCHEMA, backend=_backend(folder), name="tws-rows"
        )

    return _one_stream(spark, folder, _items(5), build, ITEMS)


def transform_with_state_in_pandas_case(spark: Any, folder: Path) -> dict:
    from pyspark.sql import functions as F

    from spark_integration import transform_with_state_in_pandas
    from tests.spark import processors as P

    def build(df):
        df = df.withColumn("event", F.timestamp_millis("ts")).withWatermark("event", "0 seconds")
        return transform_with_state_in_pandas(
            df, "id", P.PandasExpiry(), P.TIMER_SCHEMA, time_mode="EventTime",
            backend=_backend(folder), name="tws-pandas",
        )  # fmt: skip

    return _one_stream(spark, folder, _items(6), build, ITEMS)


def _read_state(spark: Any, folder: Path, batch: int | None = 3) -> dict:
    """The sessions open after micro-batch ``batch`` (None: the latest), through
    the data source."""
    from spark_integration.datasource import register

    register(spark)
    reader = (
        spark.read.format("sessionstore")
        .option("path", f"file://{folder}/state")
        .option("operator", "sessionize")
        .option("store", "sessions")
    )
    read = (reader if batch is None else reader.option("batchId", str(batch))).load()
    return {"columns": read.columns, "rows": _ordered(read.collect(), read.columns)}


def _repartition(spark: Any, folder: Path) -> dict:
    from spark_integration import repartition_state

    try:
        summary = repartition_state(
            spark, f"file://{folder}/state", "sessionize", 1, f"file://{folder}/copy"
        )
    except Exception as error:  # the result is the error itself
        return {"error": f"{type(error).__name__}: {error}"}
    return {"rows": summary["rows"]}


def double_count(row: dict) -> dict:
    """The rewrite of ``_rewrite``: a module's function, so executors import it."""
    row["value"]["n"] *= 2
    return row


def _rewrite(spark: Any, folder: Path) -> dict:
    from spark_integration import rewrite_state

    before = _read_state(spark, folder, None)
    done = rewrite_state(spark, f"file://{folder}/state", "sessionize", double_count, force=True)
    counts = {k: done[k] for k in ("version", "rows", "changed", "deleted")}
    return {"counts": counts, "before": before, "after": _read_state(spark, folder, None)}


def quiet_sessionize_case(spark: Any, folder: Path) -> dict:
    """Item 1 of issue 39 (tests/spark/test_quiet_streams.py): a processing-time
    query whose input goes quiet after a row that closes the first file's
    sessions. The rows written without a further row, within 60 s."""
    from pyspark.sql import functions as F

    from spark_integration import sessionize
    from tests.spark.test_quiet_streams import FIRST, GAP_S, SCHEMA, SECOND, TRIGGER

    source, name = folder / "in", f"q{random.Random().randrange(10**9)}"
    stream = json_source(spark, source, SCHEMA)
    out = sessionize(
        stream.withColumn("t", F.timestamp_millis("ts")).drop("ts"), key="user",
        timestamp="t", gap=f"{GAP_S} s", grace=0, backend=_backend(folder), name="quiet",
    )  # fmt: skip
    query = (
        out.writeStream.format("memory").queryName(name).trigger(processingTime=TRIGGER)
        .option("checkpointLocation", str(folder / "spark-ckpt")).start()
    )  # fmt: skip
    try:
        for index, rows in enumerate([[], FIRST, SECOND]):
            if rows:
                write_json(source, index, rows)
            query.processAllAvailable()
        deadline = time.monotonic() + 60
        while spark.table(name).count() < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        query.stop()
    return {"rows": _ordered(spark.table(name).collect(), ["user", "count"])}


def available_now_sessionize_case(spark: Any, folder: Path) -> dict:
    """Item 2 of issue 39 (tests/spark/test_quiet_streams.py): an ``availableNow``
    run over both files of the quiet case ends with the sessions the second closed
    written (and their batches: two files, one due-only batch)."""
    from pyspark.sql import functions as F

    from spark_integration import sessionize
    from tests.spark.test_quiet_streams import FIRST, GAP_S, SCHEMA, SECOND

    source, name = folder / "in", f"q{random.Random().randrange(10**9)}"
    for index, rows in enumerate([FIRST, SECOND]):
        write_json(source, index, rows)
    stream = json_source(spark, source, SCHEMA)
    out = sessionize(
        stream.withColumn("t", F.timestamp_millis("ts")).drop("ts"), key="user",
        timestamp="t", gap=f"{GAP_S} s", grace=0, backend=_backend(folder), name="ends",
    )  # fmt: skip
    query = (
        out.writeStream.format("memory").queryName(name).trigger(availableNow=True)
        .option("checkpointLocation", str(folder / "spark-ckpt")).start()
    )  # fmt: skip
    try:
        query.awaitTermination(300)
    finally:
        query.stop()
    return {
        "rows": _ordered(spark.table(name).collect(), ["user", "count"]),
        "batches": len(query.recentProgress),
    }


def rescale_case(spark: Any, folder: Path) -> dict:
    """Issue 41: ``sessionize_case``'s query on its events, run at 4 partitions for
    two micro-batches, then restarted at 3 (the rescale runs as a job of this
    session) for the rest: its output (``rescaled``, to compare with
    ``sessionize_case``'s, the same query run uninterrupted) and whether its state
    is in a generation."""
    from spark_integration import StateBackend, sessionize
    from spark_integration.planning.rescale import located_backend

    source = folder / "in"
    steps = [
        lambda i=i, rows=rows: write_json(source, i, rows) for i, rows in enumerate(_events(1))
    ]
    backend = StateBackend(f"file://{folder}/state", local_dir=str(folder / "local"))

    def run(n: int, part: list[Callable[[], None]]) -> list[str]:
        # a file sink: a memory sink's query cannot restart from its checkpoint
        out = sessionize(json_source(spark, source, EVENTS), **SESSIONS, backend=backend,
                         num_partitions=n)  # fmt: skip
        query = (
            out.writeStream.format("parquet").option("path", str(folder / "out"))
            .option("checkpointLocation", str(folder / "spark-ckpt")).start()
        )  # fmt: skip
        drive(query, part)
        return out.columns

    with without_due_batches(spark):
        run(4, steps[:2])
        columns = run(3, steps[2:])
    rescaled = _ordered(spark.read.parquet(str(folder / "out")).collect(), columns)
    located = located_backend(spark, backend, "sessionize", 3)  # no second rescale
    return {
        "rescaled": {"columns": columns, "rows": rescaled},
        "generation": located.checkpoint_uri != backend.checkpoint_uri,
    }


CASES: dict[str, Callable[[Any, Path], dict]] = {
    "quiet_sessionize": quiet_sessionize_case,
    "available_now_sessionize": available_now_sessionize_case,
    "sessionize": sessionize_case,
    "bootstrap": bootstrap_case,
    "window_aggregate": window_aggregate_case,
    "temporal_join": temporal_join_case,
    "window_join": window_join_case,
    "transform_with_state": transform_with_state_case,
    "transform_with_state_in_pandas": transform_with_state_in_pandas_case,
    "rescale": rescale_case,
}


def run_case(spark: Any, name: str) -> dict:
    """Case ``name`` in a fresh folder: ``{"result": ..., "error": None}`` or
    ``{"result": None, "error": traceback}``."""
    folder = Path(tempfile.mkdtemp(prefix=f"connect-{name}-"))
    try:
        return {"result": CASES[name](spark, folder), "error": None}
    except Exception:
        return {"result": None, "error": traceback.format_exc()}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def main(url: str, out: str, names: list[str]) -> None:
    """Run ``names`` (default: every case) on a Connect session to ``url``."""
    from pyspark.sql import SparkSession

    logs = _Lines()
    logger = logging.getLogger("spark_integration")
    logger.setLevel(logging.INFO)
    logger.addHandler(logs)
    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        results = {name: run_case(spark, name) for name in names or CASES}
    finally:
        spark.stop()
    Path(out).write_text(json.dumps({"cases": results, "log": logs.lines}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
