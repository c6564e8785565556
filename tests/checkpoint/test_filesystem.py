"""Storage on a real GCS endpoint (fake-gcs-server): options as text, named errors."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.storage.filesystem import StorageOptionError, open_filesystem, redact

SPECS = [StoreSpec("sessions", "session", 10**9)]


def as_text(options):
    """Options as Spark's conf and the CLI pass them."""
    return {k: str(v) for k, v in options.items()}


def test_options_given_as_text_are_typed(gs_bucket):
    uri, options = gs_bucket
    text = as_text(options)
    assert text["anonymous"] == "True" and text["retry_time_limit"] == "5"
    storage = open_filesystem(uri, text)
    storage.write_atomic("a/b", b"x")
    assert storage.read("a/b") == b"x" and storage.list("a") == ["b"]
    # "false" is false: pyarrow takes any string as a true boolean
    from sessionstore.checkpoint.storage.filesystem import _typed

    typed = _typed(uri, {"anonymous": "false", "retry_time_limit": "2.5", "scheme": "http"})
    assert typed == {
        "anonymous": False,
        "retry_time_limit": timedelta(seconds=2.5),
        "scheme": "http",
    }


@pytest.mark.parametrize(
    "option,message",
    [
        ({"anonymous": "maybe"}, "storage option anonymous='maybe' for gs://b/p: expected true or false"),
        ({"retry_time_limit": "soon"}, "retry_time_limit='soon' for gs://b/p: expected a number of seconds"),
        ({"no_such_option": "1"}, "bad storage options for gs://b/p (no_such_option): "),
    ],
)  # fmt: skip
def test_bad_options_are_named(option, message):
    with pytest.raises(StorageOptionError) as err:
        open_filesystem("gs://b/p", option)
    assert message in str(err.value)


def test_a_secret_never_appears_in_an_option_error():
    for options in ({"access_token": "s3cr3t", "nope": 1}, {"secret_token": "s3cr3t"}):
        with pytest.raises(StorageOptionError) as err:
            open_filesystem("gs://b/p", options)
        assert "s3cr3t" not in str(err.value)


def test_list_dirs_sees_directories_implied_by_object_names(gs_bucket):
    """GCS has no directories; pyarrow's listing shows none of the implied ones."""
    storage = open_filesystem(*gs_bucket)
    for rel in ("op/_metadata", "op/0/changelog/1.changelog", "op/12/snapshot/2.manifest"):
        storage.write_atomic(rel, b"x")
    assert storage.list_dirs() == ["op"]
    assert storage.list_dirs("op") == ["0", "12"]
    assert storage.list("op") == ["_metadata"]
    assert storage.list_dirs("nothing") == []


def test_errors_name_the_bucket_and_object_and_no_secret(gcs_server, tmp_path):
    """A missing bucket: pyarrow's GCS errors name neither bucket nor object."""
    token = "ya29.s3cr3t-t0k3n"
    options = {
        **gcs_server,
        "anonymous": False,
        "access_token": token,
        "credential_token_expiration": "2099-01-01T00:00:00Z",
    }
    storage = open_filesystem("gs://no-such-bucket/ckpt", options)
    with pytest.raises(FileNotFoundError) as err:
        storage.write_atomic("op/0/changelog/1.changelog", b"x")
    assert "gs://no-such-bucket/ckpt/op/0/changelog/1.changelog" in str(err.value)
    with pytest.raises(FileNotFoundError, match="gs://no-such-bucket/ckpt/op/_metadata does not"):
        storage.read("op/_metadata")
    with pytest.raises(FileNotFoundError) as err:
        StateStoreProvider(
            "gs://no-such-bucket/ckpt", "op", 0, SPECS, tmp_path, storage_options=options
        ).get_store(0).commit()
    assert "gs://no-such-bucket/ckpt/op/" in str(err.value)
    assert token not in str(err.value) and token not in repr(redact(options))


def test_s3_small_objects_take_one_put_and_whole_reads_one_get(s3_counting_server):
    """Without ``allow_delayed_open`` pyarrow uploads every object in 3 requests
    (multipart: create, part, complete), and reads a stream 256 KB per GET."""
    from tests.object_stores import new_bucket, reset_s3_request_counts, s3_request_counts

    options = s3_counting_server
    storage = open_filesystem(f"s3://{new_bucket(options)}/ck", options)
    data = bytes(range(256)) * 4096  # 1 MB
    reset_s3_request_counts(options)
    storage.write_atomic("op/0/changelog/1.changelog", data)
    assert s3_request_counts(options) == {"PUT": 1}
    reset_s3_request_counts(options)
    assert storage.read("op/0/changelog/1.changelog") == data
    assert s3_request_counts(options) == {"HEAD": 1, "GET": 1}
    # the user's choice wins
    explicit = open_filesystem(storage.uri, {**options, "allow_delayed_open": "false"})
    reset_s3_request_counts(options)
    explicit.write_atomic("op/0/changelog/2.changelog", b"x")
    assert s3_request_counts(options) == {"POST": 2, "PUT": 1}


class _Raising:
    """A pyarrow filesystem stand-in whose deletes fail with one message."""

    def __init__(self, message: str) -> None:
        self.message = message

    def delete_file(self, path: str) -> None:
        raise OSError(self.message)

    delete_dir = delete_file


@pytest.mark.parametrize("method", ["delete", "delete_dir"])
@pytest.mark.parametrize(
    ("message", "ignored"),
    [
        ("Path does not exist 'b/op/x'", True),  # what some backends say of a missing object
        ("GCS object not found: b/op/x", True),
        ("The specified bucket does not exist", False),  # configuration: never swallowed
        ("Access denied", False),
    ],
)
def test_deleting_what_is_gone_is_no_error_but_other_failures_raise(
    tmp_path, method, message, ignored
):
    storage = open_filesystem(f"file://{tmp_path}")
    storage.fs = _Raising(message)
    if ignored:
        getattr(storage, method)("x")
    else:
        with pytest.raises(OSError):
            getattr(storage, method)("x")


def _leftovers(root):
    return sorted(p.name for p in root.rglob("*") if p.name.endswith(".tmp"))


def test_a_failed_exclusive_publish_leaves_no_temporary_file(tmp_path, monkeypatch):
    storage = open_filesystem(str(tmp_path))
    assert storage.write_exclusive("d/claim", b"mine") is True
    assert storage.write_exclusive("d/claim", b"theirs") is False  # refused, kept
    assert (tmp_path / "d" / "claim").read_bytes() == b"mine"

    def no_link(src, dst):
        raise PermissionError(13, "link refused", dst)

    monkeypatch.setattr("os.link", no_link)
    with pytest.raises(PermissionError, match="cannot write .*d/other.*link refused"):
        storage.write_exclusive("d/other", b"x")
    assert not (tmp_path / "d" / "other").exists()
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("exclusive", [True, False], ids=["exclusive", "atomic"])
def test_a_failed_write_leaves_no_temporary_file(tmp_path, exclusive):
    storage = open_filesystem(str(tmp_path))
    write = storage.write_exclusive if exclusive else storage.write_atomic
    with pytest.raises(TypeError):
        write("d/f", object())  # the stream refuses it after the temporary file exists
    assert not (tmp_path / "d" / "f").exists()
    assert _leftovers(tmp_path) == []


def _objects(storage):
    """Every object below the storage's root, hidden ones included."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(storage.root, allow_not_found=True, recursive=True)
    return sorted(
        i.path[len(storage.root) :].strip("/")
        for i in storage.fs.get_file_info(selector)
        if i.type == pafs.FileType.File
    )


@pytest.mark.parametrize("how", ["upload_file", "write_atomic"])
def test_a_write_that_fails_mid_file_leaves_nothing_at_its_name_on_s3(
    s3_counting_server, tmp_path, how
):
    """A part of a multipart upload is refused (403) after the upload started:
    pyarrow cannot abort, and closing the stream would complete the upload with
    the parts that arrived. Nothing is left at the final name, nor hidden beside
    it; a throttled part (503) is retried and the object arrives whole."""
    import os

    from tests.object_stores import fail_next_s3_requests, new_bucket, reset_s3_request_counts

    options = s3_counting_server
    uri = f"s3://{new_bucket(options)}/ck"
    data = os.urandom(23 << 20)  # three parts of pyarrow's 10 MB
    source = tmp_path / "sst"
    source.write_bytes(data)

    def write(storage):
        if how == "upload_file":
            storage.upload_file(str(source), "files/abc")
        else:
            storage.write_atomic("files/abc", data)

    storage = open_filesystem(uri, options)
    try:
        fail_next_s3_requests(options, "PUT", "403 Forbidden", "AccessDenied")
        with pytest.raises(OSError, match=r"cannot write s3://.*/ck/files/abc: "):
            # one attempt: pyarrow reports some refused parts only at the completion,
            # as a transient INTERNAL_FAILURE that a retry would cure
            write(open_filesystem(uri, {**options, "retry_max_attempts": 1}))
        assert not storage.exists("files/abc")
        assert _objects(storage) == []
        fail_next_s3_requests(options, "PUT", "503 Slow Down", "SlowDown")
        write(storage)
        assert storage.read("files/abc") == data
        assert _objects(storage) == ["files/abc"]
    finally:
        reset_s3_request_counts(options)


def test_a_local_commit_flushes_its_changelog_and_directory_before_the_commit_point(
    tmp_path, monkeypatch
):
    """os.fsync (recorded) is called on the changelog's file and on the folders
    whose entries the publish changed before the commit's ``uploaded`` step (the
    commit point has passed): a power loss after it keeps the version."""
    import os
    import re

    from sessionstore.checkpoint.partition.provider import CommitStep

    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    seen: dict[int, list[str]] = {}

    def observer(step: CommitStep) -> None:
        if step.step == "uploaded":
            seen[step.version] = list(synced)

    provider = StateStoreProvider(
        f"file://{tmp_path}/remote", "op", 0, SPECS, str(tmp_path / "local"),
        commit_observer=observer,
    )  # fmt: skip
    monkeypatch.setattr(os, "fsync", recording_fsync)
    for version in (0, 1):
        handle = provider.get_store(version)
        handle["sessions"].put("k", 0, version, {"n": version})
        synced.clear()
        handle.commit()
    provider.close()
    group = f"{tmp_path}/remote/op/0/changelog/0"
    for version in (1, 2):
        fsyncs = seen[version]
        name = re.escape(f"{group}/.{version}.changelog.")
        assert any(re.fullmatch(rf"{name}[0-9a-f]{{32}}\.tmp", p) for p in fsyncs), fsyncs
        assert group in fsyncs, fsyncs  # the link to its name
    # the first changelog also created the group folder, an entry of changelog/
    assert f"{tmp_path}/remote/op/0/changelog" in seen[1]


def test_where_a_file_shows_while_it_is_written_a_write_goes_to_a_hidden_name_first(tmp_path):
    """A pyarrow.fs store other than S3 and GCS (HDFS, a custom one; here a
    SubTreeFileSystem) shows a file while it is written: a write goes to a hidden
    name and is renamed once whole, so one that fails leaves nothing at the name
    (the source here is a folder, which fails once the upload has begun), and a
    replacement is whole too."""
    import pyarrow.fs as pafs

    from sessionstore.checkpoint.storage.filesystem import Storage

    (tmp_path / "store").mkdir()
    fs = pafs.SubTreeFileSystem(str(tmp_path / "store"), pafs.LocalFileSystem())
    storage = Storage(fs, "ck", "custom://ck")
    assert not storage.local
    with pytest.raises(IsADirectoryError):
        storage.upload_file(str(tmp_path), "a/b")
    assert not storage.exists("a/b")
    assert _objects(storage) == []
    storage.write_atomic("a/b", b"first")
    storage.write_atomic("a/b", b"second")
    assert storage.read("a/b") == b"second" and _objects(storage) == ["a/b"]


def test_a_small_upload_whose_local_read_fails_publishes_nothing_on_s3(s3_bucket, tmp_path):
    """A pack or file of at most SINGLE_PUT_BYTES goes to its name in one PUT, which
    the stream's close sends even after an exception: so it is read whole before the
    stream opens, and a local read that fails (here a member that is a folder) leaves
    nothing at the final name. Invariant 10."""
    base, options = s3_bucket
    storage = open_filesystem(f"{base}/ck", options)
    first = tmp_path / "first"
    first.write_bytes(b"x" * 1000)
    unreadable = tmp_path / "a-folder"
    unreadable.mkdir()
    with pytest.raises(IsADirectoryError):
        storage.upload_files([str(first), str(unreadable)], "files/abc")
    assert not storage.exists("files/abc")
    storage.upload_files([str(first), str(first)], "files/abc")
    assert storage.read("files/abc") == b"x" * 2000
