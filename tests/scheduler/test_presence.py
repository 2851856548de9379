"""Job-seconds present from arrival and end times (``scheduler.presence``)."""

from __future__ import annotations

import random

import pytest

from scheduler.presence import job_seconds_present


def test_three_jobs_by_hand() -> None:
    # a: 0-10, b: 5-(present), c: 8-12 (ended); now 20.
    intervals = [(0.0, 10.0), (5.0, None), (8.0, 12.0)]
    got = job_seconds_present(intervals, {"b": 5.0, "late": 15.0, "a": 0.0}, 20.0)
    # From 5: [5,8) 2 jobs, [8,10) 3, [10,12) 2, [12,20) 1 -> 6 + 6 + 4 + 8 = 24.
    assert got["b"] == pytest.approx(24.0)
    # From 15: only b -> 5.
    assert got["late"] == pytest.approx(5.0)
    # From 0: [0,5) 1 -> 5, plus 24.
    assert got["a"] == pytest.approx(29.0)


def test_matches_a_step_by_step_count() -> None:
    rng = random.Random(4)
    now = 1000.0
    intervals: list[tuple[float, float | None]] = []
    for _ in range(60):
        start = rng.uniform(0, 900)
        end = start + rng.uniform(1, 400) if rng.random() < 0.7 else None
        intervals.append((start, end))
    arrivals = {str(i): s for i, (s, _) in enumerate(intervals)}
    got = job_seconds_present(intervals, arrivals, now)
    for jid, a in arrivals.items():
        # Midpoint rule on a 0.05-s grid; ends fall on the grid only by chance.
        step, t, total = 0.05, a, 0.0
        while t < now:
            mid = t + step / 2
            total += step * sum(1 for s, e in intervals if s <= mid < (e if e else now + 1))
            t += step
        assert got[jid] == pytest.approx(total, rel=2e-3), jid


def test_nothing_asked_or_nothing_present() -> None:
    assert job_seconds_present([(0.0, 1.0)], {}, 5.0) == {}
    assert job_seconds_present([], {"x": 3.0}, 5.0) == {"x": 0.0}
