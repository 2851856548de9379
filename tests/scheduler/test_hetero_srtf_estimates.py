"""hetero_srtf's estimates and keys (``scheduler.policies.hetero_srtf_estimates``): remaining
time, aging, the preemption rule and bound, the pair threshold, the isolated finish time."""

from __future__ import annotations

import pytest

from scheduler.domain import JobSpec, Profile
from scheduler.policies.hetero_srtf_estimates import (
    OVERRUN_LEFT,
    defended_key,
    isolated_time_s,
    priority_key,
    remaining_fraction,
    remaining_times,
    should_preempt,
    worth_packing,
)


def gjob(job_id: str, times: dict[str, float]) -> JobSpec:
    return JobSpec(id=job_id, gpus=1, profile=Profile(name=f"p-{job_id}", gpu_time_s=times))


def test_remaining_times_scale_with_progress_and_skip_unprofiled_models() -> None:
    j = gjob("a", {"V100": 100.0, "K80": 400.0})
    assert remaining_times(j, 0.25, ["V100", "K80", "P100"]) == {"V100": 75.0, "K80": 300.0}
    assert remaining_times(j, 0.999, ["V100"]) == {"V100": pytest.approx(0.1)}


def test_a_job_past_its_declared_work_is_not_treated_as_finished() -> None:
    # Noisy estimates: a job that reports all its declared work done but still runs is
    # assumed to need OVERRUN_LEFT of it again (not 0, which would put it first for ever).
    assert remaining_fraction(0.4) == pytest.approx(0.6)
    assert remaining_fraction(1.0) == OVERRUN_LEFT > 0
    j = gjob("a", {"V100": 100.0})
    assert remaining_times(j, 1.0, ["V100"]) == {"V100": 100.0 * OVERRUN_LEFT}


def test_priority_key_orders_by_remaining_and_ages() -> None:
    assert priority_key(100.0, 100.0, 0.0, 0.5) < priority_key(200.0, 200.0, 0.0, 0.5)
    # Aging: the same job waiting longer gets a smaller key; with aging 0 it does not.
    assert priority_key(1000.0, 1000.0, 4000.0, 0.5) == pytest.approx(1000.0 / 3.0)
    assert priority_key(1000.0, 1000.0, 4000.0, 0.0) == 1000.0
    # A long job that waited long enough goes before a fresh short one (no starvation).
    assert priority_key(1000.0, 1000.0, 20_000.0, 0.5) < priority_key(100.0, 100.0, 0.0, 0.5)


def test_preemption_must_pay_its_cost_and_respects_the_bound() -> None:
    kw = {"margin": 0.0, "max_preemptions": 3}
    assert should_preempt(50.0, 100.0, cost_s=0.0, preemptions=0, **kw)
    assert not should_preempt(50.0, 100.0, cost_s=60.0, preemptions=0, **kw)
    assert should_preempt(30.0, 100.0, cost_s=60.0, preemptions=2, **kw)
    assert not should_preempt(30.0, 100.0, cost_s=60.0, preemptions=3, **kw)
    assert defended_key(100.0, 10.0, 0.1) == pytest.approx(80.0)


def test_pair_threshold() -> None:
    assert worth_packing(0.7, 0.6, 1.2)
    assert not worth_packing(0.5, 0.6, 1.2)
    assert not worth_packing(0.9, 0.9, 0.0)  # 0 turns packing off


def test_isolated_time_is_a_one_over_n_share_never_faster_than_alone() -> None:
    times = {"V100": 100.0, "K80": 400.0}
    counts = {"V100": 2, "K80": 2}
    # Alone (n = 1) on a 4-GPU cluster: its fastest model's time.
    assert isolated_time_s(times, counts, 1, 1) == 100.0
    # 10 jobs: rate = (2/100 + 2/400) / 10 per job -> 400 s.
    assert isolated_time_s(times, counts, 1, 10) == pytest.approx(400.0)
