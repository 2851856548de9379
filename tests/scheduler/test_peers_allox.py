"""``allox``: min-cost matching of jobs to (model, position) slots."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from scheduler.policies.allox import match_jobs
from scheduler.policies.base import PolicyError
from scheduler.policies.registry import build_policy
from tests.scheduler.peer_snapshots import gpu_node, pjob, running_on, state
from tests.scheduler.snapshots import check_plan

H = 3600.0


def _total_completion(p, sequences):
    """Sum of completion times when machine ``m`` runs ``sequences[m]`` (job lists) in order."""
    total = 0.0
    for m, seq in enumerate(sequences):
        t = 0.0
        for j in seq:
            t += p[j][m]
            total += t
    return total


def _sequences_from_matching(p, matched, machines):
    seqs = [[] for _ in range(machines)]
    for j, m, _k in sorted(matched, key=lambda x: (-x[2], p[x[0]][x[1]])):
        seqs[m].append(j)
    return seqs


def test_matching_beats_fifo_order_on_total_completion_time():
    # One GPU, jobs queued long-first: FIFO 3 + 5 + 6 = 14 h; the matching runs 1, 2, 3: 10 h.
    p = np.array([[3.0], [2.0], [1.0]])
    matched = match_jobs(p, np.ones(3), np.array([1.0]))
    seqs = _sequences_from_matching(p, matched, 1)
    assert _total_completion(p, seqs) == pytest.approx(10.0)
    assert _total_completion(p, [[0, 1, 2]]) == pytest.approx(14.0)


def test_matching_is_optimal_on_two_models():
    # Brute force over every split of four jobs onto a fast and a slow machine (each run
    # shortest first, which is optimal on one machine).
    p = np.array([[1.0, 4.0], [2.0, 2.5], [3.0, 3.5], [6.0, 20.0]])
    matched = match_jobs(p, np.ones(4), np.array([1.0, 1.0]))
    got = _total_completion(p, _sequences_from_matching(p, matched, 2))
    best = min(
        _total_completion(
            p,
            [
                sorted((j for j in range(4) if side[j] == m), key=lambda j: p[j][m])
                for m in range(2)
            ],
        )
        for side in itertools.product(range(2), repeat=4)
    )
    assert got == pytest.approx(best)
    fifo_first_fit = _total_completion(p, [[0, 2], [1, 3]])
    assert got < fifo_first_fit


def test_policy_starts_the_job_the_matching_puts_first():
    jobs = [
        pjob("three", {"V100": 3 * H}),
        pjob("one", {"V100": 1 * H}, arrival=1.0),
        pjob("two", {"V100": 2 * H}, arrival=2.0),
    ]
    st = state(10.0, [gpu_node("v0", "V100", 1)], jobs)
    plan = build_policy("allox").schedule(st, random.Random(0))
    check_plan(st, plan)
    assert [d.placement.job_id for d in plan.decisions] == ["one"]
    assert "matched to V100" in plan.waiting["two"]
    assert "1 matched jobs start before it" in plan.waiting["two"]


def test_running_jobs_are_never_preempted():
    long = pjob("long", {"V100": 50 * H})
    node, rl = running_on(gpu_node("v0", "V100", 1), 0, long, 0.0)
    st = state(10.0, [node], [pjob("short", {"V100": 60.0}, arrival=5.0)], [rl])
    plan = build_policy("allox").schedule(st, random.Random(0))
    assert plan.actions == () and plan.decisions == ()


def test_fairness_knob_admits_only_the_least_served_users():
    policy = build_policy("allox", {"alpha": 0.5})
    policy.attained["old"] = 10 * H  # alice's finished job got a lot of service
    a = pjob("a", {"V100": 60.0}, owner="alice")
    policy.attained["a"] = 10 * H
    b = pjob("b", {"V100": 2 * H}, owner="bob", arrival=1.0)
    st = state(10.0, [gpu_node("v0", "V100", 1)], [a, b])
    plan = policy.schedule(st, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["b"]  # though a is shorter
    assert "fairness knob" in plan.waiting["a"]
    plan = build_policy("allox", {"alpha": 1.0}).schedule(st, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["a"]


@pytest.mark.parametrize("params", [{"alpha": 0}, {"alpha": 1.5}, {"max_jobs": 0}])
def test_bad_parameters_are_refused(params):
    with pytest.raises(PolicyError):
        build_policy("allox", params)
