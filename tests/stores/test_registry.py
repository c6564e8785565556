"""One registry of store kinds: the StateDB openers, StoreSpec and the reader all
take a kind's class from it, and the records they write keep their bytes."""

from __future__ import annotations

import msgpack
import pytest

from sessionstore import StateDB, StoreSpec
from sessionstore.stores import registry
from sessionstore.stores.kv import KeyValueStore
from sessionstore.tools.reader import LocalSource, RowFilter, store_rows


class TaggedStore(KeyValueStore):
    """A throwaway kind: key-value rows that also report the store's name."""

    kind = "tagged"
    row_filters = frozenset({"from_ts", "to_ts"})  # a key-value store takes none

    def read_rows(self, key=None, key_from=None, key_to=None, from_ts=None, to_ts=None,
                  as_of=None):  # fmt: skip
        for row in super().read_rows(key, key_from, key_to):
            yield {**row, "store": self.name}


@pytest.fixture
def tagged(monkeypatch):
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    return registry.register(TaggedStore)


def test_every_opener_serves_the_registered_class(db):
    opened = {
        "session": db.session_store("a", 1000),
        "versioned": db.versioned_store("b", 1000),
        "window": db.window_store("c", 1000, 10),
        "messages": db.message_store("d", 1000),
        "kv": db.kv_store("e"),
        "processor": db.processor_store("f"),
    }
    assert registry.kind_names() == (
        "session", "versioned", "window", "messages", "kv", "processor"
    )  # fmt: skip
    for kind, store in opened.items():
        assert type(store) is registry.store_class(kind)
        assert store.kind == kind
    assert {n: s["kind"] for n, s in db.store_specs().items()} == dict(
        zip("abcdef", opened, strict=True)
    )


def test_unknown_kind_is_refused_naming_the_kinds(db):
    with pytest.raises(ValueError, match=r"store kind must be one of \('session', .*'tagged'"):
        StoreSpec("x", "tagged", 0)
    with pytest.raises(ValueError, match="got 'tagged'"):
        db.open_store("tagged", "x")


def test_a_registered_kind_opens_by_spec_and_reads_through_the_reader(tagged, tmp_path):
    spec = StoreSpec("t", "tagged", 0)
    path = tmp_path / "local" / "op" / "0" / "db"
    with StateDB.open(path) as db:
        store = spec.open(db)
        assert type(store) is TaggedStore
        assert spec.open(db) is store  # the open store is served again
        store.put("k", 1)
        assert db.store_specs()["t"]["kind"] == "tagged"
    # the reader opens it from its recorded spec and lets the kind shape the rows
    rows = list(store_rows(LocalSource(str(tmp_path / "local")), "op", "t"))
    assert rows == [{"partition": 0, "key": "k", "value": 1, "store": "t"}]
    RowFilter(from_ts=5, to_ts=9).check("tagged", "t")  # its class takes them
    with pytest.raises(ValueError, match="as_of applies to versioned stores; 't' is a tagged"):
        RowFilter(as_of=5).check("tagged", "t")
    with pytest.raises(ValueError, match="'k' is a kv store: it has no time to filter on"):
        RowFilter(to_ts=5).check("kv", "k")


def test_a_kind_is_served_by_one_class(tagged):
    class Other(KeyValueStore):
        kind = "tagged"

    with pytest.raises(ValueError, match="already served by TaggedStore"):
        registry.register(Other)
    assert registry.register(TaggedStore) is TaggedStore  # idempotent


def test_window_size_is_required_for_the_kinds_whose_layout_has_it():
    with pytest.raises(ValueError, match="window_size_ms is required for kind 'window' only"):
        StoreSpec("w", "window", 1000)
    with pytest.raises(ValueError, match="window_size_ms is required for kind 'window' only"):
        StoreSpec("s", "session", 1000, window_size_ms=10)


def test_spec_records_keep_their_fields_order_and_defaults(db):
    # The checkpoint's _metadata and the database's meta family hold these records
    # as msgpack: the bytes (field order included) must not change.
    assert list(StoreSpec("w", "window", 1000, window_size_ms=10).describe().items()) == [
        ("name", "w"), ("kind", "window"), ("retention_ms", 1000),
        ("segment_interval_ms", None), ("key_serde", "keycodec"),
        ("value_serde", "msgpack"), ("window_size_ms", 10),
    ]  # fmt: skip
    db.window_store("w", 1000, 10)
    db.kv_store("k")
    assert db.get_meta(b"store:w") == msgpack.packb(
        {"kind": "window", "retention_ms": 1000, "segment_interval_ms": 60_000,
         "key_serde": "keycodec", "value_serde": "msgpack", "window_size_ms": 10}
    )  # fmt: skip
    assert db.get_meta(b"store:k") == msgpack.packb(
        {"kind": "kv", "retention_ms": 0, "segment_interval_ms": 0,
         "key_serde": "keycodec", "value_serde": "msgpack"}
    )  # fmt: skip
    for spec in (StoreSpec("w", "window", 1000, window_size_ms=10), StoreSpec("k", "kv", 0)):
        assert StoreSpec.from_record(spec.describe()) == spec


def test_each_kind_shapes_its_rows(db):
    # exact rows, as `sessionstore read` printed them before the kinds shaped them
    messages = db.message_store("m", 10**6)
    for ts, offset in ((5, 1), (7, 2), (9, 3)):
        messages.put_message("k", ts, offset, f"v{offset}")
    assert list(RowFilter(from_ts=6, to_ts=8).rows(messages)) == [
        {"key": "k", "timestamp": 7, "offset": 2, "value": "v2"}
    ]
    windows = db.window_store("w", 10**6, 10)
    for start in (0, 10, 20):
        windows.put_window("k", start, start)
    assert list(RowFilter(from_ts=10, to_ts=19).rows(windows)) == [
        {"key": "k", "start": 10, "end": 20, "value": 10}
    ]
    sessions = db.session_store("s", 10**6)
    sessions.put("a", 1, 4, "x")
    sessions.put("b", 6, 9, "y")
    assert list(RowFilter(key_from="b", from_ts=2).rows(sessions)) == [
        {"key": "b", "start": 6, "end": 9, "value": "y"}
    ]
    versioned = db.versioned_store("v", 10**6)
    versioned.put("k", "old", 1)
    versioned.put("k", "new", 5)
    assert list(RowFilter(as_of=3).rows(versioned)) == [
        {"key": "k", "value": "old", "valid_from": 1, "valid_to": 5}
    ]
    assert list(RowFilter().rows(versioned)) == [
        {"key": "k", "value": "new", "valid_from": 5, "valid_to": None},
        {"key": "k", "value": "old", "valid_from": 1, "valid_to": 5},
    ]
    kv = db.kv_store("kv")
    kv.put("a", 1)
    kv.put("b", 2)
    assert list(RowFilter(key="b").rows(kv)) == [{"key": "b", "value": 2}]


@pytest.mark.parametrize(
    "spec",
    [
        StoreSpec("s", "session", 1000),
        StoreSpec("w", "window", 1000, window_size_ms=100),
        StoreSpec("v", "versioned", 500),
    ],
    ids=lambda s: s.kind,
)
def test_opening_a_store_asks_the_registry_once_and_sets_retention_once(
    tmp_path, monkeypatch, spec
):
    import importlib

    from sessionstore.stores import state_db

    spec_module = importlib.import_module(type(spec).__module__)
    asked, set_to = [], []
    real_class = state_db.store_class

    def counting(kind):
        asked.append(kind)
        return real_class(kind)

    for module in (state_db, spec_module):
        monkeypatch.setattr(module, "store_class", counting)
    cls = real_class(spec.kind)
    real_set = cls._set_retention
    monkeypatch.setattr(
        cls, "_set_retention", lambda self, ms: (set_to.append(ms), real_set(self, ms))
    )
    with StateDB.open(str(tmp_path / "db")) as db:
        store = spec.open(db)
        assert (asked, set_to) == ([spec.kind], [spec.retention_ms])
        assert store.spec()["retention_ms"] == spec.retention_ms
        if spec.window_size_ms is not None:
            assert store.window_size_ms == spec.window_size_ms
