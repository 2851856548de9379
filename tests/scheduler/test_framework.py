"""The framework's cycle: reservations within a cycle, the failure cache, MIG, scoring."""

from __future__ import annotations

import random
from typing import ClassVar

from scheduler.domain import ClusterState, JobSpec, Profile, SharingMode
from scheduler.policies.framework import FrameworkPolicy, framework_defaults
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import GB, busy_gpu, check_plan, gpu_node, job


class CountingPolicy(FrameworkPolicy):
    """Counts how often the filter runs; prefers GPUs with a high index via two scorers."""

    name: ClassVar[str] = "counting"
    defaults: ClassVar[dict] = dict(framework_defaults)
    colocate: ClassVar[bool] = False
    scorers: ClassVar[tuple[str, ...]] = ("late", "early")

    def __init__(self, **params):
        super().__init__(**params)
        self.filter_calls = 0

    def candidates(self, job, view):
        self.filter_calls += 1
        return super().candidates(job, view)

    def score_late(self, job, cand, view):
        return cand.node.order

    def score_early(self, job, cand, view):
        return -cand.node.order


def test_capacity_reserved_within_a_cycle():
    state = ClusterState(0.0, (gpu_node("n0", "V100", 1),), pending=(job("a"), job("b")))
    plan = build_policy("fifo").schedule(state, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["a"]


def test_failed_shapes_are_cached_within_a_cycle():
    state = ClusterState(
        0.0,
        (gpu_node("n0", "V100", 1),),
        pending=(job("a"), *(job(f"same{i}", 4) for i in range(20)), job("other", 5)),
    )
    policy = CountingPolicy(backfill=True)
    plan = policy.schedule(state, random.Random(0))
    assert len(plan.waiting) == 21
    assert policy.filter_calls == 3  # a, the first "same", "other": the rest hit the cache
    assert plan.waiting["same19"] == plan.waiting["same0"]


def test_weights_decide_between_scorers():
    state = ClusterState(
        0.0, (gpu_node("n0", "K80", 1), gpu_node("n1", "V100", 1)), pending=(job("a", 1),)
    )
    late = CountingPolicy(weights={"late": 2.0, "early": 1.0}).schedule(state, random.Random(0))
    early = CountingPolicy(weights={"late": 1.0, "early": 2.0}).schedule(state, random.Random(0))
    assert late.decisions[0].placement.node == "n1"
    assert early.decisions[0].placement.node == "n0"


def test_existing_mig_gpu_gets_the_smallest_fitting_instance():
    r = job("r", 10)
    a30, running = busy_gpu("a0", 0, "A30", [r], SharingMode.MIG, mig_slices_used=2)
    state = ClusterState(
        0.0,
        (gpu_node("a0", "A30", 1, gpus={0: a30}),),
        pending=(job("s1", 5), job("s2", 5), job("s3", 5)),
        running=tuple(running),
    )
    plan = build_policy("binpack").schedule(state, random.Random(0))
    check_plan(state, plan)
    assert [d.placement.mig_profile for d in plan.decisions] == ["1g.6gb", "1g.6gb"]
    assert "at most 0 free compute slices" in plan.waiting["s3"]


def test_profiled_models_only():
    only_v100 = JobSpec(id="x", gpu_memory_mb=GB, profile=Profile("x", gpu_time_s={"V100": 9.0}))
    state = ClusterState(
        0.0, (gpu_node("k0", "K80", 1), gpu_node("v0", "V100", 1)), pending=(only_v100,)
    )
    plan = build_policy("fifo").schedule(state, random.Random(0))
    assert plan.decisions[0].placement.node == "v0"
    plan = build_policy("fifo", {"profiled_models_only": False}).schedule(state, random.Random(0))
    assert plan.decisions[0].placement.node == "k0"


def test_down_nodes_get_nothing():
    state = ClusterState(
        0.0,
        (gpu_node("d0", "V100", 2, up=False), gpu_node("v0", "V100", 1)),
        pending=(job("a"), job("b")),
    )
    for name in ("fifo", "binpack", "random"):
        plan = build_policy(name).schedule(state, random.Random(0))
        assert all(d.placement.node == "v0" for d in plan.decisions)


def test_snapshot_is_not_modified():
    state = ClusterState(0.0, (gpu_node("v0", "V100", 2),), pending=(job("a"), job("b")))
    before = repr(state)
    build_policy("binpack").schedule(state, random.Random(0))
    assert repr(state) == before
