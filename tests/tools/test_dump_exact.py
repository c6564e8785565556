"""``sessionstore dump`` and ``get`` write what a row-by-row rendering of the
reader's rows writes, byte for byte, in every format and with every option.

The CLI reads and writes rows a chunk of thousands at a time: a store's keys,
times and values decoded together (``read_columns``), each column turned into text
or an Arrow array in one pass (sessionstore/tools/formats.py). The reference here
is the straightforward path, written for the test: each database's rows read one
at a time as the store shapes them (``presented_rows``), given their partition,
filtered and cut as the options say, and rendered a row at a time:
``json.dumps(row, default=str)`` per line, a ``csv.DictWriter`` row per row, a
rich table, Parquet row groups of 65,536 rows from ``Table.from_pylist``.

The chunked path is what can go wrong at a chunk's edges: a row lost or doubled
at a boundary, a limit inside a chunk, a last chunk that is not full, a chunk of
few rows decoded without Arrow. The CLI reads the chunk size
(``row_chunks.CHUNK_ROWS``) when a read starts, so the cases here run with
chunks of :data:`SMALL_CHUNK_ROWS` rows over stores of a few hundred rows, which
cross every such edge several times for a fraction of the rows (and CPU) a
4,096-row chunk would need; slabs are routed in blocks of :data:`SMALL_ROUTED_ROWS`
rows for the same reason. One case dumps a store of more than two 4,096-row chunks
at the default size, the size a dump reads with. The stores mix keys and values,
an odd value every few rows; the property tests below put arbitrary values and
chunks of a few rows through the formats and arbitrary sessions through
``read_columns``.
"""

from __future__ import annotations

import csv
import datetime
import decimal
import functools
import io
import json
from itertools import islice

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sessionstore import StateDB, StateStoreProvider, StoreSpec
from sessionstore.encoding.keys import encode_key
from sessionstore.encoding.spark_hash import KeyRouter
from sessionstore.operators import SessionWindowAggregator, SessionWindows
from sessionstore.operators.aggregations import record_time_type
from sessionstore.operators.processors import BatchTimes, ProcessorHandle, ProcessorRunner
from sessionstore.stores.registry import store_class
from sessionstore.tools import reader, row_chunks
from sessionstore.tools.formats import write_chunks
from sessionstore.tools.processor_rows import timer_rows, variable_rows
from sessionstore.tools.reader import (
    Aggregates,
    Instant,
    RowFilter,
    open_source,
    presented_rows,
    store_kind,
    variable_declaration,
)
from sessionstore.tools.row_chunks import RowChunk, chunks_of
from tests.tools.cli_runner import run_cli

#: The product's chunk size, which one case dumps with.
DEFAULT_CHUNK_ROWS = row_chunks.CHUNK_ROWS
#: Rows per chunk in this module: at least the rows from which read_columns decodes
#: a chunk's keys in Arrow (64), so that full chunks take Arrow and short ones not.
SMALL_CHUNK_ROWS = 100
#: Rows per routing block of a slab in this module: not a multiple of a chunk, so
#: that blocks cut chunks and gather them.
SMALL_ROUTED_ROWS = 150


@pytest.fixture(scope="module", autouse=True)
def small_chunks():
    """Every dump here reads and writes chunks of :data:`SMALL_CHUNK_ROWS` rows and
    routes a slab's rows in blocks of :data:`SMALL_ROUTED_ROWS`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(row_chunks, "CHUNK_ROWS", SMALL_CHUNK_ROWS)
        patch.setattr(reader, "_ROUTED_ROWS", SMALL_ROUTED_ROWS)
        yield


#: Values that are not a plain dict of numbers: what each format must render as a
#: row at a time would (msgpack gives lists for tuples, keeps bytes, ints as keys).
ODD_VALUES = [
    [1, "x", None, [2.5, b"\x00"]],
    b"\x00\xffbytes \xe2\x98\x83",
    'text "quoted" %s \\ \n tab\t',
    1.5,
    float("nan"),
    float("-inf"),
    True,
    -7,
    2**63 - 1,
    {"nested": {"deep": [1, {"b": b"z"}], "n": None}},
    {1: "an int key", 2: [True]},
    {"k%s": "percent", 'quote"': "\u2603", "\n": 0},
    {},
    [],
    "ünïcode ☃ \U0001f600",
    {"clicks": None, "page": "/p"},
    {"clicks": 1.0, "page": "/p"},
    {"page": "/p", "clicks": 2},
    {"clicks": 2, "page": "/p", "extra": 3},
    datetime.datetime(2024, 1, 2, 3, 4, 5, 600000, tzinfo=datetime.UTC),
    decimal.Decimal("1.50"),
]
ODD_KEYS = ['a"b', "%s%%", "ü☃", "", "zero\x00byte", "\\"]


def session_value(i):
    """Every 7th value odd, in runs of 250 rows with runs of plain values between:
    a chunk mixes many kinds of value, or holds dicts of one shape (written a
    column per key)."""
    if i % 7 == 0 and i // 250 % 2 == 0:
        return ODD_VALUES[i // 7 % len(ODD_VALUES)]
    return {"clicks": i % 97, "page": f"/p{i % 13}"}


class _Writer:
    """A StatefulProcessor's state: a value, a map with a TTL and a timer per key."""

    def init(self, handle):
        self.h = handle
        self.v = handle.getValueState("v", "n long")
        self.m = handle.getMapState("m", "k string", "x long", ttlDurationMs=50)

    def handleInputRows(self, key, rows, tv):
        for r in rows:
            self.v.update((r,))
            self.m.updateValue((str(r),), (r,))
        self.h.registerTimer(500 + len(key[0]))
        return iter([])


def write_sessions(sessions, count):
    """``count`` sessions of ``user<i // 3>``, then one per odd key."""
    sessions.put_many(
        (f"user{i // 3:05d}", i, i + 10 + i % 7, session_value(i)) for i in range(count)
    )
    for n, key in enumerate(ODD_KEYS):
        sessions.put(key, n, n + 1, {"clicks": n, "page": key})


def write_segmented(local):
    """Two databases of operator ``op`` with a session store of many segments, on
    their own (a reader opens every family of a database: the dumps of the other
    stores need not open these)."""
    with StateDB.open(local / "op" / "0" / "db") as db:
        with db.batch():
            segmented = db.session_store("segmented", 10**6, segment_interval_ms=50)
            segmented.put_many((f"k{i % 50:02d}", i, i + 5, session_value(i)) for i in range(600))
            # sessions kept to close at the next advance, merged into the segments' rows
            closing = segmented.closing_sessions()
            kept = [(f"k{i % 60:02d}", 10 * i + 3, 10 * i + 7) for i in range(60)]
            closing.add_many(
                [encode_key(k) for k, _, _ in kept], [s for _, s, _ in kept],
                [e for _, _, e in kept], [segmented.value_serde.dumps([k, s]) for k, s, _ in kept],
            )  # fmt: skip
    with StateDB.open(local / "op" / "1" / "db") as db:
        db.session_store("segmented", 10**6, segment_interval_ms=50)


def write_local(local):
    """Two databases of operator ``op``, with a store of every kind."""
    with StateDB.open(local / "op" / "0" / "db") as db:
        with db.batch():
            write_sessions(db.session_store("sessions", 10**12), 330)
            windows = db.window_store("windows", 10**9, 10)
            for i in range(500):
                windows.put_window(f"w{i % 7}", 10 * i, session_value(i))
            messages = db.message_store("messages", 10**9)
            for i in range(500):
                messages.put_message(f"m{i % 5}", i // 2, i, session_value(i))
            kv = db.kv_store("kv")
            for i in range(300):
                kv.put(i if i % 3 else f"s{i}", session_value(i))
            plans = db.versioned_store("plans", 10**9)
            for i in range(400):
                plans.put(f"p{i % 9}", session_value(i), 5 * i)
            record_time_type(plans, "timestamp")
        store = db.processor_store("processor")
        runner = ProcessorRunner(
            _Writer(), ProcessorHandle(store, "ProcessingTime"), "ProcessingTime"
        )
        with db.batch():
            batch = [((k,), None, lambda k=k: iter(range(len(k) + 1))) for k in ("a", "bb", "c")]
            runner.run_batch(batch, BatchTimes(100, -1))
        # in table files, which a reader opens in half the time it replays them from
        # the log (database 1's rows stay in the log: a reader reads both)
        db.flush_memtables()
    with StateDB.open(local / "op" / "1" / "db") as db:
        with db.batch():
            sessions = db.session_store("sessions", 10**12)
            for i in range(SMALL_CHUNK_ROWS):  # exactly a chunk, of keys of four types
                key = [i, ("t", i), b"b%d" % i, f"v{i}"][i % 4]
                sessions.put(key, i, i + 3, session_value(i))
            db.window_store("windows", 10**9, 10)
            db.message_store("messages", 10**9)
            db.kv_store("kv").put(("t", 1), [1])
            db.versioned_store("plans", 10**9)
        db.processor_store("processor")


def write_slabs(uri, local):
    """Operator ``slab``: 6 partitions kept in 2 databases, keys of type string."""
    for slab, count in ((0, 400), (1, 200)):
        provider = StateStoreProvider(
            uri, "slab", slab, [StoreSpec("sessions", "session", 10**9)], str(local),
            num_partitions=2, key_groups=6, key_types=["string"],
        )  # fmt: skip
        handle = provider.get_store(0)
        handle["sessions"].put_many(
            (f"s{slab}-{i // 2}", i, i + 1, session_value(i)) for i in range(count)
        )
        handle.commit()
        provider.close()


def write_aggregates(uri, local):
    """Operator ``agg``: a sessionize's store, its values the aggregates of a plan."""
    provider = StateStoreProvider(uri, "agg", 0, [StoreSpec("sessions", "session", 10**9)],
                                  str(local))  # fmt: skip
    handle = provider.get_store(0)
    op = SessionWindowAggregator(
        handle["sessions"], SessionWindows(100), emit="update",
        aggregations={"clicks": "count", "entry": ("first", "page"), "exit": ("last", "page"),
                      "value": ("max", "n")},
    )  # fmt: skip
    for i in range(360):
        op.process(f"u{i % 80:04d}", {"page": f"/p{i % 11}", "n": i % 5}, i // 3 * 60)
    handle.commit()
    provider.close()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exact")
    write_local(tmp / "local")
    write_segmented(tmp / "segmented")
    write_slabs(f"file://{tmp}/slabs", tmp / "slab-local")
    write_aggregates(f"file://{tmp}/agg", tmp / "agg-local")
    with StateDB.open(tmp / "large" / "op" / "0" / "db") as db, db.batch():  # the default size's
        write_sessions(db.session_store("sessions", 10**12), 9_000)
    with StateDB.open(tmp / "segmented" / "op" / "0" / "db") as db:  # the merge path is taken
        assert db.session_store("segmented", 10**6, 50).closing_sessions().all()
        assert len(db.session_store("segmented", 10**6, 50).segment_ids()) > 10
    return {"local": str(tmp / "local"), "slabs": f"file://{tmp}/slabs",
            "agg": f"file://{tmp}/agg", "large": str(tmp / "large"),
            "segmented": str(tmp / "segmented"), "tmp": tmp}  # fmt: skip


# ----------------------------------------------------------------- reference
def reference_rows(uri, operator, store, partition=None, row_filter=None, limit=None,
                   raw=False, state_var=None, timers=False, flatten=True):  # fmt: skip
    """The rows of a dump, read one at a time from each database."""
    row_filter = row_filter or RowFilter()
    source = cached_source(uri)
    kind = store_kind(source, operator, store)
    layout = source.layout(operator)
    rows = []
    if layout is not None and layout[0] != layout[1]:
        slabs, count = layout
        router = KeyRouter(source.key_types(operator), count)
        wanted = range(count) if partition is None else [partition]
        for database in sorted({p % slabs for p in wanted}):
            with source.open(operator, database) as (_, stores):
                for row in presented_rows(stores[store], kind, "w", row_filter, raw):
                    label = router.partitions_of([row["key"]])[0]
                    if label in wanted:
                        rows.append({"partition": label, **row})
    else:
        for p in source.partitions(operator) if partition is None else [partition]:
            with source.open(operator, p) as (_, stores):
                rows += [
                    {"partition": p, **row}
                    for row in presented_rows(stores[store], kind, "w", row_filter, raw)
                ]
    if limit is not None:
        rows = rows[:limit]
    if timers:
        rows = list(timer_rows(iter(rows)))
    elif state_var is not None:
        declared = variable_declaration(source, operator, store, state_var)
        rows = list(variable_rows(iter(rows), state_var, declared["kind"], declared["ttl"],
                                  flatten))  # fmt: skip
    return rows


@functools.cache
def cached_reference_rows(uri, operator, store, options):
    """:func:`reference_rows` read once for the formats of a case (``options``: its
    keyword arguments as sorted pairs)."""
    return reference_rows(uri, operator, store, **dict(options))


@functools.cache
def cached_source(uri):
    """:func:`open_source`, opened once per source (it reads its store records once)."""
    return open_source(uri)


@functools.cache
def cached_store_kind(uri, operator, store):
    """:func:`store_kind`, read once per store."""
    return store_kind(cached_source(uri), operator, store)


def jsonable(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return list(value) if isinstance(value, tuple) else value


def iso(ms):
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def spread(row):
    value = row.get("value")
    if not isinstance(value, Aggregates):
        return row
    out = {k: v for k, v in row.items() if k != "value"}
    for name, result in value.items():
        out[f"value.{name}" if name in row else name] = result
    return out


def flat(row):
    columns = spread(row)
    text = {k for k in columns if k not in row} | {"key", "value"}

    def as_text(v):
        return v if isinstance(v, str) else json.dumps(jsonable(v), default=str)

    return {k: as_text(v) if k in text and v is not None else v for k, v in columns.items()}


def render(rows, fmt, times=(), epoch_ms=False, path=None):
    """``rows`` in ``fmt`` as the CLI wrote them a row at a time (Parquet: to ``path``)."""
    if fmt in ("table", "csv") and not epoch_ms:
        rows = [{k: iso(v) if k in times and v is not None else v for k, v in r.items()}
                for r in rows]  # fmt: skip
    out = io.StringIO()
    if fmt == "jsonl":
        for row in rows:
            out.write(json.dumps({k: jsonable(v) for k, v in row.items()}, default=str) + "\n")
    elif fmt == "csv":
        writer = None
        for row in rows:
            f = flat(row)
            if writer is None:
                writer = csv.DictWriter(out, fieldnames=list(f))
                writer.writeheader()
            writer.writerow(f)
    elif fmt == "table":
        from rich.console import Console
        from rich.table import Table

        spreadout = [spread(r) for r in rows]
        table = Table()
        for column in spreadout[0] if spreadout else ["partition", "key", "value"]:
            table.add_column(column)
        for r in spreadout:
            table.add_row(*(str(jsonable(v)) for v in r.values()))
        Console(width=200, file=out).print(table)
    else:
        render_parquet(rows, path, times)
    return out.getvalue()


def render_parquet(rows, path, times, group=65536):
    """Parquet row groups of ``group`` rows, each from ``Table.from_pylist``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    for at in range(0, len(rows), group):
        part = rows[at : at + group]
        flats = [flat(r) for r in part]
        if writer is None:
            ints = {n for n in part[0] if n not in ("key", "value", "state")}
            stamped = any(isinstance(r.get(n), Instant) for r in part for n in times)
            instants = set(times) & ints if stamped else set()
            fields = [
                (n, pa.timestamp("ms", tz="UTC") if n in instants
                 else pa.int64() if n in ints else pa.string())
                for n in flats[0]
            ]  # fmt: skip
            writer = pq.ParquetWriter(path, pa.schema(fields))
        writer.write_table(pa.Table.from_pylist(flats, schema=writer.schema))
    if writer is None:
        empty = pa.schema([("partition", pa.int64()), ("key", pa.string()), ("value", pa.string())])
        pq.write_table(empty.empty_table(), path)
    else:
        writer.close()


# --------------------------------------------------------------- the table
#: (source, operator, store, CLI options, reference options, formats)
CASES = [
    ("local", "op", "sessions", [], {}, "jsonl csv parquet"),
    ("local", "op", "sessions", ["--limit", "250"], {"limit": 250}, "jsonl csv parquet"),
    ("local", "op", "sessions", ["--limit", "3"], {"limit": 3}, "jsonl csv table parquet"),
    ("local", "op", "sessions", ["--partition", "1"], {"partition": 1}, "jsonl csv table parquet"),
    ("local", "op", "sessions", ["--key-from", "user00010", "--key-to", "user00080"],
     {"row_filter": RowFilter(key_from="user00010", key_to="user00080")}, "jsonl csv"),
    ("local", "op", "sessions", ["--from-ts", "30", "--to-ts", "1970-01-01T00:00:00.250Z"],
     {"row_filter": RowFilter(from_ts=30, to_ts=250)}, "jsonl parquet"),
    ("local", "op", "sessions", ["--key", "user00042"], {"row_filter": RowFilter(key="user00042")},
     "jsonl csv table"),
    ("local", "op", "sessions", ["--key", "nobody"], {"row_filter": RowFilter(key="nobody")},
     "jsonl csv table parquet"),
    ("local", "op", "sessions", ["--limit", "70", "--epoch-ms"], {"limit": 70}, "csv table"),
    ("segmented", "op", "segmented", [], {}, "jsonl csv parquet"),
    ("segmented", "op", "segmented", ["--from-ts", "250", "--key-to", "k30"],
     {"row_filter": RowFilter(from_ts=250, key_to="k30")}, "jsonl"),
    ("local", "op", "windows", [], {}, "jsonl csv parquet"),
    ("local", "op", "windows", ["--to-ts", "2000"], {"row_filter": RowFilter(to_ts=2000)}, "jsonl"),
    ("local", "op", "messages", [], {}, "jsonl csv parquet"),
    ("local", "op", "messages", ["--from-ts", "50", "--to-ts", "120"],
     {"row_filter": RowFilter(from_ts=50, to_ts=120)}, "jsonl csv"),
    ("local", "op", "kv", [], {}, "jsonl csv table parquet"),
    ("local", "op", "kv", ["--key-json", "--key", "5"], {"row_filter": RowFilter(key=5)}, "jsonl"),
    ("local", "op", "plans", [], {}, "jsonl csv parquet"),
    ("local", "op", "plans", ["--as-of", "600"], {"row_filter": RowFilter(as_of=600)},
     "jsonl csv parquet"),
    ("local", "op", "processor", [], {}, "jsonl csv table parquet"),
    ("local", "op", "processor", ["--state-var", "m"], {"state_var": "m"}, "jsonl csv parquet"),
    ("local", "op", "processor", ["--state-var", "m", "--no-flatten"],
     {"state_var": "m", "flatten": False}, "jsonl"),
    ("local", "op", "processor", ["--state-var", "v"], {"state_var": "v"}, "jsonl csv"),
    ("local", "op", "processor", ["--timers"], {"timers": True}, "jsonl csv parquet"),
    ("agg", "agg", "sessions", [], {}, "jsonl csv parquet"),
    ("agg", "agg", "sessions", ["--raw"], {"raw": True}, "jsonl csv parquet"),
    ("agg", "agg", "sessions", ["--limit", "20"], {"limit": 20}, "table"),
    ("slabs", "slab", "sessions", [], {}, "jsonl csv parquet"),
    ("slabs", "slab", "sessions", ["--partition", "3", "--limit", "90"],
     {"partition": 3, "limit": 90}, "jsonl parquet"),
]  # fmt: skip


@pytest.mark.parametrize(
    "where,operator,store,options,reference,fmt",
    [(*case[:5], fmt) for case in CASES for fmt in case[5].split()],
    ids=[f"{c[1]}-{c[2]}{''.join(c[3])}-{fmt}" for c in CASES for fmt in c[5].split()],
)
def test_dump_writes_what_a_row_at_a_time_writes(sources, where, operator, store, options,
                                                  reference, fmt):  # fmt: skip
    check_dump(sources, where, operator, store, options, reference, fmt)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_dump_in_chunks_of_the_default_size_writes_what_a_row_at_a_time_writes(sources, fmt):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(row_chunks, "CHUNK_ROWS", DEFAULT_CHUNK_ROWS)
        rows = check_dump(sources, "large", "op", "sessions", [], {}, fmt)
    assert DEFAULT_CHUNK_ROWS == 4096
    assert len(rows) > 2 * DEFAULT_CHUNK_ROWS and len(rows) % DEFAULT_CHUNK_ROWS


def check_dump(sources, where, operator, store, options, reference, fmt):
    """``sessionstore dump`` of ``store`` with ``options`` writes in ``fmt`` what
    :func:`render` writes of the rows :func:`reference_rows` reads with
    ``reference``; returns those rows."""
    uri = sources[where]
    target = sources["tmp"] / f"out-{abs(hash((where, store, *options, fmt)))}.{fmt}"
    done = run_cli("dump", uri, "--operator", operator, "--store", store, "--format", fmt,
                   "--output", str(target), *options)  # fmt: skip
    rows = cached_reference_rows(uri, operator, store, tuple(sorted(reference.items())))
    kind = cached_store_kind(uri, operator, store)
    times = () if fmt == "jsonl" else store_class(kind).time_columns
    expected = target.with_suffix(f".expected.{fmt}")
    try:
        text = render(rows, fmt, times, "--epoch-ms" in options, str(expected))
    except Exception as exc:  # a row Parquet cannot hold: the dump says what the writer said
        assert (done.returncode, done.stderr) == (2, f"sessionstore: {exc}\n")
        return rows
    assert done.returncode == 0, done.stderr
    if fmt == "parquet":
        assert target.read_bytes() == expected.read_bytes()
        assert done.stdout == f"wrote {len(rows):,} rows to {target}\n"
    else:
        assert target.read_bytes() == text.encode("utf-8")
    assert rows or "nobody" in options  # every other case shows rows
    return rows


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "table"])
@pytest.mark.parametrize("key", ["user00042", "%s%%", 'a"b'])
def test_get_writes_what_a_row_at_a_time_writes(sources, fmt, key):
    done = run_cli("get", sources["local"], "--store", "sessions", "--key", key, "--format", fmt)
    assert done.returncode == 0, done.stderr
    rows = cached_reference_rows(sources["local"], "op", "sessions",
                                 (("row_filter", RowFilter(key=key)),))  # fmt: skip
    expected = render(rows, fmt, ("start", "end"))
    assert done.stdout == expected.replace("\r\n", "\n").replace("\r", "\n")  # as a pipe reads it


def test_the_stores_hold_more_rows_than_a_chunk(sources):
    size = row_chunks.CHUNK_ROWS  # what the dumps here read and write with
    assert size == SMALL_CHUNK_ROWS
    rows = cached_reference_rows(sources["local"], "op", "sessions", ())
    first = [row for row in rows if row["partition"] == 0]
    assert len(first) > 2 * size and len(first) % size  # the last chunk not full
    assert len(rows) - len(first) == size
    slabs = cached_reference_rows(sources["slabs"], "slab", "sessions", ())
    assert len(slabs) > size and len(slabs) > 2 * SMALL_ROUTED_ROWS
    shown = cached_reference_rows(sources["agg"], "agg", "sessions", ())
    assert len(shown) > size and isinstance(shown[0]["value"], Aggregates)
    for where, store in [("segmented", "segmented"), ("local", "windows"), ("local", "messages"),
                         ("local", "kv"), ("local", "plans")]:  # fmt: skip
        assert len(cached_reference_rows(sources[where], "op", store, ())) > 2 * size, store


# ---------------------------------------------------------- property tests
def values(ints):
    """Values of any shape the formats meet, their ints drawn from ``ints``."""
    scalars = st.one_of(
        st.none(), st.booleans(), ints, st.floats(allow_nan=True), st.text(max_size=6),
        st.binary(max_size=6), st.sampled_from(["%s", "%%", '"', "\\", "\n", "[b]x[/b]"]),
        st.datetimes(datetime.datetime(2000, 1, 1), datetime.datetime(2100, 1, 1),
                     timezones=st.just(datetime.UTC)),
        st.decimals(allow_nan=False, places=2, min_value=-100, max_value=100),
    )  # fmt: skip
    return st.recursive(scalars, _containers, max_leaves=6)


def _containers(inner):
    return st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.sampled_from(["clicks", "page", "%s", "k"]), st.text(max_size=3)),
                        inner, max_size=3),
        st.dictionaries(st.sampled_from(["clicks", "page"]), inner, min_size=2, max_size=2)
        .map(Aggregates),
        st.dictionaries(st.integers(-3, 3), inner, max_size=2),
    )  # fmt: skip


#: Values for the formats (any int, an event time as an Instant), and values a
#: store holds (msgpack's ints).
VALUES = values(st.one_of(st.integers(-(2**70), 2**70), st.integers(0, 10**6).map(Instant)))
STORED = values(st.integers(-(2**63), 2**64 - 1))
NAMES = st.sampled_from([("partition", "key", "start", "end", "value"), ("partition", "key", "value"),
                         ("key", "%s", "value"), ("partition", "key", "state", "value")])  # fmt: skip


#: What one column's values are (built once: a strategy built per draw costs more
#: than the draw).
COLUMN_KINDS = st.sampled_from([
    VALUES, st.integers(-5, 5), st.text(max_size=4),
    st.dictionaries(st.just("clicks"), st.integers(0, 9), min_size=1),
])  # fmt: skip
SHAPES = st.lists(NAMES, min_size=1, max_size=2)
#: Up to 8 rows in chunks of 1 to 5: a few chunks, their edges anywhere, at a
#: fraction of the draws more rows take.
ROW_COUNTS = st.integers(0, 8)
SHAPE_AT = (st.just(0), st.integers(0, 1))


@st.composite
def row_lists(draw):
    """Rows mostly of one shape, their columns mostly of one kind of value."""
    shapes = draw(SHAPES)
    columns = {name: draw(COLUMN_KINDS) for shape in shapes for name in shape}
    at = SHAPE_AT[len(shapes) - 1]
    return [
        {name: draw(columns[name]) for name in shapes[draw(at)]} for _ in range(draw(ROW_COUNTS))
    ]


@settings(max_examples=200, deadline=None)
@given(rows=row_lists(), size=st.integers(1, 5), fmt=st.sampled_from(["jsonl", "csv", "table"]))
def test_formats_write_any_rows_as_a_row_at_a_time(rows, size, fmt):
    out = io.StringIO()
    try:
        expected = render(rows, fmt, epoch_ms=True)
    except ValueError as exc:  # csv refuses a row with fields the header lacks
        assume(fmt == "csv" and "fields not in fieldnames" in str(exc))
        with pytest.raises(ValueError, match="fields not in fieldnames"):
            write_chunks(chunks_of(rows, size), fmt, out, None)
        assert expected_until_error(rows) == out.getvalue()
        return
    assert write_chunks(chunks_of(rows, size), fmt, out, None) == len(rows)
    assert out.getvalue() == expected


def expected_until_error(rows):
    """The CSV a row-at-a-time writer wrote before the row it refused."""
    out = io.StringIO()
    writer = None
    for row in rows:
        f = flat(row)
        if writer is None:
            writer = csv.DictWriter(out, fieldnames=list(f))
            writer.writeheader()
        try:
            writer.writerow(f)
        except ValueError:
            break
    return out.getvalue()


PARQUET_ROWS = st.lists(
    st.fixed_dictionaries({
        "partition": st.integers(0, 3),
        "key": st.one_of(st.text(max_size=4), st.integers(), st.binary(max_size=3)),
        "start": st.one_of(st.integers(0, 10**12), st.integers(0, 10**12).map(Instant)),
        "end": st.one_of(st.none(), st.integers(0, 10**12)),
        "value": VALUES,
    }),
    max_size=8,  # row groups of 1 to 7 rows and chunks of 1 to 5 cut them anywhere
)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(rows=PARQUET_ROWS, size=st.integers(1, 5), group=st.integers(1, 7))
def test_parquet_is_what_a_row_at_a_time_writes(tmp_path_factory, rows, size, group):
    import pyarrow.parquet as pq

    from sessionstore.tools import formats

    tmp = tmp_path_factory.mktemp("pq")
    times = ("start", "end")
    expected = tmp / "expected.parquet"
    render_parquet(rows, str(expected), times, group)
    written = formats._write_parquet(chunks_of(rows, size), str(tmp / "got.parquet"), times,
                                     group)  # fmt: skip
    assert written == len(rows)
    assert (tmp / "got.parquet").read_bytes() == expected.read_bytes()
    assert pq.read_metadata(expected).num_row_groups == -(-len(rows) // group) or not rows


SESSION_KEYS = st.one_of(st.sampled_from(["a", "b", "aa", "b\x00", "ü", ""]), st.integers(-3, 3),
                         st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 2)))  # fmt: skip
TIME = st.one_of(st.none(), st.integers(0, 120))


@settings(max_examples=100, deadline=None)
@given(
    sessions=st.lists(st.tuples(SESSION_KEYS, st.integers(0, 100), st.integers(0, 20), STORED),
                      max_size=40),
    kept=st.lists(st.tuples(SESSION_KEYS, st.integers(0, 100), st.integers(0, 20)), max_size=5),
    kind=st.sampled_from(["session", "window", "messages"]),
    # up to 11 segments, each a column family that takes milliseconds to create
    interval=st.sampled_from([None, 12, 40]),
    key_from=st.one_of(st.none(), SESSION_KEYS),
    key_to=st.one_of(st.none(), SESSION_KEYS),
    from_ts=TIME,
    to_ts=TIME,
    size=st.integers(1, 9),
)  # fmt: skip
def test_read_columns_are_read_rows(tmp_path_factory, sessions, kept, kind, interval, key_from,
                                    key_to, from_ts, to_ts, size):  # fmt: skip
    assume(from_ts is None or to_ts is None or from_ts <= to_ts)
    sessions = [s for s in sessions if s[3] is not None]  # None deletes
    with StateDB.open(tmp_path_factory.mktemp("db") / "db") as db:
        if kind == "session":
            store = db.session_store("s", 10**9, segment_interval_ms=interval)
            for key, start, length, value in sessions:
                store.put(key, start, start + length, value)
        elif kind == "window":
            store = db.window_store("s", 10**9, 5, segment_interval_ms=interval)
            for key, start, _, value in sessions:
                store.put_window(key, start, value)
        else:
            store = db.message_store("s", 10**9, segment_interval_ms=interval)
            for key, offset, ts, value in sessions:
                store.put_message(key, ts, offset, value)
        if kept and kind == "session":
            store.closing_sessions().add_many(
                [encode_key(k) for k, _, _ in kept], [s for _, s, _ in kept],
                [s + n for _, s, n in kept], [store.value_serde.dumps(s) for _, s, _ in kept],
            )  # fmt: skip
        bounds = {"key_from": key_from, "key_to": key_to, "from_ts": from_ts, "to_ts": to_ts}
        try:
            want = list(store.read_rows(**bounds))
        except Exception as exc:  # what read_rows refuses, read_columns refuses alike
            with pytest.raises(type(exc)):
                list(store.read_columns(**bounds, size=size))
            return
        chunks = list(store.read_columns(**bounds, size=size))
    assert all(0 < RowChunk.of_columns(c).size <= size for c in chunks)
    got = [row for c in chunks for row in RowChunk.of_columns(c).rows()]
    assert repr(got) == repr(want)  # NaN is not equal to itself; its repr is


def test_read_columns_gives_the_rows_before_a_value_that_does_not_decode(tmp_path):
    with StateDB.open(tmp_path / "db") as db:
        store = db.session_store("s", 10**9)
        for i in range(20):
            store.put(f"k{i:02d}", i, i + 1, [i])
        raw = next(k for k, _ in db.scan(f"s.{store.segment_ids()[0]}") if b"k07" in k)
        with db.batch():
            db.put(f"s.{store.segment_ids()[0]}", raw, b"\xc1")  # a byte msgpack never writes
        rows = store.read_rows()
        want = list(islice(rows, 7))
        with pytest.raises(Exception) as wanted:
            next(rows)
        chunks = store.read_columns(size=16)
        first = next(chunks)
        with pytest.raises(type(wanted.value)) as got:
            next(chunks)
    assert list(RowChunk.of_columns(first).rows()) == want
    assert str(got.value) == str(wanted.value)


def test_a_subclass_that_shapes_its_rows_itself_is_read_a_row_at_a_time(tmp_path):
    from sessionstore.stores.session import SessionStore

    class Tagged(SessionStore):  # rows of its own shape, no columns beside them
        def _row(self, window, value, to_ts):
            return {"key": window.key, "tag": "t", "value": value}

    class Filtered(SessionStore):  # a read of its own
        def read_rows(self, **bounds):
            return (r for r in super().read_rows(**bounds) if r["start"] % 2)

    with StateDB.open(tmp_path / "db") as db:
        for cls in (Tagged, Filtered):
            store = cls(db, cls.__name__, 10**9)
            for i in range(10):
                store.put(f"k{i}", i, i + 1, i)
            assert store.read_columns() is None
            want = list(store.read_rows())
            assert [r for c in RowFilter().chunks(store, 3) for r in c.rows()] == want
        assert db.session_store("plain", 10**9).read_columns() is not None
