"""The demo's store-based sessionization equals an offline sessionization."""

from __future__ import annotations

from sessionstore import StateDB
from sessionstore.tools.demo import GAP_MS, click_stream, main
from tests.models import offline_sessions


def test_demo_sessions_equal_offline_sessionization(tmp_path, capsys):
    state = tmp_path / "state"
    main(["--clicks", "3000", "--users", "40", "--dir", str(state)])
    printed = capsys.readouterr().out
    assert "3,000 clicks from 40 users" in printed
    assert "Store sizes:" in printed
    with StateDB.open(state) as db:
        store = db.session_store("sessions", 24 * 3_600_000)
        stored = sorted((w.key, w.start, w.end, acc[0]) for w, acc in store.fetch_range(None, None))
    assert stored == offline_sessions(
        [(u, page, ts) for u, ts, page in click_stream(3000, 40)], GAP_MS
    )
    assert any(count > 1 for *_, count in stored)
