"""A state server logs refused workers of another user at most once a minute,
with a count (docs/security.md): whoever can connect must not fill the executor's
log."""

from __future__ import annotations

import logging
import os
import socket
import uuid

import pytest

from sessionstore.checkpoint.service.request_server import RefusalLog
from spark_integration.execution.state_server import server
from tests.foreign_user import NOBODY, AsNobody, needs_root


@pytest.fixture
def state_server_listener():
    address = f"\0sessionstore-test-state-{os.getpid()}-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    yield listener, address
    listener.close()


@needs_root
def test_a_state_server_logs_refused_workers_with_a_rate_limit(
    state_server_listener, caplog, monkeypatch
):
    # none logged yet (raising=False: the check also runs where there is no log of them)
    monkeypatch.setattr(server, "_refusals", RefusalLog(server.log), raising=False)
    listener, address = state_server_listener

    def flood(ready):
        ready()
        for _ in range(20):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(address)
        return True

    child = AsNobody(flood)
    child.wait_ready()
    with caplog.at_level(logging.WARNING):
        for _ in range(20):
            conn, _ = listener.accept()
            with conn:
                server.serve_one(conn)
    assert child.result() is True
    refused = [r.getMessage() for r in caplog.records if "refused a task" in r.getMessage()]
    assert len(refused) == 1, refused
    assert refused[0].endswith(f"of uid {NOBODY} (1 refused in the last 60 s)")
