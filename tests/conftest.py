"""Shared fixtures."""

from __future__ import annotations

import pytest

from sessionstore import StateDB


@pytest.fixture
def db(tmp_path):
    """A fresh StateDB in a temporary directory, closed after the test."""
    handle = StateDB.open(tmp_path / "db")
    yield handle
    handle.close()
