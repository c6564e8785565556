"""The fence a rescale on restart leaves in the state it replaced, so that a query
of the old partition count that still runs cannot commit to it unseen.

After its switch (docs/rescale.md), the rescale writes, in every partition of the
state it copied (at version V), an object at the name of changelog V+1: the next
commit of an old query. It is written by the store's exclusive create, the very
fence that keeps two attempts of a batch apart (lineage.py), so the old query's
commit meets a taken name, reads it, as it reads any rival's changelog there,
and is refused with :class:`FencedError`. That costs the commit path nothing:
the name is read only when it is taken. The state's operator folder also gets a
marker (layout.FENCED_MARKER, offline/fencing.py), which tells a later cleanup
to keep the fences when it deletes the rest of that state.
"""

from __future__ import annotations

from sessionstore.errors import SessionStoreError

__all__ = [
    "FencedError",
    "check_not_fence",
    "fence_record",
    "fenced_by",
]

#: The first bytes of a fence (a changelog starts with ``SSCL``).
_MAGIC = b"SSFENCE1"


class FencedError(SessionStoreError):
    """A commit to a state that a rescale on restart replaced (its version fenced)."""


def fence_record(generation: str) -> bytes:
    """The fence written by the rescale that switched to ``generation``."""
    return _MAGIC + generation.encode("ascii")


def fenced_by(data: bytes) -> str | None:
    """The generation whose rescale wrote the fence ``data``; None when ``data`` is
    not a fence."""
    if not data.startswith(_MAGIC):
        return None
    return data[len(_MAGIC) :].decode("ascii", errors="replace")


def check_not_fence(data: bytes, where: str) -> None:
    """:class:`FencedError` when ``data`` (the first bytes of the object at
    ``where``, read as a changelog) is a fence: a reader planned before a rescale
    on restart reads the state that rescale replaced."""
    generation = fenced_by(data)
    if generation is not None:
        raise FencedError(
            f"{where} is a fence, not a changelog: this state was replaced by a rescale "
            f"on restart (generation {generation}) since the read was planned; read the "
            "checkpoint again (docs/rescale.md)"
        )
