"""Storage on a real GCS endpoint (fake-gcs-server): options as text, named errors."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.filesystem import StorageOptionError, open_filesystem, redact

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
    from sessionstore.checkpoint.filesystem import _typed

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
