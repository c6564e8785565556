"""Durability costs: commit latency, snapshot upload, and full restore.

A session store gets --keys keys over --versions committed versions (the same
number of new keys per version), with a snapshot every 10 versions. Measured:

* commit latency (p50, p99): changelog encoding + atomic upload + local write;
* maintenance: uploading the pending snapshots (content-addressed SST files);
* full restore of the latest version on an empty local directory, from the file
  store, from an S3 endpoint (moto server on 127.0.0.1) and from a GCS endpoint
  (fake-gcs-server on 127.0.0.1), once from snapshots and once from changelogs
  alone;
* the baseline, in the same run: raw rocksdict bulk-loading the same keys
  (pre-encoded bytes, WriteBatch per version) into an empty database.

Run: ``.venv/bin/python bench/restore.py [--keys N] [--versions V]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rocksdict import WriteBatch  # noqa: E402

from bench.common import machine, print_table, raw_rdict, scratch_dir  # noqa: E402
from sessionstore import StateStoreProvider, StoreSpec  # noqa: E402
from sessionstore.encoding.keys import encode_key  # noqa: E402
from sessionstore.encoding.serde import MsgpackSerde  # noqa: E402
from sessionstore.encoding.session_key import session_key  # noqa: E402
from tests.object_stores import gcs_server, moto_s3_server, new_bucket, new_gcs_bucket  # noqa: E402  # noqa: E402

SPECS = [StoreSpec("sessions", "session", 10**12)]


def rows_for(version: int, per_version: int) -> list[tuple]:
    base = version * per_version
    return [(f"user-{base + j:08d}", base, base + 1000, [version, j]) for j in range(per_version)]


def write(uri, options, local, versions, per_version, snapshot_interval):
    p = StateStoreProvider(
        uri, "op", 0, SPECS, local, snapshot_interval=snapshot_interval, storage_options=options
    )
    latencies = []
    for v in range(versions):
        h = p.get_store(v)
        h["sessions"].put_many(rows_for(v, per_version))
        t0 = time.perf_counter()
        h.commit()
        latencies.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    report = p.do_maintenance()
    maintenance = time.perf_counter() - t0
    p.close()
    return latencies, maintenance, report["uploaded_bytes"]


def restore(uri, options, local, version):
    t0 = time.perf_counter()
    p = StateStoreProvider(uri, "op", 0, SPECS, local, storage_options=options)
    h = p.get_store(version)
    elapsed = time.perf_counter() - t0
    n = sum(1 for _ in h["sessions"].fetch_range(None, None))
    p.close()
    return elapsed, n


def raw_bulk_load(path, versions, per_version):
    serde = MsgpackSerde()
    batches = []
    for v in range(versions):
        batches.append(
            [
                (session_key(encode_key(k), s, e), serde.dumps(val))
                for k, s, e, val in rows_for(v, per_version)
            ]
        )
    rd = raw_rdict(path, ["sessions.0"])
    handle = rd.get_column_family_handle("sessions.0")
    t0 = time.perf_counter()
    for batch in batches:
        wb = WriteBatch(raw_mode=True)
        for k, val in batch:
            wb.put(k, val, handle)
        rd.write(wb)
    rd.flush()
    elapsed = time.perf_counter() - t0
    del handle
    rd.close()
    return elapsed


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--versions", type=int, default=20)
    args = ap.parse_args(argv)
    per_version = args.keys // args.versions
    n_keys = per_version * args.versions
    rows = []
    with scratch_dir("bench-restore-") as tmp, moto_s3_server() as s3, gcs_server() as gs:
        raw_s = raw_bulk_load(f"{tmp}/raw", args.versions, per_version)
        raw_rate = n_keys / raw_s
        rows.append(
            ["raw rocksdict bulk load (baseline)", f"{raw_s:.2f} s", f"{raw_rate:,.0f}", "100%"]
        )
        locations = {
            "file": (f"file://{tmp}/remote", None),
            "s3": (f"s3://{new_bucket(s3)}/ckpt", s3),
            "gs": (f"gs://{new_gcs_bucket(gs)}/ckpt", gs),
        }
        for name, (uri, options) in locations.items():
            lat, maint, uploaded = write(
                uri, options, f"{tmp}/w-{name}", args.versions, per_version, 10
            )
            p50, p99 = np.percentile(lat, [50, 99]) * 1000
            rows.append(
                [
                    f"{name}: commit latency p50 / p99 ({per_version:,} keys)",
                    f"{p50:.0f} / {p99:.0f} ms",
                    "",
                    "",
                ]
            )
            rows.append(
                [f"{name}: snapshot upload ({uploaded / 2**20:.1f} MiB)", f"{maint:.2f} s", "", ""]
            )
            secs, n = restore(uri, options, f"{tmp}/r-{name}", args.versions)
            assert n == n_keys, (n, n_keys)
            rows.append(
                [
                    f"{name}: full restore from snapshot",
                    f"{secs:.2f} s",
                    f"{n / secs:,.0f}",
                    f"{n / secs / raw_rate:.0%}",
                ]
            )
        # changelogs only: snapshots never taken
        uri, options = (f"file://{tmp}/remote-cl", None)
        write(uri, options, f"{tmp}/w-cl", args.versions, per_version, 10**6)
        secs, n = restore(uri, options, f"{tmp}/r-cl", args.versions)
        assert n == n_keys
        rows.append(
            [
                "file: full restore from changelogs only",
                f"{secs:.2f} s",
                f"{n / secs:,.0f}",
                f"{n / secs / raw_rate:.0%}",
            ]
        )
    return print_table(
        f"Durability, {n_keys:,} keys over {args.versions} versions ({machine()})",
        ["measure", "time", "keys/s", "vs raw bulk load"],
        rows,
    )


if __name__ == "__main__":
    main()
