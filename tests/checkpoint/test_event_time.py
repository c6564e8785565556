"""The durable record of an operator's event time: changelog headers (and the
per-partition file a repartitioned copy's first version reads)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.records.event_time import (
    MissingEventTimeError,
    durable_event_time,
    partition_event_time,
)
from sessionstore.checkpoint.records.layout import changelog_name, event_time_name
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.encoding.ints import INT64

SPECS = [StoreSpec("sessions", "session", 10**9)]


def commit_batches(uri, local, times_by_batch, options=None):
    """Commit one version per batch for every partition: ``times_by_batch[b][p]``
    is partition p's event time after batch b."""
    partitions = len(times_by_batch[0])
    operator = open_filesystem(uri, options).child("op")
    for p in range(partitions):
        provider = StateStoreProvider(
            uri, "op", p, SPECS, local, storage_options=options, num_partitions=partitions
        )
        for batch, times in enumerate(times_by_batch):
            handle = provider.get_store(batch)
            handle.note_event_time(times[p])
            handle.commit()
        provider.close()
    return operator


def test_each_partition_records_its_event_time_in_its_changelog(checkpoint_location, tmp_path):
    uri, options = checkpoint_location
    operator = commit_batches(uri, tmp_path / "l", [[5, None, 9], [12, 3, None]], options)
    assert [partition_event_time(operator, 0, p) for p in range(3)] == [5, None, 9]
    assert [partition_event_time(operator, 1, p) for p in range(3)] == [12, 3, None]
    assert durable_event_time(operator, 0, 3) == 9
    assert durable_event_time(operator, 1, 3) == 12
    assert durable_event_time(operator, -1, 3) is None  # before the first batch
    assert operator.list_dirs() == ["0", "1", "2"]  # no object of its own


def test_the_header_is_the_record_and_a_partition_without_the_changelog_reads_its_file(
    tmp_path,
):
    """A file beside a changelog is never read (the header holds the record); a
    partition without the changelog (a repartitioned copy) reads the file."""
    operator = commit_batches(f"file://{tmp_path}/r", tmp_path / "l", [[5, None], [7, 8]])
    operator.write_atomic(event_time_name(1, 0), INT64.pack(99))
    operator.write_atomic(event_time_name(0, 1), INT64.pack(99))
    assert [partition_event_time(operator, 1, p) for p in range(2)] == [7, 8]
    assert partition_event_time(operator, 0, 1) is None
    assert durable_event_time(operator, 0, 2) == 5
    operator.delete(f"0/{changelog_name(2)}")
    assert partition_event_time(operator, 1, 0) == 99


def test_a_missing_record_is_an_error_naming_the_changelog(tmp_path):
    operator = commit_batches(f"file://{tmp_path}/r", tmp_path / "l", [[5, 6]])
    with pytest.raises(
        MissingEventTimeError, match=r"op/[01]/changelog/0/2\.changelog does not exist"
    ):
        durable_event_time(operator, 1, 2)


@pytest.mark.slow
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.lists(st.one_of(st.none(), st.integers(-(2**40), 2**40)), min_size=4, max_size=4), min_size=1, max_size=3))  # fmt: skip
def test_the_durable_time_is_the_largest_recorded(tmp_path_factory, times_by_batch):
    tmp = tmp_path_factory.mktemp("et")
    operator = commit_batches(f"file://{tmp}/r", tmp / "l", times_by_batch)
    for batch, times in enumerate(times_by_batch):
        known = [t for t in times if t is not None]
        assert durable_event_time(operator, batch, 4) == (max(known) if known else None)
