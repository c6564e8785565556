"""Rescale on restart without Spark (checkpoint/offline/rescale.py, generation.py): the new
generation is read only after the switch, a partition committed during the copy
stops the switch, and every refusal leaves the checkpoint as it was. The Spark
query side is tests/spark/test_rescale.py."""

from __future__ import annotations

import pytest

from sessionstore import StateStoreProvider
from sessionstore.checkpoint.offline.repartition import copy_partitions
from sessionstore.checkpoint.offline.rescale import (
    RescaleError,
    commit_rescale,
    drop_state,
    plan_rescale,
)
from sessionstore.checkpoint.partition.provider import CheckpointMismatchError
from sessionstore.checkpoint.records.generation import GENERATION_FIELD, state_root
from sessionstore.checkpoint.records.layout import read_metadata
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.tools.reader import CheckpointSource, store_rows
from tests.checkpoint.test_repartition import SPECS, write_source


def _rows(uri):
    """``(partition, row)`` of every row of every store, as the CLI reads them."""
    source = CheckpointSource(uri)
    return {
        (r["partition"], repr({k: v for k, v in r.items() if k != "partition"}))
        for spec in SPECS
        for r in store_rows(source, "op", spec.name, raw=True)
    }


def _sessions(uri):
    return sorted(row for _, row in _rows(uri))


@pytest.mark.slow
def test_the_switch_is_the_one_write_that_moves_readers(tmp_path):
    uri = f"file://{tmp_path}/ck"
    write_source(uri, str(tmp_path / "l"))
    before, metadata = _sessions(uri), read_metadata(open_filesystem(uri).child("op"))
    plan = plan_rescale(uri, "op", 7)
    assert copy_partitions(plan.copy) > 0
    # a whole copy, not switched to: readers still find the old partitions
    assert state_root(uri, "op") == uri
    assert read_metadata(open_filesystem(uri).child("op")) == metadata
    assert CheckpointSource(uri).partitions("op") == [0, 1, 2, 3]
    commit_rescale(plan)
    root = state_root(uri, "op")
    assert root == f"{uri}/op/_generations/{plan.generation}"
    switched = read_metadata(open_filesystem(uri).child("op"))
    assert (switched["num_partitions"], switched[GENERATION_FIELD]) == (7, plan.generation)
    # a release without generations refuses the switched _metadata by its format; this
    # one, opened at the checkpoint root instead of the generation, says where to look
    assert switched["format"] == 2
    with pytest.raises(
        CheckpointMismatchError,
        match=rf"ck/op/_metadata was rescaled: its state is in {root}, a checkpoint root",
    ):
        StateStoreProvider(uri, "op", 0, SPECS, str(tmp_path / "l2"), num_partitions=7)
    assert CheckpointSource(uri).partitions("op") == list(range(7))
    assert max(p for p, _ in _rows(uri)) > 3
    assert _sessions(uri) == before
    drop_state(plan)
    assert [d for d in open_filesystem(uri).child("op").list_dirs() if d.isdigit()] == []
    assert _sessions(uri) == before
    # a second rescale reads the generation and replaces it
    again = plan_rescale(uri, "op", 3)
    assert again.source_root == root
    copy_partitions(again.copy)
    commit_rescale(again)
    drop_state(again)
    assert open_filesystem(uri).child("op").list_dirs("_generations") == [again.generation]
    assert _sessions(uri) == before


def test_a_commit_during_the_copy_stops_the_switch(tmp_path):
    uri, local = f"file://{tmp_path}/ck", str(tmp_path / "l")
    write_source(uri, local)
    metadata = read_metadata(open_filesystem(uri).child("op"))
    plan = plan_rescale(uri, "op", 7)
    copy_partitions(plan.copy)
    provider = StateStoreProvider(uri, "op", 2, SPECS, local, num_partitions=4)
    handle = provider.get_store(3)  # the query still running commits batch 3
    handle.commit()
    provider.close()
    with pytest.raises(
        RescaleError,
        match=r"ck/op was committed to while it was rescaled \(it was at version 3, now: the "
        r"partitions .* are not at one version .*\): another query holds the checkpoint; "
        r"stop it first. Nothing was switched",
    ):
        commit_rescale(plan)
    assert read_metadata(open_filesystem(uri).child("op")) == metadata
    assert state_root(uri, "op") == uri


def test_refusals_name_the_reason_and_write_nothing(tmp_path):
    uri = f"file://{tmp_path}/ck"
    write_source(uri, str(tmp_path / "l"), key_types=None)
    with pytest.raises(
        RescaleError,
        match=r"cannot rescale .*ck/op to 7 partitions on restart: .* does not record the "
        r"Spark types of its key columns .*; the checkpoint is unchanged",
    ):
        plan_rescale(uri, "op", 7)
    with pytest.raises(RescaleError, match=r"cannot rescale .*ck/nope to 7 .* does not exist"):
        plan_rescale(uri, "nope", 7)
    assert not open_filesystem(uri).child("op").exists("_generations")


@pytest.mark.slow
def test_two_rescales_of_one_state_switch_once_and_keep_the_winner(tmp_path, monkeypatch):
    """Two drivers rescale the same version at once: both copy, both pass the check
    that the source is unchanged, then the first switches before the second: the
    second is refused by name, and no cleanup deletes the generation the root names."""
    from sessionstore.checkpoint.offline import rescale

    uri = f"file://{tmp_path}/ck"
    write_source(uri, str(tmp_path / "l"))
    before = _sessions(uri)
    first, second = plan_rescale(uri, "op", 7), plan_rescale(uri, "op", 5)
    copy_partitions(first.copy)
    copy_partitions(second.copy)
    claim = rescale._claim

    def first_switches_meanwhile(root, plan):
        monkeypatch.setattr(rescale, "_claim", claim)
        commit_rescale(first)  # between the second's check and its switch
        claim(root, plan)

    monkeypatch.setattr(rescale, "_claim", first_switches_meanwhile)
    with pytest.raises(RescaleError, match=rf"generation {first.generation}\) claimed the switch"):
        commit_rescale(second)
    drop_state(second)  # the loser's cleanup touches nothing
    assert state_root(uri, "op") == f"{uri}/op/_generations/{first.generation}"
    assert _sessions(uri) == before
    drop_state(first)
    assert open_filesystem(uri).child("op").list_dirs("_generations") == [first.generation]
    assert _sessions(uri) == before
    assert CheckpointSource(uri).partitions("op") == list(range(7))


def test_a_named_generation_that_is_gone_is_refused_not_read_as_empty(tmp_path):
    uri = f"file://{tmp_path}/ck"
    write_source(uri, str(tmp_path / "l"))
    plan = plan_rescale(uri, "op", 3)
    copy_partitions(plan.copy)
    commit_rescale(plan)
    drop_state(plan)
    open_filesystem(uri).child("op").delete_dir(f"_generations/{plan.generation}")
    with pytest.raises(
        Exception, match=rf"names the generation '{plan.generation}', which holds no state"
    ):
        state_root(uri, "op")
    with pytest.raises(Exception, match="holds no state"):
        _sessions(uri)


def test_verify_checks_the_generation_a_rescale_switched_to(tmp_path):
    from sessionstore.checkpoint.offline.verify import verify_checkpoint

    uri = f"file://{tmp_path}/ck"
    write_source(uri, str(tmp_path / "l"))
    plan = plan_rescale(uri, "op", 7)
    copy_partitions(plan.copy)
    commit_rescale(plan)
    drop_state(plan)
    result = verify_checkpoint(uri)
    assert (result.partitions, result.problems) == (7, [])
