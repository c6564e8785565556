"""A changelog header's recorded times (event time, a processor's deadlines), as the
due sources and the tasks read them: a value no release writes is refused by name."""

from __future__ import annotations

import pytest

from sessionstore.checkpoint.records.deadlines import DUE_PROCESSING_FIELD
from sessionstore.checkpoint.records.layout import recorded_time
from sessionstore.errors import SessionStoreError


def test_a_recorded_time_is_an_int_or_nothing():
    assert recorded_time({DUE_PROCESSING_FIELD: 1_700_000_000_123}, DUE_PROCESSING_FIELD) == (
        1_700_000_000_123
    )
    assert recorded_time({}, DUE_PROCESSING_FIELD) is None


@pytest.mark.parametrize("value", ["soon", 1.5, True, [1]])
def test_a_recorded_time_no_release_writes_is_refused_naming_it(value):
    with pytest.raises(SessionStoreError, match=rf"records {DUE_PROCESSING_FIELD} = "):
        recorded_time({DUE_PROCESSING_FIELD: value}, DUE_PROCESSING_FIELD)
