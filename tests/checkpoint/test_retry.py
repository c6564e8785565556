"""The retry policy of object-store requests (sessionstore/checkpoint/storage/retry.py):
transient errors retried with a bounded number of attempts and time, permanent
ones at once; a throttling S3 endpoint (20% of requests answered ``503 SlowDown``)
under a provider's commits and maintenance; transfers in bounded memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.storage.filesystem import StorageOptionError, open_filesystem
from sessionstore.checkpoint.storage.retry import RetryCounter, RetryPolicy, is_transient
from tests.object_stores import (
    moto_s3_server,
    new_bucket,
    reset_s3_request_counts,
    s3_request_counts,
)

SPECS = [StoreSpec("sessions", "session", 10**9), StoreSpec("plans", "versioned", 10**9)]


def failing(errors):
    """A call that raises ``errors`` one by one, then returns how often it ran."""
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return len(calls)

    fn.calls = calls
    return fn


SLOW = OSError("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate.")
NO_BODY = OSError("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: No response")


def test_transient_errors_are_retried_and_permanent_ones_are_not():
    policy = RetryPolicy(max_attempts=5, jitter=lambda bound: 0.0)
    assert policy.call(failing([SLOW, NO_BODY, SLOW])) == 4
    for permanent in (
        FileNotFoundError("x"),
        PermissionError("x"),
        OSError("AWS Error ACCESS_DENIED during HeadObject operation: 403"),
        OSError("AWS Error NO_SUCH_BUCKET during PutObject: The bucket does not exist"),
        OSError("Could not connect to the metadata server to fetch credentials"),
    ):
        fn = failing([permanent] * 3)  # a retry would meet it again
        counter = RetryCounter()
        with pytest.raises(type(permanent)) as err:
            policy.call(fn, counter)
        # raised at once, as it was: one attempt, no retry counted, nothing added
        assert (len(fn.calls), counter.retries) == (1, 0)
        assert err.value is permanent and str(err.value) == str(permanent)
        assert not is_transient(permanent)
    assert is_transient(OSError("curlCode: 7, Couldn't connect to server"))
    assert not is_transient(OSError("object of 5000 bytes is shorter than expected 9"))


def test_attempts_and_time_are_bounded_and_the_error_says_what_was_tried():
    fn = failing([SLOW] * 10)
    with pytest.raises(OSError) as err:
        RetryPolicy(max_attempts=3, jitter=lambda bound: 0.0).call(fn)
    assert "tried 3 times" in str(err.value) and "SLOW_DOWN" in str(err.value)
    assert "spark.sessionstore.retry.maxAttempts" in str(err.value)
    # the time limit: no attempt starts after max_seconds (waits of 0.2 s, 0.5 s allowed)
    fn = failing([SLOW] * 10)
    with pytest.raises(OSError, match="tried 3 times"):
        RetryPolicy(max_attempts=10, max_seconds=0.5, jitter=lambda bound: 0.2).call(fn)
    # waits grow exponentially up to max_delay; the jitter draws below the bound
    bounds = []
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0, jitter=lambda b: bounds.append(b) or 0)
    for attempt in range(1, 7):
        policy.delay(attempt)
    assert bounds == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert 0 <= RetryPolicy().delay(3) <= 0.2


def test_retry_options_travel_with_the_storage_options_as_text(tmp_path):
    storage = open_filesystem(
        "s3://bucket/x",
        {"retry_max_attempts": "4", "retry_max_seconds": "2.5", "region": "us-east-1"},
    )
    assert (storage.retry.max_attempts, storage.retry.max_seconds) == (4, 2.5)
    assert storage.child("a").retry is storage.retry
    assert open_filesystem(str(tmp_path)).retry == RetryPolicy()
    for options, shown in [
        ({"retry_max_attempts": "many"}, "'many'"),
        ({"retry_max_attempts": "0"}, "0"),
        ({"retry_max_seconds": "-1"}, "-1"),
    ]:
        with pytest.raises(StorageOptionError, match=shown):
            open_filesystem(f"file://{tmp_path}", options)


def test_one_failing_request_is_max_attempts_requests_never_more():
    """pyarrow's own S3 retries are off: ours are the only ones (attempts, not
    attempts squared)."""
    with moto_s3_server() as plain:
        bucket = new_bucket(plain)
    with moto_s3_server(throttle=1.0) as options:
        storage = open_filesystem(
            f"s3://{bucket}/x", {**options, "retry_max_attempts": "3", "retry_max_seconds": "30"}
        )
        with pytest.raises(OSError, match=r"cannot read s3://.*/x/f: .*tried 3 times"):
            storage.read("f")
        assert s3_request_counts(options) == {"SlowDown": 3}
        assert storage.retries == 2


def provider(uri, options, local, **kw):
    return StateStoreProvider(uri, "op", 0, SPECS, str(local), storage_options=options, **kw)


@pytest.mark.slow
def test_a_throttling_store_loses_no_commit_and_restores_exactly(s3_throttling_server, tmp_path):
    options = dict(s3_throttling_server)
    for _ in range(20):  # the bucket's creation may be throttled too: not ours to retry
        try:
            bucket = new_bucket(options)
            break
        except OSError:
            continue
    uri = f"s3://{bucket}/checkpoints"
    reset_s3_request_counts(options)
    p = provider(uri, options, tmp_path / "exec1", snapshot_interval=4, retain_versions=12)
    counted = 0
    for v in range(40):
        h = p.get_store(v)
        h["sessions"].put("k", v, v, v)
        h["plans"].put("k", f"plan{v}", v)
        assert h.commit() == v + 1
        counted += p.last_metrics["storage_retries"]  # in the changelog header too
        if v % 3 == 2:
            p.do_maintenance()
    p.do_maintenance()
    retried = p.operator_storage.retries
    assert 0 < counted <= retried
    p.close()
    counts = s3_request_counts(options)
    assert counts["SlowDown"] > 20 and retried > 20, (counts, retried)
    fresh = provider(uri, options, tmp_path / "exec2")
    for version in fresh.list_versions():
        h = fresh.get_store(version)
        assert [(w.start, v) for w, v in h["sessions"].fetch("k")] == [
            (v, v) for v in range(version)
        ]
        assert h["plans"].get("k")[:2] == (f"plan{version - 1}", version - 1)
        h.abort()
    assert fresh.list_versions()[-1] == 40
    fresh.close()


_TRANSFER = """
import os, resource, sys
sys.path.insert(0, {root!r})
from sessionstore.checkpoint.storage.filesystem import open_filesystem
uri, options, size = sys.argv[1], eval(sys.argv[2]), int(sys.argv[3])
path = os.path.join({tmp!r}, "big")
with open(path, "wb") as f:
    block = os.urandom(1 << 20)
    for _ in range(size >> 20):
        f.write(block)
storage = open_filesystem(uri, options)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
storage.upload_file(path, "big")
storage.download("big", path + ".back")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert os.path.getsize(path + ".back") == size
with open(path, "rb") as a, open(path + ".back", "rb") as b:
    while (x := a.read(1 << 24)):
        assert x == b.read(1 << 24)
print((after - before) // 1024)
"""


def transfer_growth_mb(uri, options, size, tmp_path):
    """Peak memory growth (MiB) of a process that uploads a file of ``size`` bytes
    to ``uri`` and downloads it back."""
    import os

    code = _TRANSFER.format(root=os.getcwd(), tmp=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), uri, repr(options), str(size)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.slow
def test_large_transfers_stream_in_bounded_memory(s3_server, tmp_path):
    """A 512 MiB file up and down a local checkpoint, 96 MiB on S3: memory grows by
    a few chunks, not by the file (the whole file was read into memory before)."""
    assert transfer_growth_mb(f"file://{tmp_path}/remote", {}, 512 << 20, tmp_path) < 64
    bucket = new_bucket(s3_server)
    growth = transfer_growth_mb(f"s3://{bucket}/x", dict(s3_server), 96 << 20, tmp_path)
    assert growth < 64


def test_gcs_without_its_own_retry_limit_works_and_a_dead_endpoint_fails_in_time(
    gcs_server, tmp_path
):
    """pyarrow's GCS retries (15 minutes by default) are down to a second; ours bound
    the whole: a refused connection fails within about ``retry_max_seconds``, on one
    line naming the URI and what was tried."""
    import time

    from tests.object_stores import new_gcs_bucket

    options = {k: v for k, v in gcs_server.items() if k != "retry_time_limit"}
    storage = open_filesystem(f"gs://{new_gcs_bucket(gcs_server)}/x", options)
    (tmp_path / "f").write_bytes(b"x" * 100)
    storage.upload_file(str(tmp_path / "f"), "a/f")
    storage.download("a/f", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == b"x" * 100
    dead = {**options, "endpoint_override": "127.0.0.1:1", "retry_max_seconds": "4"}
    start = time.monotonic()
    with pytest.raises(OSError) as err:
        open_filesystem("gs://bucket/x", dead).read("a/f")
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert message.startswith("cannot read gs://bucket/x/a/f: ") and "\n" not in message
    assert "tried " in message and "retry limits" in message
