"""``make cluster-test`` judges the cluster run by the offline model of its clicks:
a run's output that the model gives passes, and each way of getting it wrong
(a session lost, emitted twice, a click joined with the wrong plan) is named."""

from __future__ import annotations

import json

from sessionstore.tools.demo import click_stream
from spark_integration.dev.demo import GAP_MS, plan_changes
from tests.models import offline_sessions, plan_at
from tests.standalone.check import model_problems

CLICKS, USERS = 600, 20


def _rows(items):
    return sorted(json.dumps(item, sort_keys=True) for item in items)


def _model_output():
    """The output a right run writes (``demo --output``): half the sessions
    emitted, the others left in state."""
    stream = click_stream(CLICKS, USERS)
    sessions = offline_sessions([(u, page, ts) for u, ts, page in stream], GAP_MS)
    emitted = [{"user": u, "session_start": s, "session_end": e, "clicks": n}
               for u, s, e, n in sessions[::2]]  # fmt: skip
    in_state = [[u, s, e, [n]] for u, s, e, n in sessions[1::2]]
    changes = plan_changes(stream, USERS)
    enriched = [{"user": user, "ts": ts, "page": page, "plan": plan_at(changes, user, ts)}
                for user, ts, page in stream]  # fmt: skip
    return {"emitted": emitted, "in_state": in_state, "enriched": enriched}


def _result(out):
    return {part: _rows(rows) for part, rows in out.items()}


def test_the_models_output_passes():
    assert model_problems(_result(_model_output()), CLICKS, USERS) == []


def test_a_lost_or_doubled_session_and_a_wrong_plan_are_named():
    out = _model_output()
    lost = out["emitted"].pop()
    [problem] = model_problems(_result(out), CLICKS, USERS)
    assert "1 missing" in problem and lost["user"] in problem

    out = _model_output()
    first = out["emitted"][0]
    out["in_state"].append([first["user"], first["session_start"], first["session_end"],
                            [first["clicks"]]])  # fmt: skip
    [problem] = model_problems(_result(out), CLICKS, USERS)
    assert "0 missing" in problem and "1 extra" in problem

    out = _model_output()
    row = next(r for r in out["enriched"] if r["plan"] == "free")
    row["plan"] = "pro"
    [problem] = model_problems(_result(out), CLICKS, USERS)
    assert "joined plan 'pro', not 'free'" in problem

    out = _model_output()
    out["enriched"].pop()
    assert model_problems(_result(out), CLICKS, USERS) == [
        f"{CLICKS - 1} clicks joined with their plan, not {CLICKS}"
    ]
