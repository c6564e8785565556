"""A commit that fails at any of its steps leaves the provider as if the attempt had
not started (DESIGN.md invariant 10): a load of the version it started from sees
exactly that version, and a retry on the same provider commits what a model says,
on a local folder and real S3 and GCS endpoints."""

from __future__ import annotations

import errno

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.partition.provider import COMMIT_STEPS
from sessionstore.checkpoint.storage.filesystem import Storage
from sessionstore.stores.state_db import StateDB

SPECS = [StoreSpec("sessions", "session", 1000), StoreSpec("counts", "kv", 0)]
#: each batch's rows: (key, start, end); the first attempt of batch 1 has one more,
#: which moves the stream time far ahead
BATCHES = [[("a", 1, 5), ("b", 2, 8)], [("a", 6, 9), ("c", 3, 4)]]
FAILED_ATTEMPT_EXTRA = ("z", 500, 900)
#: where a commit can fail: at a step its observer sees, while its changelog is
#: written (the store says ENOSPC), or while its snapshot is taken
FAULTS = [*COMMIT_STEPS, "publish", "snapshot"]
#: failures after which the version is durable (the retry adopts that attempt's commit)
DURABLE = {"uploaded", "applied", "snapshot"}


class FailOnce:
    """A commit observer raising at ``step`` of the first commit of ``version``."""

    def __init__(self, step, version):
        self.step, self.version, self.armed = step, version, False

    def __call__(self, event):
        if self.armed and (event.step, event.version) == (self.step, self.version):
            self.armed = False
            raise OSError(errno.ENOSPC, "injected failure", event.step)


def run_batch(handle, rows):
    for key, start, end in rows:
        handle["sessions"].put(key, start, end, f"{key}{start}")
        handle["counts"].put(key, (handle["counts"].get(key) or 0) + 1)


def model(batches):
    """The state after ``batches`` (lists of rows), as the stores show it."""
    sessions, counts, stream_time = {}, {}, None
    for rows in batches:
        for key, start, end in rows:
            sessions.setdefault(key, []).append((start, end, f"{key}{start}"))
            counts[key] = counts.get(key, 0) + 1
            stream_time = end if stream_time is None else max(stream_time, end)
    return {k: sorted(v) for k, v in sessions.items()}, counts, stream_time


def observed(provider, version):
    h = provider.get_store(version)
    try:
        counts = dict(h["counts"].items())
        sessions = {
            k: sorted((w.start, w.end, v) for w, v in h["sessions"].fetch(k)) for k in counts
        }
        return sessions, counts, h["sessions"].observed_stream_time
    finally:
        h.abort()


@pytest.fixture
def failing(monkeypatch):
    """Arm the failure ``fault`` for the next commit of version 2."""

    def arm(provider_fault, fault):
        if fault in COMMIT_STEPS:
            provider_fault.armed = True
            return
        target, name = (Storage, "write_atomic") if fault == "publish" else (StateDB, "checkpoint")
        originals = {name: getattr(target, name)}
        if fault == "publish":
            originals["write_exclusive"] = Storage.write_exclusive

        def failing_call(original):
            def call(self, *args):
                if fault == "snapshot" or str(args[0]).startswith("changelog/"):
                    for n, f in originals.items():
                        monkeypatch.setattr(target, n, f)
                    raise OSError(errno.ENOSPC, "No space left on device (injected)")
                return original(self, *args)

            return call

        for n, f in originals.items():
            monkeypatch.setattr(target, n, failing_call(f))

    return arm


@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_commit_leaves_the_provider_as_if_the_attempt_had_not_started(
    checkpoint_location, tmp_path, failing, fault
):
    uri, options = checkpoint_location
    observer = FailOnce(fault, 2)
    p = StateStoreProvider(
        uri, "op", 0, SPECS, str(tmp_path / "local"), snapshot_interval=2,
        storage_options=options, commit_observer=observer,
    )  # fmt: skip
    h = p.get_store(0)
    run_batch(h, BATCHES[0])
    assert h.commit() == 1
    failing(observer, fault)
    h = p.get_store(1)
    attempt = [*BATCHES[1], FAILED_ATTEMPT_EXTRA]
    run_batch(h, attempt)
    with pytest.raises(OSError, match="injected|No space"):
        h.commit()
    assert observed(p, 1) == model(BATCHES[:1])
    # the retry: a batch whose first attempt was durable is that attempt's
    h = p.get_store(1)
    run_batch(h, BATCHES[1])
    assert h.commit() == 2
    want = model([BATCHES[0], attempt if fault in DURABLE else BATCHES[1]])
    assert observed(p, 2) == want
    p.close()
    fresh = StateStoreProvider(
        uri, "op", 0, SPECS, str(tmp_path / "fresh"), storage_options=options
    )
    assert observed(fresh, 2) == want
    assert observed(fresh, 1) == model(BATCHES[:1])
    fresh.close()
