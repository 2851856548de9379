"""Live Slow-Down (ALGORITHMS.md §5)."""

from __future__ import annotations

import pytest

from workers.slowdown import live_slowdown, remaining_estimate_s, sd_max_diff


def test_solo_pace_gives_one():
    # 40 of 100 iterations in 40 s at 1 s each, solo time 100 s
    sd = live_slowdown(1040.0, 1000.0, 100.0, iters_done=40, iters_total=100, iter_time_s=1.0)
    assert sd == pytest.approx(1.0)


def test_paper_formula_with_iterations():
    # elapsed 60 s, 50 iterations left at 1.2 s, solo 80 s: (60 + 60) / 80
    sd = live_slowdown(60.0, 0.0, 80.0, iters_done=50, iters_total=100, iter_time_s=1.2)
    assert sd == pytest.approx(1.5)


def test_fraction_only_extrapolates_the_rate_so_far():
    # a quarter done in 30 s -> 90 s left -> (30 + 90) / 60
    assert live_slowdown(30.0, 0.0, 60.0, progress=0.25) == pytest.approx(2.0)


def test_pauses_count_in_elapsed_but_not_in_the_rate():
    # 30 s elapsed, of which 10 s paused; 20 s of work did a quarter -> 60 s left
    sd = live_slowdown(30.0, 0.0, 80.0, progress=0.25, active_s=20.0)
    assert sd == pytest.approx((30.0 + 60.0) / 80.0)


def test_unknowns_give_none():
    assert live_slowdown(10.0, 0.0, None, progress=0.5) is None
    assert live_slowdown(10.0, 0.0, 0.0, progress=0.5) is None
    assert live_slowdown(10.0, 0.0, 60.0, progress=0.0) is None
    assert live_slowdown(10.0, 0.0, 60.0) is None


def test_remaining_estimates():
    assert remaining_estimate_s(elapsed_s=10.0, progress=1.0) == 0.0
    assert (
        remaining_estimate_s(elapsed_s=10.0, iters_done=120, iters_total=100, iter_time_s=1.0) == 0
    )
    assert remaining_estimate_s(elapsed_s=10.0, iters_done=50, iters_total=100) == pytest.approx(
        10.0
    )


def test_sd_max_diff():
    assert sd_max_diff([1.0, 2.0, 1.66]) == pytest.approx(1.0)
    assert sd_max_diff([1.2, None, 1.5]) == pytest.approx(0.3)
    assert sd_max_diff([1.4]) == 0.0
    assert sd_max_diff([]) == 0.0
