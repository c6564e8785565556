"""The handover client trusts only its own user (docs/security.md): the socket name
of a holder is predictable, so another local user may hold it. The client checks
the listener's uid (``SO_PEERCRED``) before it sends anything, and moves on at
once; refused peers are logged at most once a minute, with a count."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

from sessionstore.checkpoint.service import store_service
from sessionstore.checkpoint.service.request_server import RefusalLog
from sessionstore.checkpoint.service.store_service import StoreService
from tests.foreign_user import NOBODY, AsNobody, needs_root


def _squatter(address: str):
    """As ``nobody``: hold ``address``, accept one connection and return every byte
    it sends within 5 s."""

    def run(ready):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(address)
            listener.listen(1)
            ready()
            listener.settimeout(20)
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5)
                got = b""
                try:
                    while chunk := conn.recv(4096):
                        got += chunk
                except TimeoutError:
                    pass
                return got

    return run


@needs_root
def test_the_handover_client_sends_nothing_to_a_holder_of_another_user(
    tmp_path, monkeypatch, caplog
):
    address = f"\0sessionstore-test-{os.getpid()}-{uuid.uuid4().hex}"
    monkeypatch.setattr(store_service, "_addresses", lambda pid: [address])
    child = AsNobody(_squatter(address))
    child.wait_ready()
    db = tmp_path / "local" / "op" / "0" / "db"
    db.parent.mkdir(parents=True)
    (db.parent / "owner").write_text(str(child.pid))  # names the squatter as holder
    service = StoreService()
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        service._ask_owner(str(db))
    elapsed = time.monotonic() - start
    assert child.result() == b""  # not even the database path
    assert elapsed < 2.0  # no wait for an answer that never comes
    warned = [r.getMessage() for r in caplog.records if "handover socket" in r.getMessage()]
    assert warned == [
        f"sessionstore: the handover socket {address[1:]!r} is held by pid {child.pid} of uid "
        f"{NOBODY}, not uid 0: nothing was sent to it (1 refused in the last 60 s)"
    ]


def test_refusals_are_logged_once_per_interval_with_their_count(caplog, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    refusals = RefusalLog(logging.getLogger("test.refusals"), every_s=60.0)
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for i in range(500):  # a flood within one second
            now[0] += 0.002
            refusals.refused("refused pid %d", i)
        now[0] += 60.0
        refusals.refused("refused pid %d", 500)
    assert [r.getMessage() for r in caplog.records] == [
        "refused pid 0 (1 refused in the last 60 s)",
        "refused pid 500 (500 refused in the last 60 s)",
    ]
