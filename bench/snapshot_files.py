"""Files and bytes per snapshot, and restore time: physical vs virtual column families.

The state of the 1M-event stream at 200 partitions (--events events over --keys
Zipf keys, as bench/spark_sessionize.py draws them, in --batches micro-batches;
gap 60 s, no grace), hash-partitioned into --partitions partition databases. Each
partition runs the session aggregator's batch path (final mode, count) on its share
of every micro-batch, with the store's segments as the Spark operator makes them
(operator_segment_interval: hour-long), and commits each batch as the provider does
(prepare, then apply). Each committed batch is written to two databases:

* **physical** (today's layout): every segment, the end index and ``meta`` are
  column families, as StateDB keeps them;
* **virtual**: one column family, each row's key prefixed with its family's name
  and a 0x00 byte (family names never hold one), a dropped family becoming a
  DeleteRange over its prefix (Spark's virtual column families use a 2-byte id).

After half the batches and after the last one each database takes a snapshot as the
provider does (a RocksDB checkpoint uploaded with ``upload_snapshot``, content
addressed, to a local ``file://`` store); the last one is restored from it with
``download_snapshot`` plus an open (a new executor's restore). Reported for the last
snapshot, summed over the partitions, in the same run: the files it lists (manifest
excluded) and the SST files among them, their bytes, the files and bytes it uploads
(those the earlier snapshot did not have), and the restore time.

Run: ``.venv/bin/python bench/snapshot_files.py [--partitions 200] [--events 1000000]``;
``--partitions 4 --events 20000`` checks that it works.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rocksdict import WriteBatch  # noqa: E402

from bench.common import machine, print_table, scratch_dir, zipf_users  # noqa: E402
from sessionstore import StateDB  # noqa: E402
from sessionstore.checkpoint.records.layout import FILES_DIR  # noqa: E402
from sessionstore.checkpoint.records.snapshot import download_snapshot, upload_snapshot  # noqa: E402
from sessionstore.checkpoint.storage.filesystem import open_filesystem  # noqa: E402
from sessionstore.engine.db import Database  # noqa: E402
from sessionstore.engine.write_buffer import WriteBuffer  # noqa: E402
from sessionstore.operators import SessionWindowAggregator, SessionWindows  # noqa: E402
from sessionstore.stores.segments import operator_segment_interval  # noqa: E402

GAP = 60_000
RETENTION = GAP + 1  # sessionize's store: gap + grace + 1
DATA = "data"


def events(n: int, keys: int) -> tuple[list[str], list[int]]:
    """The stream of bench/spark_sessionize.py (same seed and distribution)."""
    rng = np.random.default_rng(5)
    names = zipf_users(rng, n, keys)
    ts = 1_700_000_000_000 + np.cumsum(rng.integers(0, 20, size=n))
    return names.tolist(), ts.tolist()


def prefix(cf: str) -> bytes:
    return cf.encode() + b"\x00"


def apply_virtual(db: Database, buf: WriteBuffer) -> None:
    """The committed batch ``buf`` in the virtual layout: one family, prefixed keys."""
    family, handle = db._rdict_cf(DATA), db._handle(DATA)
    wb = WriteBatch(raw_mode=True)
    for cf, entries in buf.families.items():
        p = prefix(cf)
        for key, value in entries.items():
            if value is None:
                wb.delete(p + key, handle)
            else:
                wb.put(p + key, value, handle)
    family.write(wb)
    for cf in buf.dropped:  # expiry: a range delete instead of a family drop
        family.delete_range(prefix(cf), cf.encode() + b"\x01")


def snapshot(db: Database, root: str, name: str, version: int) -> dict[str, int]:
    """Snapshot ``version`` of ``db`` uploaded as the provider does: what it lists,
    and what it uploads (files earlier snapshots of the partition lack)."""
    checkpoint = os.path.join(root, "checkpoint", f"{name}-{version}")
    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
    db.checkpoint(checkpoint)
    storage = open_filesystem("file://" + os.path.join(root, "remote", name))
    known = set(storage.list(FILES_DIR))
    manifest = upload_snapshot(storage, checkpoint, version)
    pack = manifest["pack"]
    files = manifest["files"] + (pack["files"] if pack else [])
    objects = manifest["files"] + ([pack] if pack else [])  # what the store holds
    return {
        "objects": len(objects),
        "sst": sum(f["name"].endswith(".sst") for f in files),
        "bytes": sum(f["size"] for f in files),
        "uploaded": sum(f["sha256"] not in known for f in objects),
        "uploaded_bytes": manifest["uploaded_bytes"],
    }


def restore(root: str, name: str, version: int) -> float:
    """Seconds to restore snapshot ``version`` as a new executor does: download, open."""
    storage = open_filesystem("file://" + os.path.join(root, "remote", name))
    target = os.path.join(root, "restored", name)
    t0 = time.perf_counter()
    download_snapshot(storage, version, target)
    Database.open(target).close()
    return time.perf_counter() - t0


def run(root: str, partitions: int, n_events: int, keys: int, batches: int) -> dict[str, dict]:
    names, ts = events(n_events, keys)
    part = [zlib.crc32(k.encode()) % partitions for k in names]
    physical, virtual, aggs = [], [], []
    for p in range(partitions):
        db = StateDB.open(os.path.join(root, "physical", str(p)))
        store = db.session_store("sessions", RETENTION, operator_segment_interval(RETENTION))
        aggs.append(
            SessionWindowAggregator(
                store, SessionWindows(GAP, 0), aggregations={"count": "count"}, emit="final"
            )
        )
        physical.append(db)
        vdb = Database.open(os.path.join(root, "virtual", str(p)))
        vdb.create_column_family(DATA)
        # the store's creation (spec, meta) happened outside a batch: copy it over
        for cf in db.column_families():
            for key, value in db.scan_list(cf):
                vdb.put(DATA, prefix(cf) + key, value)
        virtual.append(vdb)
    per = n_events // batches
    for b in range(batches):
        rows: list[list[int]] = [[] for _ in range(partitions)]
        for i in range(b * per, (b + 1) * per):
            rows[part[i]].append(i)
        for p in range(partitions):
            db, agg, idx = physical[p], aggs[p], rows[p]
            db.begin()
            agg.process_rows([names[i] for i in idx], [ts[i] for i in idx], [1] * len(idx))
            buf = db.prepare()
            db.apply(buf)
            apply_virtual(virtual[p], buf)
        if b + 1 == batches // 2:  # the snapshot before: what the last one shares with it
            for layout, dbs in (("physical", physical), ("virtual", virtual)):
                for p, db in enumerate(dbs):
                    snapshot(db, root, f"{layout}-{p}", b + 1)
    out: dict[str, dict] = {}
    for layout, dbs in (("physical", physical), ("virtual", virtual)):
        total = dict.fromkeys(("objects", "sst", "bytes", "uploaded", "uploaded_bytes"), 0)
        total["families"], total["restore"] = 0, 0.0
        for p, db in enumerate(dbs):
            total["families"] += len(db.column_families())
            for k, v in snapshot(db, root, f"{layout}-{p}", batches).items():
                total[k] += v
            db.close()
            total["restore"] += restore(root, f"{layout}-{p}", batches)
        out[layout] = total
    return out


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--batches", type=int, default=10)
    args = ap.parse_args(argv)
    print(f"# {machine()}", flush=True)
    with scratch_dir("ss-bench-snapfiles-") as root:
        out = run(root, args.partitions, args.events, args.keys, args.batches)
    n = args.partitions
    rows = [
        [
            layout, f"{r['families'] / n:.1f}", f"{r['objects']:,} ({r['objects'] / n:.1f})",
            f"{r['sst']:,} ({r['sst'] / n:.1f})", f"{r['bytes'] / 2**20:.1f} MiB",
            f"{r['uploaded']:,} ({r['uploaded'] / n:.1f})",
            f"{r['uploaded_bytes'] / 2**20:.1f} MiB",
            f"{r['restore']:.2f} s ({1000 * r['restore'] / n:.1f} ms)",
        ]
        for layout, r in out.items()
    ]  # fmt: skip
    return print_table(
        f"Snapshot of {n} partitions after {args.events:,} events, {args.keys:,} keys, "
        f"{args.batches} batches (bench/snapshot_files.py)",
        [
            "layout",
            "families per db",
            "files (per db)",
            "SST files (per db)",
            "bytes",
            "uploaded files (per db)",
            "uploaded bytes",
            "restore, all (per db)",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
