"""StateBackend.from_conf reads the memory budget with the other keys (no Spark
session needed), and the budget travels to the executors with the backend."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from spark_integration.conf.backend import StateBackend
from tests.spark.fakes import FakeContext


def fake_spark(conf: dict[str, str]) -> SimpleNamespace:
    return SimpleNamespace(
        conf=SimpleNamespace(get=lambda key, default=None: conf.get(key, default), getAll=conf),
        sparkContext=FakeContext(getConf=lambda: SimpleNamespace(getAll=lambda: [])),
    )


def test_memory_max_mb_is_read_from_conf_and_travels_with_the_backend():
    conf = {"spark.sessionstore.checkpointUri": "file:///tmp/ck"}
    assert StateBackend.from_conf(fake_spark(conf)).memory_max_mb is None  # the default
    backend = StateBackend.from_conf(fake_spark({**conf, "spark.sessionstore.memory.maxMB": "96"}))
    assert backend.memory_max_mb == 96
    assert "memory_max_mb=96" in repr(backend)
    assert pickle.loads(pickle.dumps(backend)).memory_max_mb == 96


@pytest.mark.parametrize("bad", ["0", "-5", "lots", "1.5"])
def test_bad_memory_conf_names_the_key_and_value(bad):
    conf = {
        "spark.sessionstore.checkpointUri": "file:///tmp/ck",
        "spark.sessionstore.memory.maxMB": bad,
    }
    with pytest.raises(ValueError, match=rf"spark\.sessionstore\.memory\.maxMB .*{bad!r}"):
        StateBackend.from_conf(fake_spark(conf))


@pytest.mark.parametrize("bad", [0, -1, 2.5, "64"])
def test_bad_memory_max_mb_is_refused(bad):
    with pytest.raises(ValueError, match=rf"memory_max_mb must be a positive int.*{bad!r}"):
        StateBackend("file:///tmp/ck", memory_max_mb=bad)


def test_retry_settings_are_read_from_conf_and_reach_every_storage():
    """spark.sessionstore.retry.* (not under .storage., whose keys go to pyarrow.fs)
    travel in the backend's storage options, so every process applies them."""
    from sessionstore.checkpoint.storage.filesystem import open_filesystem

    conf = {
        "spark.sessionstore.checkpointUri": "s3://bucket/ck",
        "spark.sessionstore.retry.maxAttempts": "4",
        "spark.sessionstore.retry.maxSeconds": "7.5",
        "spark.sessionstore.storage.region": "us-east-1",
    }
    backend = pickle.loads(pickle.dumps(StateBackend.from_conf(fake_spark(conf))))
    assert (backend.retry_max_attempts, backend.retry_max_seconds) == (4, 7.5)
    storage = open_filesystem(backend.checkpoint_uri, backend.storage_options)
    assert (storage.retry.max_attempts, storage.retry.max_seconds) == (4, 7.5)
    direct = StateBackend("s3://bucket/ck", retry_max_attempts=2, storage_options={"region": "x"})
    assert direct.storage_options == {"region": "x", "retry_max_attempts": 2}
    for key, bad in [("maxAttempts", "many"), ("maxAttempts", "0"), ("maxSeconds", "-1")]:
        with pytest.raises(ValueError, match=rf"{bad}"):
            StateBackend.from_conf(fake_spark({**conf, f"spark.sessionstore.retry.{key}": bad}))
def test_the_orphan_grace_is_read_from_conf_and_reaches_the_provider():
    conf = {"spark.sessionstore.checkpointUri": "file:///tmp/ck"}
    assert StateBackend.from_conf(fake_spark(conf)).orphan_grace_s == 600.0  # the default
    key = "spark.sessionstore.gc.orphanGraceSeconds"
    backend = StateBackend.from_conf(fake_spark({**conf, key: "90.5"}))
    assert backend.orphan_grace_s == 90.5 and "orphan_grace_s=90.5" in repr(backend)
    with pytest.raises(ValueError, match=r"got -1\.0 \(conf key spark\.sessionstore\.gc\.orph"):
        StateBackend.from_conf(fake_spark({**conf, key: "-1"}))
    with pytest.raises(ValueError, match="orphan_grace_s must be a number of seconds >= 0"):
        StateBackend("file:///tmp/ck", orphan_grace_s="soon")


def test_allow_pickle_is_off_unless_the_conf_or_the_backend_says_so():
    """The job's opt-in to a checkpoint that records the pickle serde
    (docs/security.md; what it guards: tests/checkpoint/test_processor_pickle.py)."""
    conf = {"spark.sessionstore.checkpointUri": "file:///tmp/ck"}
    assert StateBackend.from_conf(fake_spark(conf)).allow_pickle is False
    key = "spark.sessionstore.allowPickle"
    backend = StateBackend.from_conf(fake_spark({**conf, key: "TRUE"}))
    assert pickle.loads(pickle.dumps(backend)).allow_pickle is True
    assert "allow_pickle=True" in repr(backend)
    with pytest.raises(ValueError, match=r"spark\.sessionstore\.allowPickle must be true or false, got 'yes'"):
        StateBackend.from_conf(fake_spark({**conf, key: "yes"}))
    with pytest.raises(ValueError, match="allow_pickle must be True or False, got 1"):
        StateBackend("file:///tmp/ck", allow_pickle=1)
