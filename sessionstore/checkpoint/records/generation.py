"""Where an operator's state lives: its checkpoint root, or the *generation* its
last rescale on restart wrote (docs/rescale.md, "Rescale on restart").

A generation ``<root>/<operator>/_generations/<id>`` is itself a checkpoint root in
the usual layout. The operator's ``_metadata`` at the checkpoint root names it
(:data:`GENERATION_FIELD`), written last by the rescale: the one switch between
the old state and the new. Every reader of partitions goes through
:func:`state_root`.
"""

from __future__ import annotations

from typing import Any

from sessionstore.checkpoint.records.layout import METADATA, read_metadata
from sessionstore.checkpoint.storage.filesystem import open_filesystem
from sessionstore.errors import SessionStoreError
from sessionstore.stores.base import check_store_name

__all__ = [
    "GENERATION_FIELD",
    "GENERATIONS_DIR",
    "GENERATION_FORMAT",
    "state_root",
    "generation_root",
]

#: The field of an operator's root ``_metadata`` naming the generation that holds
#: its state (absent: the checkpoint root holds it).
GENERATION_FIELD = "generation"
#: The folder of an operator's directory holding its generations.
GENERATIONS_DIR = "_generations"
#: The ``format`` of a root ``_metadata`` that names a generation: a release that
#: knows no generations refuses it by its format check, where it would otherwise
#: find no partitions at the root and start the operator from empty state.
GENERATION_FORMAT = 2


def is_generation_name(name: object) -> bool:
    """Whether ``name``, read from a checkpoint, can name a generation: letters and
    digits only (a rescale names them with a uuid's hex), so never a path out of
    ``_generations/``. Check it before anything is read or written there."""
    return isinstance(name, str) and name.isalnum()


def generation_root(uri: str, operator: str, generation: str) -> str:
    """The checkpoint root of generation ``generation`` of ``operator`` at ``uri``."""
    return f"{uri.rstrip('/')}/{operator}/{GENERATIONS_DIR}/{generation}"


def state_root(
    uri: str,
    operator: str,
    storage_options: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> str:
    """The checkpoint root holding ``operator``'s state: ``uri``, or the generation
    its ``_metadata`` names (read unless given; ``uri`` when there is none)."""
    check_store_name(operator)
    if metadata is None:
        try:
            metadata = read_metadata(open_filesystem(uri, storage_options).child(operator))
        except FileNotFoundError:
            return uri
    generation = metadata.get(GENERATION_FIELD)
    if generation is None:
        return uri
    if not is_generation_name(generation):
        raise SessionStoreError(
            f"{uri}/{operator}/_metadata names the generation {generation!r}, which no "
            "sessionstore writes (expected letters and digits)"
        )
    root = generation_root(uri, operator, generation)
    if not open_filesystem(root, storage_options).child(operator).exists(METADATA):
        # never read a named generation that holds nothing as empty state
        raise SessionStoreError(
            f"{uri}/{operator}/_metadata names the generation {generation!r}, which "
            f"holds no state ({root}/{operator}/_metadata is missing): the checkpoint "
            "is damaged; restore it from a copy"
        )
    return root
