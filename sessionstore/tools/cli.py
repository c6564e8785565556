"""``sessionstore`` command line: look at state without stopping the job.

    sessionstore ls URI
    sessionstore dump URI --store NAME [--operator OP] [--partition P] [--version N]
                          [--key K | --key-from A --key-to B] [--from-ts T1 --to-ts T2]
                          [--as-of T] [--format jsonl|table|csv|parquet] [--output FILE]
                          [--limit N] [--raw]
    sessionstore get URI --store NAME --key K [--operator OP] [--as-of T] [--version N]
                         [--raw]
    sessionstore verify URI [--operator OP]
    sessionstore stats URI [--operator NAME] [--last N] [--format table|json]
    sessionstore restore URI --operator OP --partition P [--version N] --to DIR
    sessionstore repartition URI --operator OP --partitions N --to URI2 [--version V]
                             [--key-types string,long]
    sessionstore erase URI --operator OP (--key K ... | --keys-from FILE.parquet) [--force]
    sessionstore rewrite URI --operator OP --function MODULE:NAME [--store S] [--raw]
                         [--force]

``URI`` is a checkpoint root (``file://``, a path, ``s3://`` with ``--storage-option
k=v``, ``--storage-options-file FILE`` or the AWS environment) or a local database
directory of a job (its
``localDir``, an operator directory below it, or one database). Reading never takes
a job's lock or writes into its directories: checkpoints are restored into a
temporary directory, local databases are opened as RocksDB secondary instances.
Progress bars show on a terminal only. Errors print one line and exit with status 2.

A store whose checkpoint records the ``pickle`` serde is refused (one line, exit
status 2) by ``dump``, ``get``, ``verify``, ``restore``, ``repartition`` and
``stats`` unless ``--allow-pickle`` is given: unpickling runs whatever code the
writer of the checkpoint put there (docs/security.md).

A command line is visible to every local user (``ps``): give credentials
(``secret_key``, ``access_token``, ``proxy_options``, ...) in a storage options
file (``KEY=VALUE`` lines, ``#`` comments; ``--storage-options-file`` or the
environment variable ``SESSIONSTORE_STORAGE_OPTIONS_FILE``) or the store's own
environment (``AWS_SECRET_ACCESS_KEY``, ``GOOGLE_APPLICATION_CREDENTIALS``). A
secret given with ``--storage-option`` still works, with a warning on stderr.

Stores of aggregating operators hold accumulators; ``dump`` and ``get`` show the
operator's output instead (the aggregates by name, from the plan the operator
recorded with its state), and ``--raw`` the stored accumulators.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click

from sessionstore.arrow_pandas import pandas_on_demand
from sessionstore.checkpoint.offline.verify import verify_checkpoint
from sessionstore.checkpoint.records.layout import LocalPartition
from sessionstore.checkpoint.storage.filesystem import is_secret_option
from sessionstore.checkpoint.storage.first_contact import StoreUnreachableError
from sessionstore.checkpoint.storage.retry import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_SECONDS,
    MAX_ATTEMPTS_OPTION,
    MAX_SECONDS_OPTION,
)
from sessionstore.errors import SessionStoreError
from sessionstore.stores.registry import store_class
from sessionstore.tools.formats import write_chunks
from sessionstore.tools.processor_rows import timer_rows, variable_rows
from sessionstore.tools.reader import (
    CheckpointSource,
    LocalSource,
    RowFilter,
    open_source,
    store_chunks,
    store_kind,
    variable_declaration,
)
from sessionstore.tools.row_chunks import RowChunk, chunks_of, rows_of

__all__ = ["main", "cli"]


class CliError(click.ClickException):
    exit_code = 2


def _options(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise CliError(f"--storage-option needs key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key] = value
    return out


#: The environment variable that names a storage options file (``--storage-options-file``).
OPTIONS_FILE_ENV = "SESSIONSTORE_STORAGE_OPTIONS_FILE"


def _options_file(path: str) -> tuple[str, ...]:
    """The ``KEY=VALUE`` lines of a storage options file (blank lines and ``#``
    comments skipped); a bad line is named by its number, never its text (it may
    hold a secret)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise CliError(f"cannot read storage options file {path!r}: {exc.strerror}") from None
    pairs = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if "=" not in text or not text.split("=", 1)[0].strip():
            raise CliError(f"{path}, line {number}: a storage option is KEY=VALUE")
        key, value = text.split("=", 1)
        pairs.append(f"{key.strip()}={value.strip()}")
    return tuple(pairs)


def _warn_secrets(pairs: tuple[str, ...]) -> None:
    """One line on stderr if a ``--storage-option`` carries a credential: every
    local user can read a command line (``ps``)."""
    secrets = sorted({p.split("=", 1)[0] for p in pairs if is_secret_option(p.split("=", 1)[0])})
    if secrets:
        click.echo(
            f"sessionstore: warning: --storage-option {', '.join(secrets)} puts a secret on "
            "the command line, which other local users can read (ps); give it in a "
            f"--storage-options-file (or ${OPTIONS_FILE_ENV}) or the environment instead",
            err=True,
        )


def _key(text: str | None, as_json: bool) -> Any:
    if text is None or not as_json:
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"--key-json: {text!r} is not JSON ({exc.msg})") from None
    return tuple(value) if isinstance(value, list) else value


def _time(option: str, text: str | None) -> int | None:
    """Epoch milliseconds, or an ISO-8601 time (UTC unless it names a zone)."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"{option} {text!r} is neither epoch milliseconds nor an ISO-8601 time"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


epoch_ms_option = click.option(
    "--epoch-ms", is_flag=True,
    help="table and csv: times as epoch milliseconds, not ISO-8601 UTC",
)  # fmt: skip


def _time_columns(source: CheckpointSource | LocalSource, operator: str, store: str) -> tuple:
    """The fields of ``store``'s rows that are event times (epoch ms)."""
    return store_class(store_kind(source, operator, store)).time_columns


def _readable_times(chunks: Iterator[RowChunk], columns: tuple[str, ...]) -> Iterator[RowChunk]:
    """Rows with the event times in ``columns`` as ISO-8601 UTC text (table and csv
    are read by people; jsonl and parquet keep the integers)."""
    for chunk in chunks:
        for name, values in zip(chunk.names, chunk.columns, strict=True):
            if name in columns:
                chunk = chunk.replace(name, [v if v is None else _iso(v) for v in values])
        yield chunk


def storage_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--storage-option KEY=VALUE`` (repeatable) and the retry policy of object-store
    requests, ``--retry-max-attempts`` and ``--retry-max-seconds``
    (sessionstore/checkpoint/storage/retry.py), which travel with the storage options."""

    @functools.wraps(command)
    def run(
        *args: Any,
        retry_max_attempts: int | None,
        retry_max_seconds: float | None,
        storage_options_file: str | None,
        **kw: Any,
    ) -> Any:
        _warn_secrets(kw["storage_options"])
        # the command line's own options win over the file's
        from_file = _options_file(storage_options_file) if storage_options_file else ()
        extra = tuple(
            f"{key}={value}"
            for key, value in ((MAX_ATTEMPTS_OPTION, retry_max_attempts),
                               (MAX_SECONDS_OPTION, retry_max_seconds))
            if value is not None
        )  # fmt: skip
        given = from_file + kw["storage_options"] + extra
        return command(*args, **{**kw, "storage_options": given})

    for option in (
        click.option(
            "--retry-max-seconds", type=click.FloatRange(min=0), default=None,
            help=f"give up a failing object-store request after this long (default "
            f"{DEFAULT_MAX_SECONDS:g})",
        ),
        click.option(
            "--retry-max-attempts", type=click.IntRange(min=1), default=None,
            help=f"attempts of a failing object-store request (default {DEFAULT_MAX_ATTEMPTS})",
        ),
        click.option(
            "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
            help="pyarrow.fs option, e.g. endpoint_override=host:9000 (repeatable; "
            "credentials belong in --storage-options-file: a command line shows in ps)",
        ),
        click.option(
            "--storage-options-file", type=click.Path(dir_okay=False), default=None,
            envvar=OPTIONS_FILE_ENV, show_envvar=True, metavar="FILE",
            help="pyarrow.fs options as KEY=VALUE lines (# comments), for credentials",
        ),
    ):  # fmt: skip
        run = option(run)
    return run


raw_option = click.option(
    "--raw", is_flag=True,
    help="values as stored (an aggregating operator's accumulators), not its aggregates",
)  # fmt: skip


allow_pickle_option = click.option(
    "--allow-pickle", is_flag=True,
    help="read stores recorded with the pickle serde (runs code from the checkpoint: "
    "only if you trust every writer of it)",
)  # fmt: skip


def _source(
    uri: str, storage_options: tuple[str, ...], allow_pickle: bool = False
) -> CheckpointSource | LocalSource:
    return open_source(uri, _options(storage_options), allow_pickle, waiting=_spinner(uri))


def _spinner(uri: str) -> Callable[[], Any] | None:
    """A spinner on stderr while the store is first reached, when stderr is a
    terminal (shown once the wait passes a second)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        return None
    return lambda: console.status(f"reaching {uri} ...", spinner="dots")


def _operator(source: CheckpointSource | LocalSource, operator: str | None) -> str:
    """The operator named, or the only one there is."""
    known = source.operators()
    if not known:
        raise CliError(f"no sessionstore state under {source.uri}")
    if operator is None:
        if len(known) > 1:
            raise CliError(f"{source.uri} has several operators; pick one with --operator "
                           f"({', '.join(known)})")  # fmt: skip
        return known[0]
    if operator not in known:
        raise CliError(f"no operator {operator!r} in {source.uri} (operators: {', '.join(known)})")
    return operator


@contextmanager
def _progress(enabled: bool = True) -> Iterator[Callable[[str, int, int], None] | None]:
    """A rich progress display on stderr when it is a terminal, else nothing."""
    from rich.console import Console

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        console=console, transient=True, redirect_stdout=False, redirect_stderr=False,
    ) as bar:  # fmt: skip
        tasks: dict[str, Any] = {}

        def update(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total or None)
            bar.update(tasks[label], completed=done, total=total or None)

        yield update


def _counted(chunks: Iterator[RowChunk], progress: Callable | None) -> Iterator[RowChunk]:
    """Chunks of rows, reporting the running count of rows to ``progress``."""
    if progress is None:
        yield from chunks
        return
    n = 0
    for chunk in chunks:
        n += chunk.size
        progress("rows", n, 0)
        yield chunk
    progress("rows", n, 0)


@click.group(help=__doc__.split("\n\n")[0])
@click.version_option(package_name="sessionstore", prog_name="sessionstore")
def cli() -> None:
    pass


def _stores_cell(records: dict[str, dict], stats: dict | None) -> str:
    lines = []
    for name, r in sorted(records.items()):
        line = f"{name} ({r['kind']}"
        if r["kind"] != "kv":
            line += f", retention {r['retention_ms']:,} ms"
        line += ")"
        s = (stats or {}).get(name)
        if s is not None:
            if s.get("stream_time") is not None:
                line += f" stream time {_iso(s['stream_time'])}"
            line += f" ~{s.get('keys', 0):,} keys"
        lines.append(line)
    return "\n".join(lines)


@cli.command("ls")
@click.argument("uri")
@storage_option
def ls(uri: str, storage_options: tuple[str, ...]) -> None:
    """Operators, partitions, versions, snapshots, sizes and stores (with their
    observed stream time and estimated key count) under URI."""
    from rich.console import Console
    from rich.table import Table

    source = _source(uri, storage_options)
    operators = source.operators()
    if not operators:
        raise CliError(f"no sessionstore state under {uri}")
    kind = "local databases" if source.local else "checkpoint"
    table = Table(title=f"sessionstore {kind} {uri}", show_lines=True)
    for column in ("operator", "partition", "version", "loadable", "snapshots", "bytes", "stores"):
        table.add_column(column)
    for operator in operators:
        records = source.store_records(operator)
        layout = source.layout(operator)
        for partition in source.partitions(operator):
            info = source.info(operator, partition)
            span = f"{info.loadable[0]}..{info.loadable[-1]}" if info.loadable else "-"
            table.add_row(
                operator, _partition_cell(partition, layout), str(info.latest), span,
                ",".join(map(str, info.snapshots)) or "-", f"{info.bytes:,}",
                _stores_cell(records, info.stats),
            )  # fmt: skip
    Console(width=220).print(table)


def _partition_cell(database: int, layout: tuple[int, int] | None) -> str:
    """A database's partition(s) for ``ls``: its number, or where it is a slab of
    several (``layout``: ``(slabs, partitions)``), the partitions it holds."""
    if layout is None or layout[0] == layout[1]:
        return str(database)
    slabs, count = layout
    held = range(database, count, slabs)
    shown = ", ".join(map(str, held[:3]))
    return f"{shown}, ... ({len(held)} of {count}, step {slabs})"


def _row_filter(key, key_json, key_from, key_to, from_ts, to_ts, as_of) -> RowFilter:
    return RowFilter(
        key=_key(key, key_json),
        key_from=_key(key_from, key_json),
        key_to=_key(key_to, key_json),
        from_ts=_time("--from-ts", from_ts),
        to_ts=_time("--to-ts", to_ts),
        as_of=_time("--as-of", as_of),
    )


@cli.command()
@click.argument("uri")
@click.option("--operator", default=None, help="default: the only operator there is")
@click.option("--store", "store_name", required=True)
@click.option("--partition", type=int, default=None)
@click.option("--version", type=int, default=None, help="default: the latest")
@click.option("--key", default=None, help="one key")
@click.option("--key-from", default=None, help="smallest key (inclusive)")
@click.option("--key-to", default=None, help="largest key (inclusive)")
@click.option("--key-json", is_flag=True, help="parse keys as JSON (ints, lists as tuples)")
@click.option("--from-ts", default=None, help="rows whose time span ends at or after this")
@click.option("--to-ts", default=None, help="rows whose time span starts at or before this")
@click.option("--as-of", default=None, help="versioned stores: the version valid then")
@click.option(
    "--format", "fmt", type=click.Choice(["jsonl", "table", "csv", "parquet"]), default="jsonl"
)
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="default: stdout")
@click.option("--limit", type=int, default=None)
@click.option(
    "--state-var", default=None,
    help="processor stores: the rows of this state variable as Spark's statestore reader "
    "shows them, one per value, list element or map entry",
)  # fmt: skip
@click.option("--no-flatten", is_flag=True, help="--state-var: a list or map in one row")
@click.option("--timers", is_flag=True, help="processor stores: one row per registered timer")
@raw_option
@epoch_ms_option
@storage_option
@allow_pickle_option
def dump(
    uri, operator, store_name, partition, version, key, key_from, key_to, key_json, from_ts,
    to_ts, as_of, fmt, output, limit, state_var, no_flatten, timers, raw, epoch_ms,
    storage_options, allow_pickle,
):  # fmt: skip
    """Rows of a store: key, window or validity, value (keys and values as JSON in
    csv and parquet). An aggregating operator's value is its aggregates by name: an
    object in jsonl, one column per aggregate in table, csv and parquet. Filter
    times are epoch ms or ISO-8601; table and csv show times as ISO-8601 UTC
    (--epoch-ms: integers), jsonl and parquet as epoch ms. Streams with flat memory."""
    if fmt == "parquet" and output is None:
        raise CliError("--format parquet needs --output FILE")
    if limit is not None and limit < 1:
        raise CliError(f"--limit must be at least 1, got {limit}")
    row_filter = _row_filter(key, key_json, key_from, key_to, from_ts, to_ts, as_of)
    source = _source(uri, storage_options, allow_pickle)
    operator = _operator(source, operator)
    with _progress() as progress:
        chunks = store_chunks(
            source, operator, store_name, None if partition is None else [partition], version,
            row_filter, limit, progress, raw,
        )  # fmt: skip
        if state_var is not None or timers:
            rows = _processor_rows(source, operator, store_name, version, rows_of(chunks),
                                   state_var, not no_flatten)  # fmt: skip
            chunks = chunks_of(rows)
        chunks = _counted(chunks, progress)
        first = next(chunks, None)  # errors surface before an output file is created
        chunks = _chain(first, chunks)
        times = () if fmt == "jsonl" else _time_columns(source, operator, store_name)
        if fmt in ("table", "csv") and not epoch_ms:
            chunks = _readable_times(chunks, times)
        out = (
            open(output, "w", encoding="utf-8", newline="") if output and fmt != "parquet" else None
        )
        try:
            written = write_chunks(chunks, fmt, out, output, times)
        finally:
            if out is not None:
                out.close()
    if fmt == "parquet":
        click.echo(f"wrote {written:,} rows to {output}")


def _processor_rows(
    source: Any, operator: str, store: str, version: int | None, rows: Iterator[dict],
    variable: str | None, flatten: bool,
) -> Iterator[dict]:  # fmt: skip
    """A processor store's rows as Spark's statestore reader shows one state
    variable (None: the registered timers); see :mod:`sessionstore.tools.processor_rows`."""
    if variable is None:
        return timer_rows(rows)
    declared = variable_declaration(source, operator, store, variable, version)
    return variable_rows(rows, variable, declared["kind"], declared["ttl"], flatten)


def _chain(first: RowChunk | None, rest: Iterator[RowChunk]) -> Iterator[RowChunk]:
    if first is not None:
        yield first
        yield from rest


@cli.command()
@click.argument("uri")
@click.option("--operator", default=None, help="default: the only operator there is")
@click.option("--store", "store_name", required=True)
@click.option("--key", required=True)
@click.option("--key-json", is_flag=True)
@click.option("--as-of", default=None)
@click.option("--version", type=int, default=None)
@click.option("--format", "fmt", type=click.Choice(["jsonl", "table", "csv"]), default="jsonl")
@raw_option
@epoch_ms_option
@storage_option
@allow_pickle_option
def get(
    uri, operator, store_name, key, key_json, as_of, version, fmt, raw, epoch_ms,
    storage_options, allow_pickle,
):  # fmt: skip
    """The rows of one key, searched in every partition (table and csv show times
    as ISO-8601 UTC, --epoch-ms as integers; jsonl keeps epoch ms)."""
    source = _source(uri, storage_options, allow_pickle)
    operator = _operator(source, operator)
    row_filter = RowFilter(key=_key(key, key_json), as_of=_time("--as-of", as_of))
    with _progress() as progress:
        chunks = store_chunks(
            source, operator, store_name, None, version, row_filter, None, progress, raw,
        )  # fmt: skip
        first = next(chunks, None)
        if first is None:
            raise CliError(f"key {key!r} not found in store {store_name!r}")
        chunks = _chain(first, chunks)
        if fmt in ("table", "csv") and not epoch_ms:
            chunks = _readable_times(chunks, _time_columns(source, operator, store_name))
        write_chunks(chunks, fmt, None, None)


def _checkpoint_only(source: CheckpointSource | LocalSource, command: str) -> CheckpointSource:
    if source.local:
        raise CliError(
            f"{command} works on a checkpoint root (object storage), and {source.uri} holds "
            "local databases; give the job's checkpointUri"
        )
    return source


@cli.command()
@click.argument("uri")
@click.option("--operator", default=None, help="default: every operator")
@storage_option
@allow_pickle_option
def verify(uri, operator, storage_options, allow_pickle):
    """Check every retained version: checksums, changelog continuity, snapshot
    files and hashes, and a replay to the latest version. Exit 1 on problems."""
    source = _checkpoint_only(_source(uri, storage_options), "verify")
    operators = [_operator(source, operator)] if operator else source.operators()
    if not operators:
        raise CliError(f"no sessionstore checkpoint under {uri}")
    with _progress() as progress:
        result = verify_checkpoint(uri, operators, source.storage_options, progress, allow_pickle)
    for problem in result.problems:
        click.echo(f"PROBLEM {problem}")
    for repair in result.repairs:
        click.echo(f"REPAIRED {repair}")
    click.echo(
        f"verified {result.partitions} partitions of {len(result.operators)} operators: "
        f"{len(result.problems)} problems"
        + (f", {len(result.repairs)} versions load only by a repair" if result.repairs else "")
    )
    if result.problems:
        sys.exit(1)


@cli.command()
@click.argument("uri")
@click.option("--operator", default=None, help="default: the only operator there is")
@click.option("--partition", type=int, required=True)
@click.option("--version", type=int, default=None, help="default: the latest")
@click.option("--to", "target", required=True, type=click.Path(file_okay=False))
@storage_option
@allow_pickle_option
def restore(uri, operator, partition, version, target, storage_options, allow_pickle):
    """Materialise a version of a partition as a local RocksDB directory."""
    import os
    import shutil

    if os.path.exists(target) and os.listdir(target):
        raise CliError(f"{target} exists and is not empty; restore into a new directory")
    source = _checkpoint_only(_source(uri, storage_options, allow_pickle), "restore")
    operator = _operator(source, operator)
    layout = source.layout(operator)
    if layout is not None and layout[0] != layout[1] and 0 <= partition < layout[1]:
        slabs, count = layout
        click.echo(
            f"partition {partition} of {operator} is kept with {count // slabs - 1} others in "
            f"database {partition % slabs}: restoring that database"
        )
        partition %= slabs
    if partition not in source.partitions(operator):
        raise CliError(
            f"operator {operator!r} has no partition {partition} "
            f"(partitions: {source.partitions(operator)})"
        )
    with tempfile.TemporaryDirectory(prefix="sessionstore-restore-") as workdir:
        with _progress() as progress:
            with source.open(operator, partition, version, progress, workdir) as (restored, _):
                pass  # closed on exit, so the directory can move
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        if os.path.isdir(target):
            os.rmdir(target)  # empty (checked above): moving into it would nest the database
        shutil.move(LocalPartition(workdir, operator, partition).db, target)
    click.echo(f"restored {operator}/{partition} version {restored} to {target}")


@cli.command()
@click.argument("uri")
@click.option("--operator", required=True)
@click.option("--partitions", "count", type=int, required=True, help="the new partition count")
@click.option("--to", "target", required=True, help="a new, empty checkpoint location")
@click.option("--version", type=int, default=None, help="default: the latest")
@click.option(
    "--key-types", default=None, metavar="T1,T2",
    help="Spark types of the key columns, e.g. string,long (only for checkpoints "
    "that do not record them)",
)  # fmt: skip
@storage_option
@allow_pickle_option
def repartition(uri, operator, count, target, version, key_types, storage_options, allow_pickle):
    """Rescale an operator's checkpoint to N partitions: version V of every
    partition, each row moved where repartition(N, *key columns) sends its key,
    written as a new checkpoint at URI2 that a query restarted with
    num_partitions=N continues from. URI is only read."""
    from sessionstore.checkpoint.offline.repartition import repartition_checkpoint

    source = _checkpoint_only(_source(uri, storage_options), "repartition")
    types = None if key_types is None else [t for t in key_types.split(",") if t.strip()]
    with _progress() as progress:
        done = repartition_checkpoint(
            uri, operator, count, target, version, types, source.storage_options,
            progress=progress, allow_pickle=allow_pickle,
        )  # fmt: skip
    click.echo(
        f"repartitioned {operator} version {done['version']} from {done['from_partitions']} "
        f"to {done['partitions']} partitions: {done['rows']:,} rows to {target}"
    )
    if done["event_time"] is None:
        click.echo(
            f"note: {uri} holds no shared event time after batch {done['version'] - 1}; "
            "the restarted query's idle partitions catch up one batch later"
        )


@cli.command()
@click.argument("uri")
@click.option("--operator", required=True)
@click.option("--key", "keys", multiple=True, help="a key to erase (repeatable)")
@click.option(
    "--keys-from", default=None, type=click.Path(dir_okay=False, exists=True),
    help="a Parquet file whose columns are the key columns, in order",
)  # fmt: skip
@click.option(
    "--force", is_flag=True,
    help="erase even though the checkpoint was committed to recently (docs/rewrite.md)",
)  # fmt: skip
@storage_option
@allow_pickle_option
def erase(uri, operator, keys, keys_from, force, storage_options, allow_pickle):
    """Erase every row of the given keys from every store of an operator, in its
    latest version and in its retained history (older versions are deleted). The
    query must be stopped. docs/rewrite.md."""
    from sessionstore.checkpoint.offline.erase import erase as erase_keys
    from sessionstore.checkpoint.offline.erase import recorded_key_types, typed_key

    source = _checkpoint_only(_source(uri, storage_options), "erase")
    key_types = recorded_key_types(source.root.child(operator)) if keys else None
    typed = [typed_key(k, key_types) for k in keys]
    with _progress() as progress:
        done = erase_keys(
            uri, operator, key=typed, keys_from=keys_from,
            storage_options=source.storage_options, force=force,
            allow_pickle=allow_pickle, progress=progress,
        )  # fmt: skip
    if done["resumed"]:
        click.echo(f"finished the interrupted change {done['resumed']}")
    for store, rows in done["rows"].items():
        click.echo(f"{store}: {rows:,} rows erased")
    click.echo(
        f"erased {done['keys']:,} keys (sha256 {done['keys_sha256']}) from {operator}: "
        f"version {done['version']} is a new commit; versions before it are no longer "
        "loadable"
    )


def _function(spec: str) -> Any:
    """The function ``module:name`` (``--function``), imported."""
    import importlib

    module, _, name = spec.partition(":")
    if not module or not name:
        raise CliError(f"--function {spec!r}: give it as MODULE:NAME (e.g. fixes:double_total)")
    if os.getcwd() not in sys.path:  # a module of the current directory, as `python -m`
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        raise CliError(f"--function {spec!r}: cannot import {module!r} ({exc})") from None
    fn = getattr(found, name, None)
    if not callable(fn):
        raise CliError(f"--function {spec!r}: {module!r} has no function {name!r}")
    return fn


@cli.command()
@click.argument("uri")
@click.option("--operator", required=True)
@click.option("--function", "function", required=True,
              help="MODULE:NAME of a function of a row (importable from here)")  # fmt: skip
@click.option("--store", default=None, help="default: the operator's only session store")
@click.option("--raw", is_flag=True, help="the function sees and returns accumulators")
@click.option(
    "--force", is_flag=True,
    help="rewrite even though the checkpoint was committed to recently (docs/rewrite.md)",
)  # fmt: skip
@storage_option
@allow_pickle_option
def rewrite(uri, operator, function, store, raw, force, storage_options, allow_pickle):
    """Rewrite the rows of a store with a Python function (sessionstore.rewrite):
    each row as dump shows it, changed, kept or deleted (None), every row checked
    before anything is written. The query must be stopped. docs/rewrite.md."""
    from sessionstore.tools.rewrite import rewrite as rewrite_rows

    source = _checkpoint_only(_source(uri, storage_options), "rewrite")
    fn = _function(function)
    with _progress() as progress:
        done = rewrite_rows(
            uri, operator, fn, store=store, raw=raw, storage_options=source.storage_options,
            force=force, allow_pickle=allow_pickle, progress=progress,
        )  # fmt: skip
    if done["resumed"]:
        click.echo(f"finished the interrupted change {done['resumed']}")
    click.echo(
        f"rewrote {done['store']} of {operator}: {done['rows']:,} rows, {done['changed']:,} "
        f"changed, {done['deleted']:,} deleted; version {done['version']} is a new commit; "
        "versions before it are no longer loadable"
    )


_SPARK = "▁▂▃▄▅▆▇█"


def _spark_line(values: list[float | None], width: int = 60) -> str:
    """``values`` as a line of block characters (the largest a full block; unknown
    ones a space), at most ``width`` wide (each character the largest of its
    share of values)."""
    if len(values) > width:
        step = len(values) / width
        groups = [values[int(i * step) : int((i + 1) * step)] for i in range(width)]
        values = [max((v for v in g if v is not None), default=None) for g in groups]
    top = max((v for v in values if v is not None), default=0) or 1
    return "".join(
        " " if v is None else _SPARK[min(len(_SPARK) - 1, int(v / top * (len(_SPARK) - 1)))]
        for v in values
    )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _stats_table(uri: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console, Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"sessionstore stats {uri}")
    columns = [
        ("operator", "operator"), ("batch", "batch"), ("partitions", "parts"),
        ("rows_total", "rows"), ("rows_updated", "updated"), ("rows_removed", "removed"),
        ("late_dropped", "late"), ("emitted", "emitted"), ("load_ms_max", "load ms max"),
        ("loads", "loads"), ("commit_ms_p50", "commit ms p50"), ("commit_ms_max", "max"),
        ("uploaded_bytes", "uploaded"), ("snapshot_lag_max", "snap lag"),
        ("memory_bytes_max", "native mem"), ("repaired", "repaired"),
    ]  # fmt: skip
    for _, title in columns:
        left = title in ("operator", "loads")
        table.add_column(title, justify="left" if left else "right", no_wrap=left)
    for row in rows:
        loads = " ".join(f"{k}:{n}" for k, n in row["loads"].items()) or "-"
        table.add_row(*(loads if f == "loads" else _cell(row[f]) for f, _ in columns))
    console = Console(width=220)  # as ls: a pipe or a narrow terminal gets whole rows
    console.print(table)
    charts = []
    for operator in dict.fromkeys(r["operator"] for r in rows):
        mine = [r for r in rows if r["operator"] == operator]
        span = f"batches {mine[0]['batch']}..{mine[-1]['batch']}"
        for label, field, style in (
            ("commit ms p50", "commit_ms_p50", "cyan"),
            ("state rows   ", "rows_total", "green"),
        ):
            values = [r[field] for r in mine]
            top = max((v for v in values if v is not None), default=None)
            line = Text(f"{operator} {label} ")
            line.append(_spark_line(values), style=style)
            line.append(f"  max {_cell(top)}")
            charts.append(line)
        charts.append(Text(f"{operator} {span}", style="dim"))
    console.print(Panel(Group(*charts), title="trend over the batches shown", expand=False))


@cli.command()
@click.argument("uri")
@click.option("--operator", default=None, help="default: every operator")
@click.option("--last", type=click.IntRange(min=1), default=None, help="the N newest batches")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table",
    help="json: one JSON object per line",
)  # fmt: skip
@storage_option
@allow_pickle_option
def stats(uri, operator, last, fmt, storage_options, allow_pickle):
    """State metrics per operator and micro-batch, over its partitions: rows,
    late drops, output, loads, commit times, uploads, snapshot lag, memory, and
    restores repaired around an unusable snapshot."""
    from sessionstore.checkpoint.records.metrics import STATS_FIELDS

    source = _checkpoint_only(_source(uri, storage_options, allow_pickle), "stats")
    operators = [_operator(source, operator)] if operator else source.operators()
    if not operators:
        raise CliError(f"no sessionstore checkpoint under {uri}")
    for op in operators:  # stats reads only headers, but is a reader like the others
        source.check_pickle(op)
    rows = [row for op in operators for row in source.batch_metrics(op, last)]
    if fmt == "json":
        for row in rows:
            click.echo(json.dumps({f: row[f] for f in STATS_FIELDS}))
        return
    if not rows:
        raise CliError(f"no committed micro-batch under {uri}")
    _stats_table(uri, rows)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: errors become one line and exit status 2."""
    pandas_on_demand()  # pandas only where a command imports it (sessionstore.arrow_pandas)
    try:
        cli.main(args=argv, prog_name="sessionstore", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"sessionstore: {exc.format_message()}", err=True)
        sys.exit(2)
    except StoreUnreachableError as exc:
        click.echo(f"sessionstore: {exc}", err=True)
        if exc.timed_out:
            # the unanswered request still runs in a helper thread, and pyarrow's
            # exit handlers would wait for it: leave now, nothing is open yet
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(2)
        sys.exit(2)
    except (SessionStoreError, FileNotFoundError, ValueError, OSError) as exc:
        click.echo(f"sessionstore: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
