"""Which unreferenced content files may be deleted: the orphan sweep's rule.

A content file (``files/<sha256>``) that no listed manifest uses is not
necessarily garbage: another executor's maintenance may have listed ``files/``,
seen it, and be about to write a manifest that uses it. Partitions move between
executors routinely, and the maintenance lock is local to one machine, so
nothing orders two maintenances of one partition. The rule:

* a file is deleted only once it was unreferenced, **with the same stamp**, in
  two sweeps at least ``grace_s`` apart. A re-upload in between (another
  executor's snapshot that uses it again) gives it another stamp and restarts
  its clock;
* an uploader skips a file only when a listed manifest uses it, never merely
  because ``files/`` lists it: an unreferenced file is uploaded again, which
  renews its stamp (see maintenance.py).

So a manifest written more than ``grace_s`` after its uploader renewed the files
it uses is the only way to lose one: ``grace_s`` must exceed the longest
snapshot upload (from the listing of ``files/`` to the manifest write). The
sweep keeps its marks in memory: a provider that starts over marks again, which
only delays a deletion.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OrphanSweep", "DEFAULT_ORPHAN_GRACE_S", "check_orphan_grace"]

#: The default ``grace_s``: far longer than a snapshot upload takes.
DEFAULT_ORPHAN_GRACE_S = 600.0


def check_orphan_grace(grace_s: Any) -> float:
    """``grace_s`` as seconds, or a ``ValueError`` naming the value."""
    if not isinstance(grace_s, int | float) or isinstance(grace_s, bool) or not grace_s >= 0:
        raise ValueError(f"orphan_grace_s must be a number of seconds >= 0, got {grace_s!r}")
    return float(grace_s)


class OrphanSweep:
    """The marks of one partition's sweeps (see the module doc)."""

    def __init__(self, grace_s: float = DEFAULT_ORPHAN_GRACE_S) -> None:
        self.grace_s = check_orphan_grace(grace_s)
        #: name -> (stamp, when it was first seen unreferenced with that stamp)
        self._marks: dict[str, tuple[Any, float]] = {}

    def due(self, stored: dict[str, Any], used: set[str], now: float) -> list[str]:
        """The files of ``stored`` (``name -> stamp``, one listing) to delete at
        time ``now`` (a monotonic clock), given the names listed manifests ``used``;
        the others unreferenced are marked."""
        marks, out = {}, []
        for name, stamp in stored.items():
            if name in used:
                continue
            mark = self._marks.get(name)
            if mark is None or mark[0] != stamp:
                marks[name] = (stamp, now)
            elif now - mark[1] >= self.grace_s:
                out.append(name)
            else:
                marks[name] = mark
        self._marks = marks
        return sorted(out)

    @property
    def marked(self) -> set[str]:
        """Files seen unreferenced and not yet deleted."""
        return set(self._marks)
