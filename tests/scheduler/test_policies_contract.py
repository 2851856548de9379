"""The contract every registered policy keeps, on several tiny hand-built snapshots."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ClusterState,
    GpuState,
    JobSpec,
    Placement,
    PlacementPart,
    Profile,
    RunningJob,
    SharingMode,
)
from scheduler.policies.registry import available_policies, build_policy
from tests.scheduler.snapshots import GB, busy_gpu, check_plan, cpu_node, gpu_node, job


def _mixed() -> ClusterState:
    """Idle mixed cluster, one node down; single, multi-GPU, CPU and impossible jobs."""
    return ClusterState(
        now_s=0.0,
        nodes=(
            gpu_node("k0", "K80", 2),
            gpu_node("v0", "V100", 2),
            gpu_node("v1", "V100", 3, cores=3),
            gpu_node("down", "V100", 4, up=False),
            cpu_node("c0", cores=4),
            cpu_node("c1", cores=16, free=2),
        ),
        pending=(
            job("a", 4, util=80, sm_efficiency_pct=70),
            job("b", 14, util=20, mem_util_pct=60),
            job("cpu1", gpus=0, cpus=3),
            job("big", 40),  # fits no GPU
            job("m2", 6, gpus=2),
            job("m4", 6, gpus=4),  # only the down node has 4 GPUs
            job("c", 2, util=50),
            job("cpu2", gpus=0, cpus=8),  # no CPU node has 8 free cores
            job("d", 9, util=10),
            job("e", 3, util=95, cpus=2),
            job("f", 1),
        ),
    )


def _busy() -> ClusterState:
    """Shared and exclusive GPUs with running jobs; little room left."""
    r1, r2, r3, r4 = job("r1", 10, util=60), job("r2", 4, util=20), job("r3", 8), job("r4", 5)
    g00, run00 = busy_gpu("v0", 0, "V100", [r1], SharingMode.MPS)
    g01, run01 = busy_gpu("v0", 1, "V100", [r2, r4], SharingMode.MPS)
    g10, run10 = busy_gpu("p0", 0, "P100", [r3], SharingMode.TIME_SLICING)
    g11, run11 = busy_gpu("p0", 1, "P100", [job("r5", 2)], SharingMode.EXCLUSIVE)
    return ClusterState(
        now_s=100.0,
        nodes=(
            gpu_node("v0", "V100", 2, gpus={0: g00, 1: g01}),
            gpu_node("p0", "P100", 2, gpus={0: g10, 1: g11}),
        ),
        pending=tuple(
            job(f"p{i}", mem, util=u)
            for i, (mem, u) in enumerate([(5, 90), (7, 10), (3, 50), (6, 40), (2, 30), (12, 70)])
        ),
        running=(*run00, *run01, *run10, *run11),
    )


def _mig() -> ClusterState:
    """An A30 already split by MIG (2 of 4 slices used) and an idle T4 (MPS, no MIG)."""
    r = job("mig-r", 10)
    a30, running = busy_gpu("a0", 0, "A30", [r], SharingMode.MIG, mig_slices_used=2)
    return ClusterState(
        now_s=0.0,
        nodes=(gpu_node("a0", "A30", 1, gpus={0: a30}), gpu_node("t0", "T4", 1)),
        pending=(job("s1", 5), job("s2", 5), job("s3", 11), job("s4", 5), job("s5", 20)),
        running=tuple(running),
    )


def _profiled_models() -> ClusterState:
    """Jobs whose profiles list solo times for some GPU models only."""
    only_v100 = JobSpec(
        id="only-v100",
        gpu_memory_mb=2 * GB,
        profile=Profile("x", gpu_time_s={"V100": 100.0, "K80": 0.0}),
    )
    only_k80 = JobSpec(
        id="only-k80", gpu_memory_mb=2 * GB, profile=Profile("y", gpu_time_s={"K80": 50.0})
    )
    return ClusterState(
        now_s=0.0,
        nodes=(gpu_node("k0", "K80", 1), gpu_node("v0", "V100", 1)),
        pending=(only_v100, only_k80, JobSpec(id="any", gpu_memory_mb=GB)),
    )


def _full() -> ClusterState:
    """Nothing fits: every GPU exclusive, no CPU node."""
    g0, run = busy_gpu("v0", 0, "V100", [job("r", 1)], SharingMode.EXCLUSIVE)
    return ClusterState(
        now_s=0.0,
        nodes=(gpu_node("v0", "V100", 1, gpus={0: g0}),),
        pending=(job("x", 1), job("y", 1, gpus=0)),
        running=tuple(run),
    )


def _gangs() -> ClusterState:
    """Three models of 4-GPU nodes (one V100 node down), a gang running over two V100 nodes,
    and jobs larger than any node (gangs), next to single-node and single-GPU jobs."""
    times = {"V100": 3600.0, "P100": 6000.0, "K80": 12000.0}
    prof = Profile("resnet x8", gpu_time_s=times, gpu_time_unconsolidated_s={"V100": 7200.0})

    def gang(job_id: str, gpus: int, cpus: int = 1) -> JobSpec:
        return JobSpec(id=job_id, gpus=gpus, cpus=cpus, gpu_memory_mb=2 * GB, profile=prof)

    running = RunningJob(
        gang("run-g", 6),
        Placement(
            "run-g",
            "v1",
            (0, 1, 2, 3),
            SharingMode.EXCLUSIVE,
            more=(PlacementPart("v2", (0, 1)),),
        ),
        started_s=0.0,
        progress=0.4,
    )
    v1 = {
        i: GpuState("v1", i, gpu_spec("V100"), SharingMode.EXCLUSIVE, ("run-g",), 2 * GB)
        for i in range(4)
    }
    v2 = {
        i: GpuState("v2", i, gpu_spec("V100"), SharingMode.EXCLUSIVE, ("run-g",), 2 * GB)
        for i in range(2)
    }
    return ClusterState(
        now_s=500.0,
        nodes=(
            gpu_node("v0", "V100", 4),
            gpu_node("v1", "V100", 4, gpus=v1),
            gpu_node("v2", "V100", 4, gpus=v2),
            gpu_node("v3", "V100", 4, up=False),
            gpu_node("p0", "P100", 4),
            gpu_node("p1", "P100", 4),
            gpu_node("p2", "P100", 4, cores=1),
            gpu_node("k0", "K80", 4),
            gpu_node("k1", "K80", 4),
            gpu_node("k2", "K80", 4),
        ),
        pending=(
            gang("g8", 8),
            job("s1", 4),
            gang("g12", 12),
            gang("g5", 5, cpus=2),  # not on p2 (1 core)
            gang("m3", 3),  # fits one node: never spread
            gang("g8b", 8),
            gang("g16", 16),  # more than the up nodes of any model hold
            job("s2", 2),
            gang("m4", 4),
        ),
        running=(running,),
    )


SNAPSHOTS = {
    "gangs": _gangs,
    "mixed": _mixed,
    "busy": _busy,
    "mig": _mig,
    "profiled": _profiled_models,
    "full": _full,
}
POLICIES = available_policies()


@pytest.mark.parametrize("snapshot", SNAPSHOTS)
@pytest.mark.parametrize("name", POLICIES)
def test_plan_respects_capacity_and_answers_every_job(name, snapshot):
    policy = build_policy(name)
    state = SNAPSHOTS[snapshot]()
    plan = policy.schedule(state, random.Random(7))
    check_plan(state, plan, max_jobs_per_gpu=policy.params.get("max_jobs_per_gpu"))
    assert all(d.policy == name for d in plan.decisions)


@pytest.mark.parametrize("name", POLICIES)
def test_same_seed_same_plan(name):
    for make in SNAPSHOTS.values():
        a = build_policy(name).schedule(make(), random.Random(42))
        b = build_policy(name).schedule(make(), random.Random(42))
        assert a == b


@pytest.mark.parametrize("name", POLICIES)
def test_gangs_are_placed_whole_or_wait_with_what_is_missing(name):
    state = _gangs()
    check_plan(state, build_policy(name).schedule(state, random.Random(5)))
    plan = build_policy(name, {"backfill": True}).schedule(state, random.Random(5))
    check_plan(state, plan)  # whole gangs, one model, cores on every node, nothing shared
    gangs = [d.placement for d in plan.decisions if d.placement.is_gang]
    assert gangs, f"{name} placed no gang although 12 P100 and 12 K80 are idle"
    for pl in gangs:
        assert (
            len(pl.parts) >= 2
            and pl.gpu_count == {"g8": 8, "g12": 12, "g5": 5, "g8b": 8, "run-g": 6}[pl.job_id]
        )
    placed = {d.placement.job_id for d in plan.decisions}
    assert "g16" in plan.waiting and "at most 12" in plan.waiting["g16"]
    for job_id in {"g8", "g12", "g5", "g8b"} - placed:
        assert "at once on several nodes" in plan.waiting[job_id], plan.waiting[job_id]
    for d in plan.decisions:
        if d.placement.job_id == "m3":
            assert not d.placement.is_gang


@pytest.mark.parametrize("name", POLICIES)
def test_co_locating_policies_respect_higher_job_limits(name):
    policy = build_policy(name, {"max_jobs_per_gpu": 3})
    state = _busy()
    plan = policy.schedule(state, random.Random(3))
    check_plan(state, plan, max_jobs_per_gpu=3)  # raises AssertionError on a broken limit
    assert plan.decisions or plan.waiting, "the plan neither placed nor explained a job"


@pytest.mark.parametrize("name", POLICIES)
def test_mig_share_mode_respects_slices(name):
    policy = build_policy(name, {"share_mode": "mig"})
    state = ClusterState(
        now_s=0.0,
        nodes=(gpu_node("a0", "A30", 2),),
        pending=tuple(job(f"s{i}", 5) for i in range(10)),
    )
    plan = policy.schedule(state, random.Random(1))
    check_plan(state, plan)  # raises AssertionError when MIG slices are overcommitted
    assert plan.decisions or plan.waiting, "the plan neither placed nor explained a job"


@pytest.mark.parametrize("name", POLICIES)
def test_nothing_fits_everyone_waits_with_a_reason(name):
    # The CPU job could use the GPU node's spare cores: with that setting off, nothing fits.
    plan = build_policy(name, {"cpu_jobs_on_gpu_nodes": False}).schedule(_full(), random.Random(0))
    assert plan.decisions == ()
    assert set(plan.waiting) == {"x", "y"}


@pytest.mark.parametrize("name", POLICIES)
def test_a_cpu_job_runs_on_a_gpu_nodes_spare_cores_without_its_gpus(name):
    state = replace(_full(), pending=(job("y", 1, gpus=0, cpus=7),))
    (decision,) = build_policy(name).schedule(state, random.Random(0)).decisions
    placement = decision.placement
    assert (placement.job_id, placement.node, placement.gpu_indices) == ("y", "v0", ())
    off = build_policy(name, {"cpu_jobs_on_gpu_nodes": False})
    assert off.schedule(state, random.Random(0)).decisions == ()


@pytest.mark.parametrize("name", POLICIES)
def test_impossible_jobs_wait_with_numbers(name):
    plan = build_policy(name, {"backfill": True}).schedule(_mixed(), random.Random(0))
    assert "big" in plan.waiting and "40.0 GB" in plan.waiting["big"]
    assert "cpu2" in plan.waiting and "8 free cores" in plan.waiting["cpu2"]
    # m4 fits no up node; it may still run as a gang over v0 + v1 (5 V100) when a policy puts
    # it before the single-GPU jobs (the peers order by their own priorities).
    gang_m4 = [d for d in plan.decisions if d.placement.job_id == "m4"]
    assert "m4" in plan.waiting or (gang_m4 and gang_m4[0].placement.is_gang)


@pytest.mark.parametrize("name", POLICIES)
def test_gpu_job_needs_cores_on_its_node(name):
    state = ClusterState(
        now_s=0.0, nodes=(gpu_node("v0", "V100", 2, cores=1),), pending=(job("a", 1, cpus=2),)
    )
    plan = build_policy(name).schedule(state, random.Random(0))
    assert plan.decisions == () and "cores" in plan.waiting["a"]


def test_checker_catches_broken_plans():
    # The contract is only worth something if the checker fails on bad plans.
    from scheduler.domain import Decision, Placement, Plan

    state = _busy()
    on_exclusive = Plan(
        decisions=(Decision(Placement("p4", "p0", (1,), SharingMode.EXCLUSIVE), "bad", "x"),),
        waiting={f"p{i}": "w" for i in (0, 1, 2, 3, 5)},
    )
    too_much_memory = Plan(
        decisions=(Decision(Placement("p5", "v0", (0,), SharingMode.MPS), "bad", "x"),),
        waiting={f"p{i}": "w" for i in range(5)},
    )
    forgot_a_job = Plan(waiting={f"p{i}": "w" for i in range(5)})
    wrong_mode = Plan(
        decisions=(Decision(Placement("p4", "p0", (0,), SharingMode.MPS), "bad", "x"),),
        waiting={f"p{i}": "w" for i in (0, 1, 2, 3, 5)},
    )
    for bad in (on_exclusive, too_much_memory, forgot_a_job, wrong_mode):
        with pytest.raises(AssertionError):
            check_plan(state, bad)
