"""The engine knows no store kind: it imports nothing above it, and anything with
the public participant protocol can join its batches."""

from __future__ import annotations

import ast
import pathlib
import re

import sessionstore.engine
import sessionstore.process
from sessionstore.engine.db import Database

ENGINE = pathlib.Path(sessionstore.engine.__file__).parent
#: What the engine may build on: itself, the byte formats, the errors and the
#: process-wide state's owner (which imports nothing of sessionstore).
ALLOWED = (
    "sessionstore.engine", "sessionstore.encoding", "sessionstore.errors", "sessionstore.process"
)


def _imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)  # lazy and TYPE_CHECKING imports count too
    return names


def test_engine_imports_no_store_or_higher_layer():
    modules = sorted(ENGINE.glob("*.py"))
    assert {p.name for p in modules} >= {"db.py", "write_buffer.py"}
    found = {
        f"{p.name}: {name}"
        for p in modules
        for name in _imports(p)
        if name.startswith("sessionstore") and not name.startswith(ALLOWED)
    }
    assert found == set()
    owner = pathlib.Path(sessionstore.process.__file__)
    assert [n for n in _imports(owner) if n.startswith("sessionstore")] == []


def test_engine_source_names_no_store_class_or_private_hook():
    text = "\n".join(p.read_text() for p in ENGINE.glob("*.py"))
    for word in ("SessionStore", "WindowStore", "VersionedStore", "KeyValueStore",
                 "MessageStore", "_after_rollback", "_before_commit", "session_store"):  # fmt: skip
        assert not re.search(rf"\b{word}\b", text), word


class Counter:
    """A participant with only the public protocol: it counts what it is told."""

    def __init__(self, db: Database) -> None:
        self.db, self.value, self.saved = db, 0, 0

    def add(self) -> None:
        self.value += 1
        self.db.enlist(self)

    def before_commit(self) -> None:
        self.db.put_meta(b"counter", str(self.value).encode())
        self.saved = self.value

    def after_rollback(self) -> None:
        self.value = self.saved


class Boom(Exception):
    pass


def test_a_participant_joins_the_commit_and_is_reset_on_rollback(tmp_path):
    with Database.open(tmp_path) as db:
        counter = Counter(db)
        with db.batch():
            counter.add()
            counter.add()
            assert db.get_meta(b"counter") is None  # written at commit, in the batch
        assert db.get_meta(b"counter") == b"2"
        try:
            with db.batch():
                counter.add()
                raise Boom
        except Boom:
            pass
        assert (counter.value, db.get_meta(b"counter")) == (2, b"2")
        # prepare(): the participant's write is part of the returned buffer
        db.begin()
        counter.add()
        buf = db.prepare()
        assert buf.families["meta"][b"counter"] == b"3"
        db.apply(buf)
        assert db.get_meta(b"counter") == b"3"
