"""Whether a process runs: for tests that wait on processes they did not start,
and the conftest's check of which runs' folders are left over."""

from __future__ import annotations


def running(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (ended, its exit
    status not yet collected by its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
