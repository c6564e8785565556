"""The demo's store-based sessionization equals an offline sessionization."""

from __future__ import annotations

from sessionstore import StateDB
from sessionstore.demo import GAP_MS, click_stream, main


def offline_sessions(clicks):
    """Sort each user's clicks; a new session starts when the gap is exceeded."""
    by_user: dict[str, list[int]] = {}
    for user, ts, _ in clicks:
        by_user.setdefault(user, []).append(ts)
    out = []
    for user, times in by_user.items():
        times.sort()
        start = end = times[0]
        count = 1
        for ts in times[1:]:
            if ts - end <= GAP_MS:  # the gap is inclusive (KIP-94)
                end, count = ts, count + 1
            else:
                out.append((user, start, end, count))
                start = end = ts
                count = 1
        out.append((user, start, end, count))
    return sorted(out)


def test_demo_sessions_equal_offline_sessionization(tmp_path, capsys):
    state = tmp_path / "state"
    main(["--clicks", "3000", "--users", "40", "--dir", str(state)])
    printed = capsys.readouterr().out
    assert "3,000 clicks from 40 users" in printed
    assert "Store sizes:" in printed
    with StateDB.open(state) as db:
        store = db.session_store("sessions", 24 * 3_600_000)
        stored = sorted((w.key, w.start, w.end, acc[0]) for w, acc in store.fetch_range(None, None))
    assert stored == offline_sessions(click_stream(3000, 40))
    assert any(count > 1 for *_, count in stored)
