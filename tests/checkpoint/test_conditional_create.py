"""The fence between two attempts of one batch at the store itself, without the
driver's coordinator (Spark Connect, or turned off): S3's ``If-None-Match: *`` and
GCS's ``ifGenerationMatch=0`` (conditional_create.py), against real endpoints (moto
server, fake-gcs-server), which both refuse a taken name (checked here too).
Invariant 1 of DESIGN.md section 8: a load returns the state of the attempt that
won, never the other's, never a mix, never a ``LineageError``."""

from __future__ import annotations

import logging
import sys

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.partition.lineage import COMMIT_FIELD, publish
from sessionstore.checkpoint.records.changelog import decode_changelog, encode_changelog
from sessionstore.checkpoint.records.layout import changelog_name
from sessionstore.checkpoint.storage import conditional_create
from sessionstore.checkpoint.storage.filesystem import Storage, open_filesystem
from sessionstore.process import this_process
from tests.checkpoint.test_lineage import commit, tags  # commit: no arbiter by default
from tests.faults import pause_before_write
from tests.object_stores import (
    fail_next_s3_requests,
    new_bucket,
    reset_s3_request_counts,
    s3_request_counts,
)

SPECS = [StoreSpec("sessions", "session", 10**9)]


@pytest.fixture(params=["s3", "gcs"])
def location(request):
    return request.getfixturevalue("s3_bucket" if request.param == "s3" else "gs_bucket")


@pytest.fixture
def counting_bucket(s3_counting_server):
    yield f"s3://{new_bucket(s3_counting_server)}/ck", dict(s3_counting_server)
    reset_s3_request_counts(s3_counting_server)  # no injected failure outlives its test


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget the warnings this process already gave (one per process)."""
    this_process().forget(conditional_create.LOOK_BEFORE_WRITE_WARNING)


def provider(location, local):
    uri, options = location
    return StateStoreProvider(uri, "op", 0, SPECS, str(local), storage_options=options)


def stored_commit(location, version):
    uri, options = location
    data = open_filesystem(uri, options).child("op/0").read(changelog_name(version))
    return decode_changelog(data, "stored", version)[0][COMMIT_FIELD]


def test_the_test_endpoints_refuse_a_taken_name(location):
    """moto and fake-gcs-server enforce the precondition (else every test below
    would pass for nothing): the second create of a name is refused, the first
    object stays."""
    uri, options = location
    storage = open_filesystem(uri, options)
    assert storage.exclusive_create
    assert storage.write_exclusive("d/claim", b"mine") is True
    assert storage.write_exclusive("d/claim", b"theirs") is False
    assert storage.read("d/claim") == b"mine"


def test_two_overlapping_attempts_without_the_coordinator_commit_one_lineage(location, tmp_path):
    """Attempt A of batch 1 is paused just before it writes its changelog (after
    its look for another attempt's, where the store offers no precondition) until
    attempt B, with other output, has committed the same version. Exactly one wins
    (B, the first to publish); A adopts B's commit. Every load of the version, on
    either executor's local dir and on a fresh one, is B's state, and the next
    batch, run on A's executor, continues it: no LineageError anywhere."""
    a, b = provider(location, tmp_path / "a"), provider(location, tmp_path / "b")
    commit(a, 0, "base")
    assert tags(b, 1) == ["base"]  # both executors warm at version 1
    committed = {}

    def attempt_b_commits_meanwhile():
        commit(b, 1, "b")
        committed["b"] = stored_commit(location, 2)

    with pause_before_write("changelog/", attempt_b_commits_meanwhile) as paused:
        commit(a, 1, "a")  # returns 2: it adopted B's commit
    assert paused == [changelog_name(2)]
    assert stored_commit(location, 2) == committed["b"]  # B's object stays
    fresh = provider(location, tmp_path / "fresh")
    for p in (a, b, fresh):
        assert tags(p, 2) == ["base", "b"]
    commit(a, 2, "next")  # the next batch on the loser's executor
    later = provider(location, tmp_path / "later")
    for p in (b, fresh, later, a):
        assert tags(p, 3) == ["base", "b", "next"]
    for p in (a, b, fresh, later):
        p.close()


@pytest.mark.parametrize("missing", ["s3", "gcs"])
def test_without_the_extra_the_commit_looks_before_writing_and_warns_once(
    missing, tmp_path, monkeypatch, caplog, fresh_warnings, request
):
    """The store's client not installed (its import fails): commits look before
    they write, as on any other pyarrow.fs target (a HEAD before the PUT, counted
    at the S3 endpoint), still fence attempts that do not overlap, and one warning
    per process names the extra to install."""
    modules = (
        ["boto3"] if missing == "s3"
        else ["google.auth", "google.auth.exceptions", "google.auth.transport.requests"]
    )  # fmt: skip
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    if missing == "s3":
        location = request.getfixturevalue("counting_bucket")
    else:
        location = request.getfixturevalue("gs_bucket")
    caplog.set_level(logging.WARNING, logger=conditional_create.__name__)
    a, b = provider(location, tmp_path / "a"), provider(location, tmp_path / "b")
    assert not open_filesystem(*location).exclusive_create
    commit(a, 0, "base")
    if missing == "s3":
        reset_s3_request_counts(location[1])
    commit(a, 1, "a")
    if missing == "s3":
        assert s3_request_counts(location[1]) == {"HEAD": 1, "PUT": 1}  # the look, the write
    commit(b, 1, "b")  # commits last: adopts a's
    for p in (a, b):
        assert tags(p, 2) == ["base", "a"]
    warnings = [
        r.getMessage() for r in caplog.records
        if r.name == conditional_create.__name__ and r.levelno == logging.WARNING
    ]  # fmt: skip
    assert len(warnings) == 1, warnings
    assert f"sessionstore[{missing}]" in warnings[0] and "looking before writing" in warnings[0]
    for p in (a, b):
        p.close()


def test_with_the_conditional_create_a_commit_is_one_put(counting_bucket, tmp_path):
    """No look before writing: a commit without the coordinator is one PUT."""
    p = provider(counting_bucket, tmp_path / "a")
    commit(p, 0, "base")
    reset_s3_request_counts(counting_bucket[1])
    commit(p, 1, "next")
    assert s3_request_counts(counting_bucket[1]) == {"PUT": 1}
    p.close()


def test_a_throttled_conditional_put_is_retried_a_refused_one_is_not(counting_bucket):
    """Through boto3 under the project's retry policy: a 503 SlowDown on the
    conditional PUT is tried again (and counted as a retry); a 412 is the answer
    (not retried, the object left as it was)."""
    uri, options = counting_bucket
    storage = open_filesystem(uri, options)
    reset_s3_request_counts(options)
    fail_next_s3_requests(options, "PUT", "503 Slow Down", "SlowDown")
    assert storage.write_exclusive("d/claim", b"first") is True
    assert s3_request_counts(options) == {"SlowDown": 1, "PUT": 1}
    assert storage.retries == 1
    reset_s3_request_counts(options)
    assert storage.write_exclusive("d/claim", b"second") is False
    assert s3_request_counts(options) == {"PUT": 1}
    assert storage.retries == 1
    assert storage.read("d/claim") == b"first"


def test_a_permanent_error_of_the_conditional_put_fails_at_once(counting_bucket):
    """A 403 is not retried and names the object."""
    uri, options = counting_bucket
    storage = open_filesystem(uri, options)
    reset_s3_request_counts(options)
    fail_next_s3_requests(options, "PUT", "403 Forbidden", "AccessDenied")
    with pytest.raises(OSError, match=r"cannot write s3://.*/ck/d/x: .*AccessDenied"):
        storage.write_exclusive("d/x", b"x")
    assert s3_request_counts(options) == {"AccessDenied": 1}


def test_a_conflicting_conditional_put_reads_and_tries_again(counting_bucket, tmp_path):
    """S3 answers 409 ConditionalRequestConflict while another conditional write of
    the key is under way. The commit reads the name, as after a 412: here the other
    write did not land, so it publishes its own changelog on the next try."""
    p = provider(counting_bucket, tmp_path / "a")
    commit(p, 0, "base")
    options = counting_bucket[1]
    reset_s3_request_counts(options)
    fail_next_s3_requests(options, "PUT", "409 Conflict", "ConditionalRequestConflict")
    commit(p, 1, "mine")
    counts = s3_request_counts(options)
    assert counts == {"ConditionalRequestConflict": 1, "HEAD": 1, "PUT": 1}, counts
    fresh = provider(counting_bucket, tmp_path / "fresh")
    assert tags(fresh, 2) == ["base", "mine"]
    for q in (p, fresh):
        q.close()


def test_an_assumed_role_writes_with_the_roles_credentials(counting_bucket, monkeypatch):
    """``role_arn`` (with ``session_name``): the conditional create assumes the role
    through STS from the default credential chain, as pyarrow does (here the
    environment's keys, and moto's STS at the endpoint the SDK's environment
    names), once, and PUTs with it."""
    uri, options = counting_bucket
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", f"http://{options['endpoint_override']}")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    role = {k: v for k, v in options.items() if k not in ("access_key", "secret_key")}
    role.update(role_arn="arn:aws:iam::123456789012:role/writer", session_name="ck")
    storage = open_filesystem(uri, role)
    reset_s3_request_counts(options)
    assert storage.write_exclusive("d/claim", b"first") is True
    assert storage.write_exclusive("d/claim", b"second") is False
    assert s3_request_counts(options) == {"POST": 1, "PUT": 2}  # AssumeRole once
    assert open_filesystem(uri, options).read("d/claim") == b"first"


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_an_option_the_conditional_create_cannot_honour_turns_it_off_with_a_warning(
    kind, caplog, fresh_warnings, request
):
    """``default_metadata`` would be on pyarrow's objects and not on the changelog:
    the commit looks before writing instead, and says why once."""
    uri, options = request.getfixturevalue("s3_bucket" if kind == "s3" else "gs_bucket")
    caplog.set_level(logging.WARNING, logger=conditional_create.__name__)
    for _ in range(2):
        storage = open_filesystem(uri, {**options, "default_metadata": {"Cache-Control": "no"}})
        assert not storage.exclusive_create
    warnings = [r.getMessage() for r in caplog.records if r.name == conditional_create.__name__]
    assert len(warnings) == 1 and "default_metadata" in warnings[0], warnings


def test_a_store_that_keeps_refusing_a_name_nothing_holds_fails_the_commit(
    counting_bucket, tmp_path
):
    """409 on every try and nothing at the name: the commit fails after the retry
    policy's attempts (naming the changelog), never spins; nothing is committed,
    and the task's retry commits."""
    uri, options = counting_bucket
    p = provider((uri, {**options, "retry_max_attempts": 3}), tmp_path / "a")
    commit(p, 0, "base")
    fail_next_s3_requests(options, "PUT", "409 Conflict", "ConditionalRequestConflict", 10)
    h = p.get_store(1)
    h["sessions"].put("k", 1, 1, "lost")
    with pytest.raises(OSError, match=r"cannot write s3://.*/2\.changelog: .*refused .* 3 times"):
        h.commit()
    reset_s3_request_counts(options)  # the store answers again
    fresh = provider(counting_bucket, tmp_path / "fresh")
    assert fresh.latest_version() == 1
    commit(fresh, 1, "retry")
    other = provider(counting_bucket, tmp_path / "other")
    assert tags(other, 2) == ["base", "retry"]
    for q in (p, fresh, other):
        q.close()


@pytest.mark.parametrize(
    ("status", "code"),
    [("501 Not Implemented", "NotImplemented"), ("400 Bad Request", "InvalidArgument If-None-Match")],
)
def test_a_store_without_conditional_writes_looks_before_writing_from_then_on(
    counting_bucket, tmp_path, caplog, status, code
):
    """An S3-compatible store that does not implement If-None-Match (501, or a 400
    naming the header) does not fail the commit: it publishes by looking before
    writing, that commit and every later one, with one warning."""
    p = provider(counting_bucket, tmp_path / "a")
    options = counting_bucket[1]
    reset_s3_request_counts(options)
    fail_next_s3_requests(options, "PUT", status, code)
    with caplog.at_level(logging.WARNING, logger="sessionstore.checkpoint.storage.conditional_create"):
        commit(p, 0, "first")
        commit(p, 1, "second")
    counts = s3_request_counts(options)
    assert counts[code] == 1 and counts["HEAD"] >= 2 and counts["PUT"] == 2, counts
    warnings = [r for r in caplog.records if "does not implement conditional writes" in r.message]
    assert len(warnings) == 1, caplog.text
    assert tags(provider(counting_bucket, tmp_path / "fresh"), 2) == ["first", "second"]


def test_a_conditional_replace_is_refused_once_the_object_changed(location):
    """S3 ``If-Match: <ETag>`` and GCS ``ifGenerationMatch=<generation>`` on the
    test endpoints: a replacement conditional on the version read is refused once
    another writer replaced it (the other's object stays), and done while it is
    still the version read."""
    uri, options = location
    storage = open_filesystem(uri, options)
    storage.write_atomic("d/leftover", b"old lineage")
    data, tag = storage.read_tagged("d/leftover")
    assert data == b"old lineage" and tag
    storage.write_atomic("d/leftover", b"another attempt's")
    assert storage.replace_if("d/leftover", b"mine", tag) is False
    assert storage.read("d/leftover") == b"another attempt's"
    _, current = storage.read_tagged("d/leftover")
    assert storage.replace_if("d/leftover", b"mine", current) is True
    assert storage.read("d/leftover") == b"mine"
    assert storage.replace_if("d/gone", b"mine", current) is False  # nothing to replace


def _changelog(version, commit_id, parent):
    from sessionstore.checkpoint.partition.lineage import PARENT_FIELD
    from sessionstore.engine.write_buffer import WriteBuffer

    buf = WriteBuffer()
    buf.put("default", commit_id.encode(), b"v")
    return encode_changelog(
        buf, "op", 0, version, fields={COMMIT_FIELD: commit_id, PARENT_FIELD: parent}
    )


def test_two_attempts_replacing_one_leftover_changelog_commit_one(location):
    """Changelog 2 at its name is a leftover of an abandoned lineage. Attempt A
    reads it; before A replaces it, attempt B (same parent) replaces it. A's
    replacement is conditional on the version it read, so it is refused: A reads
    again and adopts B's commit, which stays. (Unconditional, A would overwrite
    the commit B's executor goes on from.)"""
    uri, options = location
    storage = open_filesystem(uri, options).child("op/0")
    storage.write_atomic(changelog_name(2), _changelog(2, "L" * 32, "abandoned"))
    results = {}
    originals = {n: getattr(Storage, n) for n in ("read", "read_tagged") if hasattr(Storage, n)}
    paused = []

    def pausing(original):
        def read(self, rel, *args):
            out = original(self, rel, *args)
            if rel == changelog_name(2) and not paused:
                paused.append(rel)  # A has read the leftover: B publishes meanwhile
                results["b"] = publish(storage, 2, _changelog(2, "B" * 32, "P"), "B" * 32, "P")
            return out

        return read

    for name, original in originals.items():
        setattr(Storage, name, pausing(original))
    try:
        results["a"] = publish(storage, 2, _changelog(2, "A" * 32, "P"), "A" * 32, "P")
    finally:
        for name, original in originals.items():
            setattr(Storage, name, original)
    assert paused and results["b"] is None  # B published
    assert results["a"] is not None and results["a"].header[COMMIT_FIELD] == "B" * 32
    assert stored_commit(location, 2) == "B" * 32


def test_where_the_store_cannot_fence_a_granted_winner_looks_and_never_writes_late(
    counting_bucket,
):
    """S3 without a conditional create (``default_metadata`` turns it off). B's
    claim reply was lost, so B looked and published changelog 1; A's claim was
    granted: A looks too, and adopts B's commit instead of overwriting it. Then a
    granted winner whose PUT is throttled past half the claim wait (when another
    attempt may supersede it) gives up instead of writing late."""
    uri, options = counting_bucket
    storage = open_filesystem(uri, {**options, "default_metadata": {"a": "b"}}).child("op/0")
    assert not storage.exclusive_create

    def granted(version, commit, parent, supersede):
        return commit

    b = publish(storage, 1, _changelog(1, "B" * 32, "P"), "B" * 32, "P")  # no reply: looks
    assert b is None
    a = publish(storage, 1, _changelog(1, "A" * 32, "P"), "A" * 32, "P", granted)
    assert a is not None and a.header[COMMIT_FIELD] == "B" * 32
    assert stored_commit((uri, options), 1) == "B" * 32

    fail_next_s3_requests(options, "PUT", "503 Slow Down", "SlowDown", times=8)
    with pytest.raises(OSError, match=r"cannot write .*op/0/changelog/0/2.changelog"):
        publish(storage, 2, _changelog(2, "A" * 32, "B"), "A" * 32, "B", granted, wait_s=0.4)
    assert not storage.exists(changelog_name(2))
