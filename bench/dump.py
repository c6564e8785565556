"""CPU time of ``sessionstore dump`` of a large local database, against its floor.

The database is the one ``tests/tools/test_cli_local.py`` dumps to check that
memory stays flat: a session store ``sessions`` of --sessions sessions
(``("user0000123", 123, 1123, {"clicks": 123 % 97})``), written in 10 batches.
Each case runs in a child process and is charged the CPU time (user + system) the
child used (``getrusage(RUSAGE_CHILDREN)`` before and after), interpreter start
and imports included:

* ``floor: rocksdict`` iterates the store's column family with raw rocksdict
  (opened read-only) and does nothing with the rows: what reading the bytes costs;
* ``floor: read_rows`` iterates ``store.read_rows()`` of the store opened through
  the CLI's own reader (``open_source``, a RocksDB secondary instance): the rows as
  the store decodes them, one dict each;
* ``dump --limit 1`` is the command's fixed cost (imports, opening the database);
* ``dump jsonl`` and ``dump parquet`` dump every row to a file.

The per-row cost of a dump is its CPU time less that of ``dump --limit 1`` (of
the same tree), over the rows; that of a floor the CPU time of its loop over the
rows (the child measures it with ``time.process_time``). One untimed warm-up of
every case first (the page cache; the modules' byte code, kept in a scratch
folder), then --rounds rounds, each running every case once, the order rotating
from round to round (the VM drifts); best and median of the rounds.
``--compare TREE`` also times the dumps of another source tree (a git worktree:
the children run with ``PYTHONPATH`` set to it) in the same rounds.

Run: ``.venv/bin/python bench/dump.py [--sessions 1000000] [--rounds 5]
[--compare ../other-tree]`` (tiny check: ``--sessions 20000 --rounds 1``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
sys.path.insert(0, TREE)

from bench.common import machine, print_table, scratch_dir  # noqa: E402
from sessionstore import StateDB  # noqa: E402

#: Raw rocksdict over the store's segment column families, read-only.
FLOOR_ROCKSDICT = textwrap.dedent(
    """
    import sys, time
    from rocksdict import AccessType, Options, Rdict

    path, prefix = sys.argv[1], sys.argv[2]
    families = Rdict.list_cf(path)
    opts = Options(raw_mode=True)
    db = Rdict(path, opts, column_families={f: opts for f in families},
               access_type=AccessType.read_only())
    n, t0 = 0, time.process_time()
    for name in families:
        if name.startswith(prefix):
            for _ in db.get_column_family(name).items():
                n += 1
    loop = time.process_time() - t0
    db.close()
    print(n, loop)
    """
)

#: ``store.read_rows()`` of the store opened by the CLI's reader.
FLOOR_READ_ROWS = textwrap.dedent(
    """
    import sys, time
    from sessionstore.tools.reader import open_source

    source = open_source(sys.argv[1])
    operator = source.operators()[0]
    with source.open(operator, source.partitions(operator)[0]) as (_, stores):
        n, t0 = 0, time.process_time()
        for _ in stores[sys.argv[2]].read_rows():
            n += 1
        loop = time.process_time() - t0
    print(n, loop)
    """
)


def build(db_dir: str, sessions: int) -> None:
    """The test's database: ``sessions`` sessions of distinct keys in 10 batches."""
    step = max(1, sessions // 10)
    with StateDB.open(db_dir) as db:
        store = db.session_store("sessions", 10**12)
        for lo in range(0, sessions, step):
            with db.batch():
                store.put_many(
                    (f"user{i:07d}", i, i + 1000, {"clicks": i % 97})
                    for i in range(lo, min(lo + step, sessions))
                )


def child_cpu(argv: list[str], tree: str, pycache: str) -> tuple[float, float | None]:
    """CPU seconds (user + system) of running ``argv`` with ``tree`` first on the
    path, and the seconds of its loop over the rows where it reports them (a floor).
    Byte code is kept in ``pycache``: every tree's modules are compiled once, in the
    warm-up, as an installed package's are, and no tree gets files written into it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, PYTHONPATH=tree, PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # run in the tree: `python -m` and `-c` put the working directory first on the path
    done = subprocess.run(
        argv, env=env, cwd=tree, capture_output=True, text=True, timeout=1800
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{argv} failed:\n{done.stderr[-3000:]}")
    loop = float(done.stdout.split()[1]) if argv[1] == "-c" else None
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), loop


def cases(db_dir: str, out_dir: str, trees: dict[str, str]) -> dict[str, tuple[list[str], str]]:
    """Every timed case: its name -> (argv, source tree)."""
    py = sys.executable
    out = {
        "floor: rocksdict": ([py, "-c", FLOOR_ROCKSDICT, db_dir, "sessions."], TREE),
        "floor: read_rows": ([py, "-c", FLOOR_READ_ROWS, db_dir, "sessions"], TREE),
    }
    for label, tree in trees.items():
        dump = [py, "-m", "sessionstore.tools.cli", "dump", db_dir, "--store", "sessions"]
        out[f"{label}dump --limit 1"] = (
            [*dump, "--limit", "1", "--output", os.path.join(out_dir, "one.jsonl")], tree
        )  # fmt: skip
        for fmt in ("jsonl", "parquet"):
            target = os.path.join(out_dir, f"{label.strip(': ') or 'this'}.{fmt}")
            out[f"{label}dump {fmt}"] = ([*dump, "--format", fmt, "--output", target], tree)
    return out


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compare", default=None, help="another source tree to time the dumps of")
    args = ap.parse_args(argv)
    trees = {"": TREE}
    if args.compare:
        trees["compared: "] = os.path.abspath(args.compare)
    with scratch_dir("bench-dump-") as tmp:
        db_dir = os.path.join(tmp, "db")
        build(db_dir, args.sessions)
        timed = cases(db_dir, tmp, trees)
        names, pycache = list(timed), os.path.join(tmp, "pycache")
        for name in names:  # warm-up, untimed
            child_cpu(*timed[name], pycache)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        loops: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                cpu, loop = child_cpu(*timed[name], pycache)
                seconds[name].append(cpu)
                if loop is not None:
                    loops[name].append(loop)
            print(f"round {r}: " + ", ".join(f"{n} {s[-1]:.2f}" for n, s in seconds.items()),
                  flush=True)  # fmt: skip
    return report(seconds, loops, args.sessions, args.rounds, trees)


def report(
    seconds: dict[str, list[float]], loops: dict[str, list[float]], rows: int, rounds: int,
    trees: dict[str, str],
) -> str:  # fmt: skip
    """The table: best and median CPU seconds, and µs per row (a dump's over its
    fixed cost, a floor's loop alone)."""
    table = []
    for name, values in seconds.items():
        label = next((t for t in trees if t and name.startswith(t)), "")
        best, median = min(values), statistics.median(values)
        if loops[name]:
            per_row = f"{min(loops[name]) / rows * 1e6:.2f}"
        elif name.endswith("--limit 1"):
            per_row = "-"
        else:
            per_row = f"{(best - min(seconds[f'{label}dump --limit 1'])) / rows * 1e6:.2f}"
        table.append([name, f"{best:.2f}", f"{median:.2f}", per_row])
    return print_table(
        f"sessionstore dump, {rows:,} sessions, {rounds} rounds ({machine()})",
        ["case", "CPU-s best", "CPU-s median", "µs per row (best)"],
        table,
    )


if __name__ == "__main__":
    main()
