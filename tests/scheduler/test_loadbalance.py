"""``loadbalance``: the highest-utilisation job pairs with the lowest."""

from __future__ import annotations

import random

from scheduler.domain import ClusterState, SharingMode
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import busy_gpu, check_plan, gpu_node, job


def _plan(state, **params):
    plan = build_policy("loadbalance", params).schedule(state, random.Random(0))
    check_plan(state, plan)
    return plan


def _pairs(plan):
    by_gpu = {}
    for d in plan.decisions:
        by_gpu.setdefault(d.placement.gpu_indices, []).append(d.placement.job_id)
    return sorted(sorted(v) for v in by_gpu.values())


def test_pairs_highest_with_lowest_over_a_queue():
    utils = {"u90": 90, "u30": 30, "u70": 70, "u10": 10, "u80": 80, "u20": 20}
    state = ClusterState(
        0.0,
        (gpu_node("n0", "V100", 3),),
        pending=tuple(job(k, 2, util=u) for k, u in utils.items()),
    )
    plan = _plan(state)
    assert _pairs(plan) == [["u10", "u90"], ["u20", "u80"], ["u30", "u70"]]


def test_new_busy_job_joins_the_least_busy_resident():
    lazy, busy = job("lazy", 2, util=15), job("busy", 2, util=85)
    g0, run0 = busy_gpu("n0", 0, "V100", [busy], SharingMode.MPS)
    g1, run1 = busy_gpu("n0", 1, "V100", [lazy], SharingMode.MPS)
    state = ClusterState(
        0.0,
        (gpu_node("n0", "V100", 2, gpus={0: g0, 1: g1}),),
        pending=(job("hot", 2, util=90),),
        running=(*run0, *run1),
    )
    (d,) = _plan(state).decisions
    assert d.placement.gpu_indices == (1,)
    assert "lowest-load GPU (15%)" in d.explanation and "combined 105%" in d.explanation


def test_queue_is_sorted_by_utilisation_ties_in_queue_order():
    state = ClusterState(
        0.0,
        (gpu_node("n0", "V100", 4),),
        pending=(job("a", 1, util=10), job("b", 1, util=50), job("c", 1), job("d", 1, util=50)),
    )
    order = [d.placement.job_id for d in _plan(state).decisions]
    # c has no profile: unknown_util_pct (50) places it between b and d by queue order.
    assert order == ["b", "c", "d", "a"]
    order = [d.placement.job_id for d in _plan(state, unknown_util_pct=5).decisions]
    assert order == ["b", "d", "a", "c"]
