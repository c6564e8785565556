"""The session merge rule's vectorised forms equal its scalar one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.operators.sessions.rule import components, gap_breaks, within_gap

ROWS = st.lists(st.tuples(st.integers(0, 3), st.integers(-50, 50)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(rows=ROWS, gap=st.integers(0, 12))
def test_gap_breaks_is_within_gap_row_by_row(rows, gap):
    rows = sorted(rows)
    groups = np.array([g for g, _ in rows], dtype=np.int64)
    times = np.array([t for _, t in rows], dtype=np.int64)
    want = [
        i == 0 or rows[i][0] != rows[i - 1][0] or not within_gap(rows[i - 1][1], rows[i][1], gap)
        for i in range(len(rows))
    ]
    assert gap_breaks(groups, times, gap).tolist() == want


INTERVALS = st.lists(
    st.tuples(st.integers(-40, 40), st.integers(0, 15), st.sampled_from([0, 1])), max_size=25
)


@settings(max_examples=300, deadline=None)
@given(intervals=INTERVALS, gap=st.integers(0, 10))
def test_components_are_the_sessions_pairwise_merging_gives(intervals, gap):
    """Components equal the fixpoint of merging any two sessions within gap of each
    other (the rule applied one pair at a time, in any order)."""
    items = [(s, s + length, kind, k) for k, (s, length, kind) in enumerate(intervals)]
    sessions = [(s, e, {(kind, k)}) for s, e, kind, k in items]
    merged = True
    while merged:
        merged = False
        for i in range(len(sessions)):
            for j in range(len(sessions)):
                a, b = sessions[i], sessions[j]
                if i != j and a[0] <= b[0] and within_gap(a[1], b[0], gap):
                    sessions[i] = (a[0], max(a[1], b[1]), a[2] | b[2])
                    del sessions[j]
                    merged = True
                    break
            if merged:
                break
    want = sorted((s, e, sorted(m)) for s, e, m in sessions)
    got = [
        (s, e, sorted([(1, k) for k in runs] + [(0, k) for k in stored]))
        for s, e, runs, stored in components(items, gap)
    ]
    assert got == want
