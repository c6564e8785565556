"""make demo's Spark job: emitted sessions plus those still in state are exactly an
offline sessionization of the clicks."""

from __future__ import annotations

import pytest

from sessionstore.tools.demo import click_stream
from spark_integration.dev.demo import GAP_MS, plan_changes, run
from tests.models import offline_sessions, plan_at

pytestmark = pytest.mark.slow


def test_demo_emits_and_keeps_exactly_the_sessions(spark, tmp_path, capsys):
    emitted, in_state, enriched, _ = run(spark, 3_000, 40, 3, str(tmp_path / "demo"))
    out = capsys.readouterr().out
    assert "3,000 clicks from 40 users in 3 micro-batches" in out
    assert "State, read back from the checkpoint" in out
    assert (
        "$ sessionstore ls file://" in out and "click_sessions" in out and "clicks_with_plan" in out
    )
    assert "stream time" in out and "$ sessionstore dump" in out  # ls stats, live-db dump
    assert "$ sessionstore stats file://" in out and "trend over the batches shown" in out
    sessions = {(r["user"], r["session_start"], r["session_end"], r["clicks"]) for r in emitted}
    for stored in in_state:
        sessions |= {(w.key, w.start, w.end, acc[0]) for w, acc in stored}
    clicks = [(u, page, ts) for u, ts, page in click_stream(3_000, 40)]
    assert sorted(sessions) == offline_sessions(clicks, GAP_MS)
    assert emitted and any(in_state)
    # every click carries the plan valid at its time
    changes = plan_changes(click_stream(3_000, 40), 40)
    assert len(enriched) == 3_000
    for row in enriched:
        assert row["plan"] == plan_at(changes, row["user"], row["ts"])
