"""A list state's stored forms (sessionstore.encoding.state_values): a list without
a TTL is held and stored as its bare values (``c1 ‖ [value, ...]``), one with a TTL
as ``(value, expiry)`` pairs; rows of either form read as either, so checkpoints
written before the bare form, a TTL added or removed on restart, schema evolution,
pickled stores and readers (the CLI) all see the same list. The property test runs
random list operations against a plain Python list, restoring from the checkpoint
between batches."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.encoding.keys import encode_key
from sessionstore.encoding.serde import PickleSerde
from sessionstore.operators.processors import BatchTimes, ProcessorHandle, ProcessorRunner


def _struct(*fields):
    return {"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields
    ]}  # fmt: skip


ITEM = _struct(("item", "string"))
#: a TTL no batch of these tests reaches: elements never expire, but carry an expiry
TTL = 10**9


class Lister:
    """A list state ``items`` (``ttl``: its TTL); each input row is an operation."""

    def __init__(self, ttl=None, schema=ITEM):
        self.ttl, self.schema = ttl, schema

    def init(self, handle):
        self.items = handle.getListState("items", self.schema, self.ttl)

    def handleInputRows(self, key, rows, timerValues):
        for name, arg in rows:
            if name == "append":
                self.items.appendValue(arg)
            elif name == "append_list":
                self.items.appendList(arg)
            elif name == "put":
                self.items.put(arg)
            elif name == "clear":
                self.items.clear()
        yield key[0], list(self.items.get()), self.items.exists()

    def close(self):
        pass


class Checkpoint:
    """A processor store in a file:// checkpoint, restorable into a new local dir."""

    def __init__(self, tmp_path, serde=None):
        self.tmp_path, self.version, self.dirs = tmp_path, 0, 0
        spec = StoreSpec("processor", "processor", 0)
        if serde is not None:
            spec = StoreSpec("processor", "processor", 0, value_serde=serde)
        self.specs = [spec]
        self.provider = None
        self.restore()

    def restore(self):
        """A new provider on a new local dir: the next load restores from the checkpoint."""
        if self.provider is not None:
            self.provider.close()
        self.dirs += 1
        self.provider = StateStoreProvider(
            f"file://{self.tmp_path}/ck", "op", 0, self.specs, str(self.tmp_path / f"l{self.dirs}")
        )

    def run(self, processor, groups, now=1_000):
        """One batch of ``processor`` over ``{key: [op, ...]}``: the outputs, and the
        raw rows of ``items`` by key."""
        handle = self.provider.get_store(self.version)
        store = handle["processor"]
        runner = ProcessorRunner(processor, ProcessorHandle(store, "ProcessingTime"),
                                 "ProcessingTime")  # fmt: skip
        items = [((k,), None, lambda ops=ops: iter(ops)) for k, ops in sorted(groups.items())]
        out = runner.run_batch(items, BatchTimes(now, -1)).outputs
        self.version = handle.commit()
        suffix = encode_key("items")
        raw = {
            k[: -len(suffix)]: v for k, v in handle.db.scan_list(store.kv_cf) if k.endswith(suffix)
        }
        return out, raw

    def read(self):
        """``items`` of every key as a reader (the CLI) shows it, from the checkpoint."""
        reader = StateStoreProvider(
            f"file://{self.tmp_path}/ck", "op", 0, self.specs, str(self.tmp_path / "reader")
        )
        try:
            handle = reader.get_store(self.version)
            rows = {r["key"]: r["value"] for r in handle["processor"].read_rows()
                    if r["state"] == "items"}  # fmt: skip
            handle.abort()
            return rows
        finally:
            reader.close()

    def close(self):
        self.provider.close()


def test_the_worked_example_bare_values_without_a_ttl_and_pairs_with_one(tmp_path):
    ck = Checkpoint(tmp_path)
    out, raw = ck.run(Lister(), {"u": [("append_list", [("a",), ("b",)])]})
    assert out == [("u", [("a",), ("b",)], True)]
    assert raw[encode_key("u")].hex(" ") == "c1 92 91 a1 61 91 a1 62"
    out, raw = ck.run(Lister(TTL), {"v": [("append", ("a",))]}, now=5)
    assert raw[encode_key("v")] == msgpack.packb([[["a"], 5 + TTL]])
    assert ck.read() == {
        "u": [{"value": ["a"], "expires_ms": None}, {"value": ["b"], "expires_ms": None}],
        "v": [{"value": ["a"], "expires_ms": 5 + TTL}],
    }
    ck.close()


def test_a_list_row_written_before_the_bare_form_loads_and_is_rewritten_bare(tmp_path):
    """Every list row written before the bare form is pairs, ``[[value, expiry],
    ...]`` with a nil expiry without a TTL (the bytes below): it loads, takes
    appends, and its next write stores the bare values."""
    ck = Checkpoint(tmp_path)
    # a list with a TTL writes pairs as every list did before; nil expiries are those
    # of a list without one
    handle = ck.provider.get_store(0)
    store = handle["processor"]
    store.declare("items", "list", ITEM)
    old = bytes.fromhex("92 92 91 a1 61 c0 92 91 a1 62 c0")  # [[["a"], nil], [["b"], nil]]
    store.write(encode_key("u"), encode_key("items"), [(("a",), None), (("b",), None)])
    assert dict(handle.db.scan_list(store.kv_cf))[encode_key("u") + encode_key("items")] == old
    ck.version = handle.commit()
    ck.restore()
    out, raw = ck.run(Lister(), {"u": [("append", ("c",))]})
    assert out == [("u", [("a",), ("b",), ("c",)], True)]
    assert raw[encode_key("u")] == b"\xc1" + msgpack.packb([["a"], ["b"], ["c"]])
    ck.close()


def test_a_ttl_added_or_removed_on_restart_reads_the_other_form(tmp_path):
    ck = Checkpoint(tmp_path)
    ck.run(Lister(), {"u": [("append", ("a",))], "w": [("append", ("z",))]})
    ck.restore()
    out, raw = ck.run(Lister(TTL), {"u": [("append", ("b",))]}, now=7)
    assert out == [("u", [("a",), ("b",)], True)]
    assert msgpack.unpackb(raw[encode_key("u")]) == [[["a"], None], [["b"], 7 + TTL]]
    assert raw[encode_key("w")][:1] == b"\xc1"  # untouched: still bare
    ck.restore()
    out, raw = ck.run(Lister(), {"u": [("append", ("c",))], "w": [("append", ("y",))]})
    assert out == [("u", [("a",), ("b",), ("c",)], True), ("w", [("z",), ("y",)], True)]
    assert raw[encode_key("u")] == b"\xc1" + msgpack.packb([["a"], ["b"], ["c"]])
    ck.close()


def test_bare_rows_of_an_earlier_schema_read_as_the_new_one(tmp_path):
    v0 = _struct(("a", "integer"), ("b", "string"))
    v1 = _struct(("b", "string"), ("a", "long"), ("c", "double"))
    ck = Checkpoint(tmp_path)
    ck.run(Lister(None, v0), {"u": [("append", (1, "x"))], "w": [("append", (2, "y"))]})
    ck.run(Lister(TTL, v0), {"t": [("append", (3, "z"))]})  # pairs of version 0
    ck.restore()
    out, raw = ck.run(Lister(None, v1), {"u": [("append", ("q", 5, 0.5))], "t": []})
    assert out == [("t", [("z", 3, None)], True), ("u", [("x", 1, None), ("q", 5, 0.5)], True)]
    assert raw[encode_key("u")][:2] == b"\x01\xc1"  # version 1, bare
    assert raw[encode_key("w")][:1] == b"\xc1"  # untouched: version 0, bare
    assert ck.read()["w"] == [{"value": ["y", 2, None], "expires_ms": None}]
    ck.close()


def test_a_pickled_store_keeps_pickled_pairs_for_a_list_without_a_ttl(tmp_path):
    ck = Checkpoint(tmp_path, PickleSerde())
    ck.run(Lister(), {"u": [("append", ("a",))]})
    ck.restore()
    out, raw = ck.run(Lister(), {"u": [("append_list", [("b",)])]})
    assert out == [("u", [("a",), ("b",)], True)]
    import pickle

    assert pickle.loads(raw[encode_key("u")]) == [(("a",), None), (("b",), None)]
    ck.close()


OPS = st.one_of(
    st.tuples(st.just("append"), st.tuples(st.text("ab", max_size=2))),
    st.tuples(st.just("append_list"),
              st.lists(st.tuples(st.text("ab", max_size=2)), min_size=1, max_size=3)),
    st.tuples(st.just("put"),
              st.lists(st.tuples(st.text("ab", max_size=2)), min_size=1, max_size=3)),
    st.tuples(st.just("clear"), st.none()),
)  # fmt: skip
BATCHES = st.lists(
    st.tuples(
        st.dictionaries(st.sampled_from(["k1", "k2", "é"]), st.lists(OPS, max_size=4),
                        max_size=3),
        st.booleans(),  # the batch's processor has a TTL
        st.booleans(),  # restore from the checkpoint after the batch
    ),
    min_size=1,
    max_size=6,
)  # fmt: skip


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(batches=BATCHES)
# the TTL removed, then added, each over the other form's rows
@example(
    batches=[
        ({"k1": [("append", ("a",))]}, True, False),
        ({"k1": []}, False, True),
        ({"k1": [("append", ("b",))]}, False, False),
        ({"k1": []}, True, False),
    ]
)
def test_lists_equal_a_python_list_across_ttl_changes_and_restores(tmp_path_factory, batches):
    """Random list operations against a plain list of (value, expiry) per key: the
    processor's view, the stored rows' form and a reader's view, batch by batch,
    with the TTL switched on and off and the state restored between batches."""
    ck = Checkpoint(tmp_path_factory.mktemp("lists"))
    model: dict[str, list] = {}
    try:
        for step, (groups, timed, restore) in enumerate(batches):
            now = 1_000 + step
            expiry = now + TTL if timed else None
            expected = []
            for key in sorted(groups):
                items = model.get(key, [])
                for name, arg in groups[key]:
                    if name == "append":
                        items = items + [(arg, expiry)]
                    elif name == "append_list":
                        items = items + [(v, expiry) for v in arg]
                    elif name == "put":
                        items = [(v, expiry) for v in arg]
                    elif name == "clear":
                        items = []
                if groups[key] and not timed:  # written back as bare values
                    items = [(v, None) for v, _ in items]
                model[key] = items
                expected.append((key, [v for v, _ in items], bool(items)))
            out, raw = ck.run(Lister(TTL if timed else None), groups, now)
            assert out == expected
            for key in groups:
                if groups[key] and model[key]:
                    assert (raw[encode_key(key)][:1] == b"\xc1") == (not timed)
            assert ck.read() == {
                k: [{"value": list(v), "expires_ms": e} for v, e in items]
                for k, items in model.items() if items
            }  # fmt: skip
            if restore:
                ck.restore()
    finally:
        ck.close()
