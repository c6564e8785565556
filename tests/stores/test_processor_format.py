"""A processor store reads the declarations (and so the payloads) of the one
format this release writes, and refuses any other by name."""

from __future__ import annotations

import msgpack
import pytest

from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.errors import SessionStoreError
from sessionstore.stores.base import aux_key
from sessionstore.stores.processor import STATE_FORMAT

SPECS = [StoreSpec("processor", "processor", 0)]


@pytest.mark.parametrize("recorded", [0, 2, None])
def test_a_declaration_of_an_unknown_format_is_refused_naming_the_variable(tmp_path, recorded):
    uri = f"file://{tmp_path}/ck"
    p = StateStoreProvider(uri, "op", 0, SPECS, str(tmp_path / "writer"))
    handle = p.get_store(0)
    handle["processor"].declare("last", "value", None)
    handle["processor"].declare("count", "value", None)
    assert handle.commit() == 1
    handle = p.get_store(1)
    record = msgpack.unpackb(handle.db.get_meta(aux_key("processor", "state:last")))
    assert record["format"] == STATE_FORMAT == 1
    record["format"] = recorded
    handle.db.put_meta(aux_key("processor", "state:last"), msgpack.packb(record))
    assert handle.commit() == 2
    p.close()
    reader = StateStoreProvider(uri, "op", 0, SPECS, str(tmp_path / "reader"))
    with pytest.raises(SessionStoreError) as err:
        reader.get_store(2)["processor"]
    assert str(err.value) == (
        f"processor store 'processor': state variable 'last' is recorded in format "
        f"{recorded!r}; this sessionstore reads format 1 only"
    )
    reader.close()
