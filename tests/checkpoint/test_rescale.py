"""Rescale on restart without Spark (checkpoint/offline/rescale.py, generation.py): the new
generation is read only after the switch, a partition committed during the copy
stops the switch, and every refusal leaves the checkpoint as it was. The Spark
query side is tests/spark/test_rescale.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionstore import StateStoreProvider
from sessionstore.checkpoint.offline.repartition import copy_partitions
from sessionstore.checkpoint.offline.rescale import (
    RescaleError,
    commit_rescale,
    copy_rescale,
    drop_state,
    plan_rescale,
    resume_rescale,
)
from sessionstore.checkpoint.partition.provider import CheckpointMismatchError
from sessionstore.checkpoint.records.fence import FencedError, fenced_by
from sessionstore.checkpoint.records.generation import GENERATION_FIELD, state_root
from sessionstore.checkpoint.records.layout import changelog_name, read_metadata
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.tools.reader import CheckpointSource, presented_rows, store_rows
from tests.checkpoint.test_repartition import SPECS, write_source


def _partition_rows(uri):
    """``(partition, row)`` of every row of every store, each row as the CLI's
    :func:`store_rows` shows it (``raw``, without ``partition``). Each partition is
    restored once for all its stores (what :func:`store_rows` does for one store):
    a restore per store and partition was most of this module's time."""
    source = CheckpointSource(uri)
    records = source.store_records("op")
    for p in source.partitions("op"):
        with source.open("op", p) as (_, stores):
            for spec in SPECS:
                where = f"op/{p} store {spec.name!r}"
                for row in presented_rows(stores[spec.name], records[spec.name]["kind"],
                                          where, raw=True):  # fmt: skip
                    yield p, row


def _rows(uri):
    """``(partition, row)`` of every row of every store, as the CLI reads them."""
    return {(p, repr(row)) for p, row in _partition_rows(uri)}


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
    operator = open_filesystem(uri).child("op")  # of the old partitions, their fences
    assert [f for f in operator.list_files() if f[0].isdigit()] == [
        f"{p}/{changelog_name(4)}" for p in range(4)
    ]
    assert _sessions(uri) == before
    # a second rescale reads the generation and replaces it
    again = plan_rescale(uri, "op", 3)
    assert again.source_root == root
    copy_partitions(again.copy)
    commit_rescale(again)
    drop_state(again)
    assert operator.list_dirs("_generations") == sorted([plan.generation, again.generation])
    assert operator.list_files(f"_generations/{plan.generation}/op") == [
        *(f"{p}/{changelog_name(4)}" for p in range(7)), "_fenced", "_metadata"
    ]
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


def _db_rows(handle):
    """Every row of every family of a loaded handle but the local-only meta entries."""
    local = {b"checkpoint_identity", b"last_commit"}
    return {
        (family, key, value)
        for family in handle.db.column_families()
        for key, value in handle.db.scan(family)
        if family != "meta" or key not in local
    }


def test_the_generation_serves_a_replay_of_the_last_batch(tmp_path):
    """Spark replays batch V-1 after a driver crash between the partitions' commits
    and its commit log: it loads V-1 from the generation and, committing V, adopts
    the rescaled V, whose state is the rescaled V loaded directly."""
    uri, local = f"file://{tmp_path}/ck", str(tmp_path / "l")
    write_source(uri, local)
    before = _sessions(uri)
    plan = plan_rescale(uri, "op", 7)
    assert (plan.copy.version, plan.base.plan.version) == (3, 2)
    assert copy_rescale(plan) > 0
    commit_rescale(plan)
    drop_state(plan)
    assert _sessions(uri) == before  # the continuing query's version 3
    root = state_root(uri, "op")
    for p in range(7):
        direct = StateStoreProvider(root, "op", p, SPECS, f"{local}-d", num_partitions=7)
        whole = _db_rows(direct.get_store(3))
        direct.close()
        replay = StateStoreProvider(root, "op", p, SPECS, f"{local}-r", num_partitions=7)
        handle = replay.get_store(2)
        assert handle.db.get_meta(b"committed_version") is not None
        handle["counts"].put(("replayed", p), 1)  # whatever the replay writes: V is taken
        assert handle.commit() == 3
        assert _db_rows(replay.get_store(3)) == whole
        replay.close()
    assert _sessions(uri) == before


@given(
    old=st.dictionaries(st.binary(max_size=3), st.binary(max_size=2)),
    new=st.dictionaries(st.binary(max_size=3), st.binary(max_size=2)),
)
def test_the_changes_between_two_sorted_tables_rebuild_the_second(old, new):
    from sessionstore.checkpoint.offline import replayable

    changes = dict(replayable._differences(iter(sorted(old.items())), iter(sorted(new.items()))))
    rebuilt = {**old, **changes}
    assert {k: v for k, v in rebuilt.items() if v is not None} == new
    assert all(old.get(k) != v for k, v in changes.items())


def _rescaled(uri, partitions):
    plan = plan_rescale(uri, "op", partitions)
    copy_rescale(plan)
    commit_rescale(plan)
    drop_state(plan)
    return plan


def test_a_query_of_the_old_count_still_running_cannot_commit_after_the_switch(tmp_path):
    """An old query between batches (its partition loaded at version 3) when the
    rescale switches: its next commit meets the fence at version 4 and is refused
    by name; what the old state leaves is its fences, kept by a later rescale."""
    uri, local = f"file://{tmp_path}/ck", str(tmp_path / "l")
    write_source(uri, local)
    before = _sessions(uri)
    old = StateStoreProvider(uri, "op", 1, SPECS, f"{local}-old", num_partitions=4)
    handle = old.get_store(3)
    handle["counts"].put(("late", 1), 1)
    plan = _rescaled(uri, 7)
    with pytest.raises(
        FencedError,
        match=rf"ck/op/1/changelog/0/4.changelog: version 4 is fenced: this checkpoint "
        rf"was rescaled to another partition count \(generation {plan.generation}\)",
    ):
        handle.commit()
    old.close()
    assert _sessions(uri) == before
    operator = open_filesystem(uri).child("op")

    def fences_left(current):
        """Every file of a partition outside the current generation: a fence?"""
        return {
            f: fenced_by(operator.read(f))
            for f in operator.list_files()
            if not f.startswith(f"_generations/{current}/")
            and (f.split("/")[0].isdigit() or f.split("/")[3:4] and f.split("/")[3].isdigit())
        }

    fences = {f"{p}/{changelog_name(4)}": plan.generation for p in range(4)}
    assert fences_left(plan.generation) == fences
    again = _rescaled(uri, 3)  # the first generation's state leaves its fences too
    gen = f"_generations/{plan.generation}/op"
    fences.update({f"{gen}/{p}/{changelog_name(4)}": again.generation for p in range(7)})
    assert fences_left(again.generation) == fences
    assert _sessions(uri) == before


def _old_query_at_version_3(tmp_path):
    """A checkpoint of 4 partitions at version 3 and a query of that count between
    batches (partition 1 loaded at version 3): ``(uri, local dir, the operator's
    storage, its _metadata, the query's provider, its store)``."""
    uri, local = f"file://{tmp_path}/ck", str(tmp_path / "l")
    write_source(uri, local)
    operator = open_filesystem(uri).child("op")
    metadata = read_metadata(operator)
    old = StateStoreProvider(uri, "op", 1, SPECS, f"{local}-old", num_partitions=4)
    return uri, local, operator, metadata, old, old.get_store(3)


def test_a_commit_between_the_switch_and_its_fence_takes_the_switch_back(tmp_path, monkeypatch):
    """The old query commits partition 1's version 4 after the switch, before the
    fences: the copy lacks it, so the switch is taken back, the fences written are
    removed, and the old query goes on committing."""
    from sessionstore.checkpoint.offline import rescale

    uri, local, operator, metadata, old, handle = _old_query_at_version_3(tmp_path)
    plan = plan_rescale(uri, "op", 7)
    copy_rescale(plan)
    fence = rescale.fence_state

    def commits_first(state, partitions, version, generation):
        assert state_root(uri, "op") == plan.copy.target_uri  # switched
        assert handle.commit() == 4
        return fence(state, partitions, version, generation)

    monkeypatch.setattr(rescale, "fence_state", commits_first)
    with pytest.raises(
        RescaleError,
        match=r"ck/op: partitions \[1\] committed version 4 right after the rescale's "
        r"switch .*: the switch is taken back, nothing is lost; stop that query first",
    ):
        commit_rescale(plan)
    assert read_metadata(operator) == metadata
    assert state_root(uri, "op") == uri
    assert not operator.exists("_fenced")
    assert [p for p in range(4) if operator.exists(f"{p}/{changelog_name(4)}")] == [1]
    other = StateStoreProvider(uri, "op", 0, SPECS, f"{local}-old", num_partitions=4)
    assert other.get_store(3).commit() == 4  # no fence left in its way
    other.close()
    assert old.get_store(4).commit() == 5
    old.close()


def test_erase_and_rewrite_follow_the_generation_of_a_rescaled_checkpoint(tmp_path):
    from sessionstore.checkpoint.offline.erase import erase
    from sessionstore.tools.rewrite import rewrite
    from tests.checkpoint.test_repartition import KEYS

    uri = f"file://{tmp_path}/ck"
    write_source(uri, str(tmp_path / "l"))
    plan = _rescaled(uri, 7)
    root = state_root(uri, "op")

    def rows_of(key):
        return [(p, row) for p, row in _partition_rows(uri) if row["key"] == key]

    key, kept = KEYS[3], _sessions(uri)
    assert rows_of(key)
    done = erase(uri, "op", key=[key], force=True)
    assert (done["version"], done["keys"]) == (3, 1)
    assert rows_of(key) == []
    assert len(_sessions(uri)) < len(kept)
    assert state_root(uri, "op") == root  # the change is the generation's
    def sessions():
        rows = store_rows(CheckpointSource(uri), "op", "sessions")
        return sorted(repr({k: v for k, v in r.items() if k != "partition"}) for r in rows)

    done = rewrite(uri, "op", lambda r: {**r, "value": {"n": 99}}, store="sessions", force=True)
    assert done["changed"] > 0
    after = sessions()
    assert after and all("'value': {'n': 99}" in r for r in after)
    again = _rescaled(uri, 3)  # and a rescale after them carries them
    assert state_root(uri, "op") != root
    assert rows_of(key) == []
    assert sessions() == after
    assert CheckpointSource(uri).partitions("op") == list(range(again.copy.partitions))
    assert plan.generation != again.generation


class _Killed(Exception):
    """The rescale's process dies here (kill -9: nothing after it runs)."""


def _die(*args, **kwargs):
    raise _Killed()


def test_a_rescale_killed_between_its_claim_and_its_switch_is_finished_by_a_restart(
    tmp_path, monkeypatch
):
    """The claim is taken, the switch never written: the old count still loads the
    old state, and a restart at the new count switches to the claimed generation
    (written whole before its claim) instead of being refused for good."""
    from sessionstore.checkpoint.offline import rescale

    uri = f"file://{tmp_path}/ck"
    write_source(uri, str(tmp_path / "l"))
    before = _sessions(uri)
    first = plan_rescale(uri, "op", 7)
    copy_rescale(first)
    monkeypatch.setattr(rescale, "write_metadata", _die)  # the switch
    with pytest.raises(_Killed):
        commit_rescale(first)
    monkeypatch.undo()
    assert state_root(uri, "op") == uri
    assert _sessions(uri) == before
    with pytest.raises(RescaleError, match=r"claimed the switch first"):
        commit_rescale(_copied(plan_rescale(uri, "op", 5)))  # another count: refused
    again = _copied(plan_rescale(uri, "op", 7))
    commit_rescale(again)
    assert state_root(uri, "op") == f"{uri}/op/_generations/{first.generation}"
    assert _sessions(uri) == before
    assert CheckpointSource(uri).partitions("op") == list(range(7))
    assert resume_rescale(uri, "op")  # the next start deletes what is left
    assert not resume_rescale(uri, "op")
    operator = open_filesystem(uri).child("op")
    assert operator.list_dirs("_generations") == [first.generation]
    assert fenced_by(operator.read(f"0/{changelog_name(4)}")) == first.generation
    assert _sessions(uri) == before


def test_a_claim_left_by_a_killed_rescale_never_brings_back_what_an_erase_removed(
    tmp_path, monkeypatch
):
    """A rescale dies between its claim and its switch; an erase then commits version
    3 again at the old count: the next rescale copies the erased state, never the
    claimed copy of the version as it was."""
    from sessionstore.checkpoint.offline import rescale
    from sessionstore.checkpoint.offline.erase import erase
    from tests.checkpoint.test_repartition import KEYS

    uri = f"file://{tmp_path}/ck"
    write_source(uri, str(tmp_path / "l"))
    first = _copied(plan_rescale(uri, "op", 7))
    monkeypatch.setattr(rescale, "write_metadata", _die)  # the switch
    with pytest.raises(_Killed):
        commit_rescale(first)
    monkeypatch.undo()
    assert erase(uri, "op", key=[KEYS[3]], force=True)["version"] == 3
    erased = _sessions(uri)
    again = _copied(plan_rescale(uri, "op", 7))
    commit_rescale(again)
    assert state_root(uri, "op") == f"{uri}/op/_generations/{again.generation}"
    assert _sessions(uri) == erased
    assert CheckpointSource(uri).partitions("op") == list(range(7))


def _copied(plan):
    copy_rescale(plan)
    return plan


def _killed_after_the_switch(uri, local, monkeypatch):
    """A query of the old count loaded at version 3, then a rescale to 7 dies right
    after its switch, before any fence. Returns (that query's store, plan)."""
    from sessionstore.checkpoint.offline import rescale

    old = StateStoreProvider(uri, "op", 1, SPECS, f"{local}-old", num_partitions=4)
    handle = old.get_store(3)
    handle["counts"].put(("late", 1), 1)
    plan = _copied(plan_rescale(uri, "op", 7))
    monkeypatch.setattr(rescale, "fence_state", _die)
    with pytest.raises(_Killed):
        commit_rescale(plan)
    monkeypatch.undo()
    assert state_root(uri, "op") == plan.copy.target_uri
    return old, handle, plan


def test_a_rescale_killed_between_its_switch_and_its_fences_is_fenced_at_the_next_start(
    tmp_path, monkeypatch
):
    """The start of the query at the new count finishes the fences before its first
    batch: the old query, warm at version 3, cannot commit 4 unseen."""
    from spark_integration.conf.backend import StateBackend
    from spark_integration.planning.rescale import located_backend

    uri, local = f"file://{tmp_path}/ck", str(tmp_path / "l")
    write_source(uri, local)
    before = _sessions(uri)
    old, handle, plan = _killed_after_the_switch(uri, local, monkeypatch)
    backend = StateBackend(uri, local_dir=f"{local}-new")
    assert located_backend(None, backend, "op", 7).checkpoint_uri == plan.copy.target_uri
    with pytest.raises(FencedError, match=r"version 4 is fenced"):
        handle.commit()
    old.close()
    assert _sessions(uri) == before
    operator = open_filesystem(uri).child("op")
    assert sorted(f for f in operator.list_files() if f[0].isdigit()) == [
        f"{p}/{changelog_name(4)}" for p in range(4)
    ]


def test_a_commit_before_the_fences_of_a_killed_rescale_takes_its_switch_back(
    tmp_path, monkeypatch
):
    """The old query commits version 4 after the switch of a rescale that died before
    its fences: the next start takes the switch back by name, nothing is lost."""
    uri, local = f"file://{tmp_path}/ck", str(tmp_path / "l")
    write_source(uri, local)
    operator = open_filesystem(uri).child("op")
    metadata = read_metadata(operator)
    old, handle, plan = _killed_after_the_switch(uri, local, monkeypatch)
    assert handle.commit() == 4  # no fence in its way yet
    with pytest.raises(RescaleError, match=r"ck/op: partitions \[1\] committed version 4"):
        resume_rescale(uri, "op")
    assert read_metadata(operator) == metadata
    assert state_root(uri, "op") == uri
    assert [p for p in range(4) if operator.exists(f"{p}/{changelog_name(4)}")] == [1]
    assert old.get_store(4).commit() == 5
    old.close()


def test_a_rescale_killed_while_it_takes_its_switch_back_leaves_the_old_count_going(
    tmp_path, monkeypatch
):
    """An old commit lands between the switch and the fences, and the rescale dies
    while it takes the switch back: the next start takes it back, and the old
    query's other partitions commit, no fence left in their way."""
    from sessionstore.checkpoint.offline import rescale

    uri, local, operator, metadata, old, handle = _old_query_at_version_3(tmp_path)
    plan = _copied(plan_rescale(uri, "op", 7))
    fence, unfence = rescale.fence_state, rescale.unfence_state

    def commits_first(state, partitions, version, generation):
        assert handle.commit() == 4
        return fence(state, partitions, version, generation)

    def dies_half_way(state, partitions, version):
        unfence(state, partitions[:1], version)
        raise _Killed()

    monkeypatch.setattr(rescale, "fence_state", commits_first)
    monkeypatch.setattr(rescale, "unfence_state", dies_half_way)
    with pytest.raises(_Killed):
        commit_rescale(plan)
    monkeypatch.undo()
    with pytest.raises(RescaleError, match=r"partitions \[1\] committed version 4"):
        resume_rescale(uri, "op")  # the next start
    assert read_metadata(operator) == metadata
    assert not operator.exists("_fenced")
    other = StateStoreProvider(uri, "op", 0, SPECS, f"{local}-old", num_partitions=4)
    assert other.get_store(3).commit() == 4
    other.close()
    old.close()


def test_a_switch_whose_fence_names_a_foreign_root_is_refused_and_fences_nothing_there(
    tmp_path, monkeypatch
):
    """A bucket writer points the switch's record of the replaced state at another
    checkpoint: the next start refuses it by name and writes no fence there (a
    start never fences or deletes outside its own checkpoint)."""
    from sessionstore.checkpoint.records.layout import write_metadata

    uri, local = f"file://{tmp_path}/ck", str(tmp_path / "l")
    other = f"file://{tmp_path}/other"
    write_source(uri, local)
    write_source(other, f"{local}-other")
    old, handle, _ = _killed_after_the_switch(uri, local, monkeypatch)
    operator = open_filesystem(uri).child("op")
    switch = read_metadata(operator)
    write_metadata(operator, {**switch, "fence": {**switch["fence"], "root": other}})
    with pytest.raises(RescaleError, match=r"names '.*/other' as the state it replaced"):
        resume_rescale(uri, "op")
    foreign = open_filesystem(other).child("op")
    assert not [f for f in foreign.list_files() if f.endswith(changelog_name(4))]
    old.close()


def test_a_claim_that_names_a_path_out_of_the_generations_is_refused_unread(
    tmp_path, monkeypatch
):
    """A rescale dies between its claim and its switch; a bucket writer then points
    the claim at another checkpoint. The restart refuses the claim without reading
    anything there (a claim's content is never a path to follow), and the
    checkpoint keeps its old state."""
    from sessionstore.checkpoint.offline import rescale

    uri, local = f"file://{tmp_path}/ck", str(tmp_path / "l")
    write_source(uri, local)
    write_source(f"file://{tmp_path}/other", f"{local}-other")
    before = _sessions(uri)
    first = _copied(plan_rescale(uri, "op", 7))
    monkeypatch.setattr(rescale, "write_metadata", _die)  # the switch
    with pytest.raises(_Killed):
        commit_rescale(first)
    monkeypatch.undo()
    generations = open_filesystem(uri).child("op").child("_generations")
    (claim,) = [f for f in generations.list_files() if f.endswith(".claim")]
    generations.write_atomic(claim, b"../../../other")  # {uri}/op/_generations/../../../other
    read = []
    monkeypatch.setattr(
        rescale, "read_metadata", lambda storage: read.append(storage.root) or read_metadata(storage)
    )
    with pytest.raises(RescaleError, match=r"generation \.\./\.\./\.\./other\) claimed"):
        commit_rescale(_copied(plan_rescale(uri, "op", 7)))
    assert read and not [root for root in read if "other" in root]
    assert state_root(uri, "op") == uri
    assert _sessions(uri) == before
