"""Shared helpers for the benchmarks: timing, raw rocksdict handles and tables."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from contextlib import contextmanager

import numpy as np
from rocksdict import Options, Rdict


@contextmanager
def scratch_dir(prefix: str):
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def raw_rdict(path: str, families: list[str]) -> Rdict:
    """A raw-mode rocksdict with the same options family as StateDB's defaults."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    return Rdict(path, opts, column_families={f: opts for f in families})


def machine() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores"


def print_table(title: str, headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    text = "\n".join([f"### {title}", "", line, sep, *body, ""])
    print(text, flush=True)
    return text


class Trace:
    """Records the RocksDB-level operations a StateDB performs."""

    def __init__(self, db) -> None:
        self.ops: list[tuple] = []
        self._db = db
        orig_get, orig_many, orig_scan = db.get, db.get_many, db._scan
        orig_scan_list = db.scan_list
        orig_commit = db._commit
        ops = self.ops

        def get(cf, key):
            ops.append(("get", cf, key))
            return orig_get(cf, key)

        def get_many(cf, keys):
            ops.append(("multi", cf, list(keys)))
            return orig_many(cf, keys)

        def scan(cf, lo, hi, reverse):
            ops.append(("scan", cf, lo, hi, reverse))
            return orig_scan(cf, lo, hi, reverse)

        def scan_list(cf, lo=None, hi=None, reverse=False):
            ops.append(("scan", cf, lo, hi, reverse))
            return orig_scan_list(cf, lo, hi, reverse)

        def commit():
            buf = db._buffer
            ops.append(("write", [(cf, dict(e)) for cf, e in buf.families.items()]))
            orig_commit()

        db.get, db.get_many, db._scan, db._commit = get, get_many, scan, commit
        db.scan_list = scan_list

    def counts(self) -> dict[str, int]:
        """RocksDB operations by kind: gets (each key of a multi-get counts), scans
        and written entries."""
        out = {"get": 0, "scan": 0, "write": 0}
        for op in self.ops:
            if op[0] == "get":
                out["get"] += 1
            elif op[0] == "multi":
                out["get"] += len(op[2])
            elif op[0] == "scan":
                out["scan"] += 1
            else:
                out["write"] += sum(len(e) for _, e in op[1])
        return out


def zipf_users(rng: np.random.Generator, n: int, keys: int) -> np.ndarray:
    """``n`` user names (``user-000123``) drawn from ``keys`` users with Zipf
    frequencies (s=1.1), the key stream every Spark and operator benchmark uses.
    Draws are rejected above ``keys``, so few keys reject most of them: it draws
    until there are enough (the same draws, and so the same stream, for a seed)."""
    ranks = np.empty(0, dtype=np.int64)
    while len(ranks) < n:
        drawn = rng.zipf(1.1, size=n * 2)
        ranks = np.concatenate([ranks, drawn[drawn <= keys]])
    return np.array([f"user-{i:06d}" for i in range(keys)], dtype=object)[ranks[:n] - 1]
