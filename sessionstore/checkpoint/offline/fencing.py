"""Fencing the state a rescale on restart replaced (records/fence.py says what a
fence is and why it costs the commit path nothing), and deleting that state
around its fences.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack

from sessionstore.checkpoint.records.fence import fence_record, fenced_by
from sessionstore.checkpoint.records.layout import EVENT_TIME_DIR, FENCED_MARKER, changelog_name
from sessionstore.checkpoint.storage.filesystem import Storage

__all__ = ["fence_state", "unfence_state", "drop_fenced_state", "fenced_state_reduced"]

#: Fences written at once (one request each on an object store).
_THREADS = 16


def fence_state(state: Storage, partitions: int, version: int, generation: str) -> list[int]:
    """Fence ``version`` in each of the ``partitions`` partitions of the operator
    folder ``state``: its marker first, then a fence at the name of changelog
    ``version`` in every partition, several at once. Returns the partitions where
    that name was taken already (a commit of the old query landed first), whose
    fence is not written. A fence of ``generation`` there already counts as
    written: fencing again after a crash finishes the fences. Where the store has
    no exclusive create, each name is looked at before it is written (a commit
    racing that look is not seen)."""
    _write_marker(state, version, generation, reduced=False)
    record, name = fence_record(generation), changelog_name(version)

    def ours(rel: str) -> bool:
        try:
            return fenced_by(state.read(rel)) == generation
        except FileNotFoundError:  # a conditional write of it still under way
            return False

    def fence(partition: int) -> bool:
        rel = f"{partition}/{name}"
        if state.exclusive_create:
            return state.write_exclusive(rel, record) or ours(rel)
        if state.exists(rel):
            return ours(rel)
        state.write_atomic(rel, record)
        return True

    with ThreadPoolExecutor(min(_THREADS, max(partitions, 1))) as pool:
        written = list(pool.map(fence, range(partitions)))
    return [p for p, ok in enumerate(written) if not ok]


def unfence_state(state: Storage, partitions: list[int], version: int) -> None:
    """Remove the fences of ``version`` in ``partitions`` of ``state`` and its
    marker (a switch taken back)."""
    name = changelog_name(version)
    for partition in partitions:
        state.delete(f"{partition}/{name}")
    state.delete(FENCED_MARKER)


def drop_fenced_state(state: Storage) -> bool:
    """Delete the partitions and event-time files of the operator folder ``state``
    but its fences (the marker says which version); False, deleting nothing, when
    it has no marker. Done once: the marker then says so."""
    marker = _read_marker(state)
    if marker is None:
        return False
    if marker.get("reduced"):
        return True
    version = int(marker["version"])
    group, fence = changelog_name(version).rsplit("/", 1)
    for partition in (d for d in state.list_dirs() if d.isdigit()):
        for folder in state.list_dirs(partition):
            if folder != "changelog":
                state.delete_dir(f"{partition}/{folder}")
        for folder in state.list_dirs(f"{partition}/changelog"):
            if f"changelog/{folder}" != group:
                state.delete_dir(f"{partition}/changelog/{folder}")
        for name in state.list(f"{partition}/{group}"):
            if name != fence:
                state.delete(f"{partition}/{group}/{name}")
    state.delete_dir(EVENT_TIME_DIR)
    _write_marker(state, version, str(marker.get("generation")), reduced=True)
    return True


def fenced_state_reduced(state: Storage) -> bool:
    """Whether the operator folder ``state`` was fenced and reduced to its fences
    (:func:`drop_fenced_state` done)."""
    marker = _read_marker(state)
    return marker is not None and bool(marker.get("reduced"))


def _write_marker(operator_storage: Storage, version: int, generation: str, reduced: bool) -> None:
    """Write :data:`FENCED_MARKER` (msgpack ``{"version", "generation", "reduced"}``):
    record that the state in ``operator_storage`` is fenced at ``version`` (and,
    ``reduced``, that nothing but its fences is left)."""
    record = {"version": version, "generation": generation, "reduced": reduced}
    operator_storage.write_atomic(FENCED_MARKER, msgpack.packb(record))


def _read_marker(operator_storage: Storage) -> dict[str, Any] | None:
    """The marker of a fenced state, None when it has none."""
    try:
        return msgpack.unpackb(operator_storage.read(FENCED_MARKER), raw=False)
    except FileNotFoundError:
        return None
