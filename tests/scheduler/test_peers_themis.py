"""``themis``: freed GPUs go to the jobs furthest from finish-time fairness."""

from __future__ import annotations

import random

import pytest

from scheduler.policies.base import PolicyError
from scheduler.policies.registry import build_policy
from scheduler.policies.themis import ideal_time_s
from tests.scheduler.peer_snapshots import gpu_node, pjob, running_on, state
from tests.scheduler.snapshots import check_plan

H = 3600.0


def test_the_freed_gpu_goes_to_the_worst_rho_job():
    # Same length, one has waited far longer: its rho is worse, it wins the GPU although the
    # other is first in the queue.
    newer = pjob("newer", {"V100": 2 * H}, arrival=9 * H)
    older = pjob("older", {"V100": 2 * H}, arrival=0.0)
    st = state(10 * H, [gpu_node("v0", "V100", 1)], [newer, older])
    plan = build_policy("themis").schedule(st, random.Random(0))
    check_plan(st, plan)
    assert [d.placement.job_id for d in plan.decisions] == ["older"]
    assert "won 1 V100 in the auction" in plan.decisions[0].explanation
    assert "not among the 1 worst" in plan.waiting["newer"]


def test_the_winner_takes_the_model_it_values_most():
    # The worst-off job gains most on the V100; the next takes the leftover K80.
    a = pjob("a", {"V100": H, "K80": 5 * H}, arrival=0.0)
    b = pjob("b", {"V100": H, "K80": 1.1 * H}, arrival=5 * H)
    st = state(6 * H, [gpu_node("k0", "K80", 1), gpu_node("v0", "V100", 1)], [b, a])
    plan = build_policy("themis", {"f": 0.5}).schedule(st, random.Random(0))
    where = {d.placement.job_id: d.placement.node for d in plan.decisions}
    assert where == {"a": "v0", "b": "k0"}


def test_leases_protect_running_jobs_until_they_end():
    runner = pjob("runner", {"V100": 10 * H}, arrival=5 * H)
    starved = pjob("starved", {"V100": 2 * H}, arrival=0.0)
    policy = build_policy("themis", {"round_s": 600.0})
    node, rr = running_on(gpu_node("v0", "V100", 1), 0, runner, 6 * H)
    during = state(6 * H + 300, [node], [starved], [rr])
    plan = policy.schedule(during, random.Random(0))
    assert plan.actions == ()  # lease of 600 s not over
    policy = build_policy("themis", {"round_s": 600.0})
    after = state(6 * H + 900, [node], [starved], [rr])
    plan = policy.schedule(after, random.Random(0))
    check_plan(after, plan)
    assert [a.job_id for a in plan.actions] == ["runner"]
    assert [d.placement.job_id for d in plan.decisions] == ["starved"]


def test_ideal_time_is_a_one_over_n_share_never_faster_than_alone():
    times, counts = {"V100": H, "K80": 3 * H}, {"V100": 1, "K80": 1}
    rate = 1 / H + 1 / (3 * H)
    assert ideal_time_s(times, counts, 1, 4) == pytest.approx(4 / rate)
    assert ideal_time_s(times, counts, 1, 1) == pytest.approx(H)


@pytest.mark.parametrize("params", [{"f": 1.0}, {"f": -0.1}])
def test_bad_parameters_are_refused(params):
    with pytest.raises(PolicyError):
        build_policy("themis", params)
