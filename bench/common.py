"""Shared helpers for the benchmarks: timing, raw rocksdict handles and tables."""

from __future__ import annotations

import gc
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager

from rocksdict import Options, Rdict


def best_of(fn: Callable[[], int], repeat: int = 3) -> float:
    """Best ops/s of ``repeat`` runs; ``fn`` does the work and returns its op count."""
    best = 0.0
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        n = fn()
        dt = time.perf_counter() - t0
        best = max(best, n / dt)
    return best


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
