"""``sessionstore`` command line: look at checkpointed state without stopping the job.

    sessionstore ls URI
    sessionstore dump URI --operator OP --store NAME [--partition P] [--version N]
                          [--key K] [--format jsonl|table] [--limit N]
    sessionstore get URI --operator OP --store NAME --key K [--as-of T] [--version N]
    sessionstore verify URI [--operator OP]
    sessionstore restore URI --operator OP --partition P [--version N] --to DIR

``URI`` is a checkpoint root (``file://``, a path, ``s3://`` with ``--storage-option
k=v`` or the AWS environment). Reading never touches a running job's database:
state is restored from the checkpoint into a temporary directory. Errors print one
line and exit with status 2.
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

import click

from sessionstore.checkpoint.filesystem import Storage, open_filesystem
from sessionstore.checkpoint.layout import PartitionFiles
from sessionstore.checkpoint.provider import StateStoreProvider
from sessionstore.checkpoint.spec import StoreSpec
from sessionstore.errors import SessionStoreError
from sessionstore.inspect import operator_metadata, partitions, store_rows
from sessionstore.inspect import operators as list_operators

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


def _key(text: str | None, as_json: bool) -> Any:
    if text is None or not as_json:
        return text
    value = json.loads(text)
    return tuple(value) if isinstance(value, list) else value


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, tuple):
        return list(value)
    return value


storage_option = click.option(
    "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
    help="pyarrow.fs option, e.g. endpoint_override=host:9000 (repeatable)",
)  # fmt: skip


@click.group(help=__doc__.split("\n\n")[0])
def cli() -> None:
    pass


@cli.command("ls")
@click.argument("uri")
@storage_option
def ls(uri: str, storage_options: tuple[str, ...]) -> None:
    """Operators, partitions, versions, snapshots, sizes and stores under URI."""
    from rich.console import Console
    from rich.table import Table

    root = open_filesystem(uri, _options(storage_options))
    operators = list_operators(root)
    if not operators:
        raise CliError(f"no sessionstore checkpoint under {uri}")
    table = Table(title=f"sessionstore checkpoint {uri}")
    for column in ("operator", "partition", "latest", "loadable", "snapshots", "bytes", "stores"):
        table.add_column(column)
    for operator in operators:
        meta = operator_metadata(root, operator)
        stores = ", ".join(
            f"{s['name']} ({s['kind']}, {s['retention_ms']} ms)" for s in meta["stores"]
        )
        for partition in partitions(root, operator):
            files = PartitionFiles(root.child(f"{operator}/{partition}"))
            loadable = files.loadable()
            span = f"{loadable[0]}..{loadable[-1]}" if loadable else "-"
            snaps = ",".join(map(str, sorted(files.snapshots()))) or "-"
            table.add_row(
                operator, str(partition), str(files.latest()), span, snaps,
                f"{files.bytes_used():,}", stores,
            )  # fmt: skip
    Console(width=200).print(table)


@cli.command()
@click.argument("uri")
@click.option("--operator", required=True)
@click.option("--store", "store_name", required=True)
@click.option("--partition", type=int, default=None)
@click.option("--version", type=int, default=None, help="default: the latest")
@click.option("--key", default=None)
@click.option("--key-json", is_flag=True, help="parse --key as JSON (ints, lists as tuples)")
@click.option("--as-of", type=int, default=None, help="versioned stores: the version valid then")
@click.option(
    "--format", "fmt", type=click.Choice(["jsonl", "table", "csv", "parquet"]), default="jsonl"
)
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="default: stdout")
@click.option("--limit", type=int, default=None)
@storage_option
def dump(
    uri, operator, store_name, partition, version, key, key_json, as_of, fmt, output, limit,
    storage_options,
):  # fmt: skip
    """Rows of a store: key, window or validity, value (keys and values as JSON in
    csv and parquet)."""
    rows = store_rows(
        uri, operator, store_name, None if partition is None else [partition], version,
        _key(key, key_json), as_of, limit, _options(storage_options),
    )  # fmt: skip
    if fmt == "parquet" and output is None:
        raise CliError("--format parquet needs --output FILE")
    out = open(output, "w", encoding="utf-8", newline="") if output and fmt != "parquet" else None
    try:
        _write_rows(rows, fmt, out, output)
    finally:
        if out is not None:
            out.close()


def _write_rows(rows, fmt: str, out, output: str | None) -> None:
    if fmt == "jsonl":
        for row in rows:
            line = json.dumps({k: _jsonable(v) for k, v in row.items()}, default=str)
            click.echo(line, file=out)
        return
    if fmt in ("csv", "parquet"):
        flat = [
            {k: v if k == "partition" or isinstance(v, int) or v is None else _as_text(v)
             for k, v in row.items()}
            for row in rows
        ]  # fmt: skip
        if fmt == "csv":
            import csv

            writer = None
            for row in flat:
                if writer is None:
                    writer = csv.DictWriter(out or sys.stdout, fieldnames=list(row))
                    writer.writeheader()
                writer.writerow(row)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(flat), output)
        click.echo(f"wrote {len(flat):,} rows to {output}")
        return
    from rich.console import Console
    from rich.table import Table

    materialised = list(rows)
    table = Table()
    for column in materialised[0] if materialised else ["partition", "key", "value"]:
        table.add_column(column)
    for row in materialised:
        table.add_row(*(str(_jsonable(v)) for v in row.values()))
    Console(width=200, file=out).print(table)


def _as_text(value: Any) -> str:
    """Keys and values as text for flat formats: strings as they are, others JSON."""
    return value if isinstance(value, str) else json.dumps(_jsonable(value), default=str)


@cli.command()
@click.argument("uri")
@click.option("--operator", required=True)
@click.option("--store", "store_name", required=True)
@click.option("--key", required=True)
@click.option("--key-json", is_flag=True)
@click.option("--as-of", type=int, default=None)
@click.option("--version", type=int, default=None)
@storage_option
def get(uri, operator, store_name, key, key_json, as_of, version, storage_options):
    """The rows of one key, searched in every partition."""
    found = False
    rows = store_rows(
        uri, operator, store_name, None, version, _key(key, key_json), as_of, None,
        _options(storage_options),
    )  # fmt: skip
    for row in rows:
        click.echo(json.dumps({k: _jsonable(v) for k, v in row.items()}, default=str))
        found = True
    if not found:
        raise CliError(f"key {key!r} not found in store {store_name!r}")


def _problems(root: Storage, operator: str, partition: int, uri: str, options) -> list[str]:
    """Everything wrong with one partition's checkpoint (empty when it is sound)."""
    from sessionstore.checkpoint.changelog import decode_changelog
    from sessionstore.checkpoint.snapshot import download_snapshot

    where = f"{operator}/{partition}"
    files = PartitionFiles(root.child(where))
    changelogs, snapshots = files.changelogs(), files.snapshots()
    problems = []
    latest = files.latest()
    base = min(snapshots, default=0)
    for v in range(base + 1, latest + 1):
        if v not in changelogs and v not in snapshots:
            problems.append(f"{where}: changelog of version {v} is missing (gap after {v - 1})")
    for v in sorted(changelogs):
        try:
            decode_changelog(
                files.storage.read(f"changelog/{v}.changelog"), f"{where}/changelog/{v}", v
            )
        except SessionStoreError as exc:
            problems.append(str(exc))
    for v in sorted(snapshots):
        with tempfile.TemporaryDirectory(prefix="sessionstore-verify-") as tmp:
            try:
                download_snapshot(files.storage, v, tmp)
            except (SessionStoreError, FileNotFoundError) as exc:
                problems.append(str(exc))
    if not problems and latest:
        meta = operator_metadata(root, operator)
        specs = [StoreSpec.from_record(r) for r in meta["stores"]]
        with tempfile.TemporaryDirectory(prefix="sessionstore-verify-") as tmp:
            provider = StateStoreProvider(
                uri, operator, partition, specs, tmp, storage_options=options
            )
            try:
                provider.get_store(latest).abort()
            except (SessionStoreError, FileNotFoundError) as exc:
                problems.append(f"{where}: replay to version {latest} failed: {exc}")
            finally:
                provider.close()
    return problems


@cli.command()
@click.argument("uri")
@click.option("--operator", default=None, help="default: every operator")
@storage_option
def verify(uri, operator, storage_options):
    """Check every retained version: checksums, changelog continuity, snapshot
    files and hashes, and a replay to the latest version. Exit 1 on problems."""
    options = _options(storage_options)
    root = open_filesystem(uri, options)
    operators = [operator] if operator else list_operators(root)
    if not operators:
        raise CliError(f"no sessionstore checkpoint under {uri}")
    problems, checked = [], 0
    for op in operators:
        operator_metadata(root, op)
        for partition in partitions(root, op):
            problems += _problems(root, op, partition, uri, options)
            checked += 1
    for problem in problems:
        click.echo(f"PROBLEM {problem}")
    click.echo(
        f"verified {checked} partitions of {len(operators)} operators: {len(problems)} problems"
    )
    if problems:
        sys.exit(1)


@cli.command()
@click.argument("uri")
@click.option("--operator", required=True)
@click.option("--partition", type=int, required=True)
@click.option("--version", type=int, default=None, help="default: the latest")
@click.option("--to", "target", required=True, type=click.Path(file_okay=False))
@storage_option
def restore(uri, operator, partition, version, target, storage_options):
    """Materialise a version of a partition as a local RocksDB directory."""
    import os
    import shutil

    if os.path.exists(target) and os.listdir(target):
        raise CliError(f"{target} exists and is not empty; restore into a new directory")
    options = _options(storage_options)
    root = open_filesystem(uri, options)
    specs = [StoreSpec.from_record(r) for r in operator_metadata(root, operator)["stores"]]
    with tempfile.TemporaryDirectory(prefix="sessionstore-restore-") as workdir:
        provider = StateStoreProvider(
            uri, operator, partition, specs, workdir, storage_options=options
        )
        handle = provider.get_store(provider.latest_version() if version is None else version)
        restored = handle.version
        handle.abort()
        provider.close()
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        shutil.move(os.path.join(workdir, operator, str(partition), "db"), target)
    click.echo(f"restored {operator}/{partition} version {restored} to {target}")


def main(argv: list[str] | None = None) -> None:
    """Console entry point: errors become one line and exit status 2."""
    try:
        cli.main(args=argv, prog_name="sessionstore", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"sessionstore: {exc.format_message()}", err=True)
        sys.exit(2)
    except (SessionStoreError, FileNotFoundError, ValueError, OSError) as exc:
        click.echo(f"sessionstore: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
