"""``random``: a random feasible placement, driven only by the rng passed in."""

from __future__ import annotations

import random

from scheduler.domain import ClusterState
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import check_plan, gpu_node, job


def _state():
    return ClusterState(
        0.0,
        (gpu_node("n0", "V100", 4), gpu_node("n1", "P100", 4)),
        pending=tuple(job(f"j{i}", 3) for i in range(6)),
    )


def _layout(seed):
    plan = build_policy("random").schedule(_state(), random.Random(seed))
    check_plan(_state(), plan)
    return tuple((d.placement.node, d.placement.gpu_indices) for d in plan.decisions)


def test_same_seed_same_layout_and_seeds_differ():
    assert _layout(1) == _layout(1)
    layouts = {_layout(seed) for seed in range(10)}
    assert len(layouts) > 5


def test_spreads_over_gpus_and_co_locates():
    seen = set()
    shared = False
    for seed in range(30):
        layout = _layout(seed)
        seen.update(layout)
        shared |= len(set(layout)) < len(layout)
    assert len(seen) == 8  # every GPU of both nodes gets picked at some seed
    assert shared


def test_explains_the_draw():
    plan = build_policy("random").schedule(_state(), random.Random(0))
    assert "random pick among 8 feasible placements" in plan.decisions[0].explanation
