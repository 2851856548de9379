"""Contract for every registered policy: two users' jobs never share a GPU under MPS.

One MPS server serves one unix user per GPU (ALGORITHMS §4); a second user's client would wait
until the first user's server exits. Checked on snapshots where sharing is tempting: MPS GPUs
already running one user's job with room left, idle MPS-capable GPUs and a queue of two users.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

import pytest

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ClusterState,
    GpuState,
    JobSpec,
    NodeKind,
    NodeState,
    Placement,
    Profile,
    RunningJob,
    SharingMode,
)
from scheduler.kernels import kernel_profiles
from scheduler.policies.registry import available_policies, build_policy
from tests.scheduler.snapshots import GB, check_plan

MPS = SharingMode.MPS


def _dl(id, owner, mem=2.0, cm=18.0):
    profile = Profile(
        id,
        gpu_time_s={"V100": 100.0, "A30": 90.0, "TitanXp": 150.0},
        cm_ratio=cm,
        sensitivity=1.2,
        batch_size=16,
        image_size=224,
        gpu_memory_max_mb=mem * GB,
    )
    return JobSpec(id=id, gpu_memory_mb=mem * GB, profile=profile, owner=owner)


def _snapshot(kind: str) -> ClusterState:
    """An MPS V100 running alice's job, idle V100 / A30 / Titan Xp, alice and bob queued."""
    kernels = kernel_profiles()
    if kind == "kernels":
        spec = replace(gpu_spec("TitanXp"), mps_thread_limit=True)
        resident = JobSpec(id="r", profile=kernels["LM"], owner="alice")
        queue = [
            JobSpec(id=f"{who}{k}", profile=kernels[a], owner=who)
            for k, a in enumerate(("SPMV", "FT", "CP", "NW"))
            for who in ("bob", "alice")
        ]
        models = [spec, spec, spec]
    else:
        resident = _dl("r", "alice")
        queue = [
            _dl(f"{who}{k}", who, cm=5.0 + 10 * (k % 2))
            for k in range(4)
            for who in ("bob", "alice")
        ]
        models = [gpu_spec("V100"), gpu_spec("V100"), gpu_spec("A30")]
    busy = GpuState(
        "n",
        0,
        models[0],
        mode=MPS,
        job_ids=("r",),
        committed_memory_mb=resident.memory_need_mb(),
    )
    gpus = (busy, GpuState("n", 1, models[1]), GpuState("n", 2, models[2]))
    node = NodeState("n", NodeKind.GPU, 32, 31, gpus=gpus)
    running = (RunningJob(resident, Placement("r", "n", (0,), MPS, cpus=1), 0.0),)
    return ClusterState(0.0, (node,), tuple(queue), running)


def mixed_mps_gpus(state: ClusterState, plan) -> list[tuple[tuple[str, int], list[str]]]:
    """GPUs that would run jobs of more than one owner under MPS after ``plan``."""
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    running = {r.job.id: r.job for r in state.running}
    for node in state.nodes:
        for g in node.gpus:
            if g.mode == MPS:
                owners[g.key].update(str(running[j].owner) for j in g.job_ids)
    by_id = {j.id: j for j in state.pending}
    for d in plan.decisions:
        if d.placement.mode == MPS:
            for i in d.placement.gpu_indices:
                owners[(d.placement.node, i)].add(str(by_id[d.placement.job_id].owner))
    return [(gpu, sorted(who)) for gpu, who in owners.items() if len(who) > 1]


@pytest.mark.parametrize("kind", ["dl", "kernels"])
@pytest.mark.parametrize("name", available_policies())
def test_two_users_never_share_a_gpu_under_mps(name, kind):
    state = _snapshot(kind)
    policy = build_policy(name, {"max_jobs_per_gpu": 4})
    plan = policy.schedule(state, random.Random(5))
    check_plan(state, plan, max_jobs_per_gpu=4)
    assert mixed_mps_gpus(state, plan) == [], name


def test_the_check_catches_two_users_on_one_gpu():
    from scheduler.domain import Decision, Plan

    state = _snapshot("dl")
    bad = Plan(decisions=(Decision(Placement("bob0", "n", (0,), MPS), "bad", "x"),))
    assert mixed_mps_gpus(state, bad) == [(("n", 0), ["alice", "bob"])]
    # ... and a co-locating policy does share the GPU with alice's own jobs.
    plan = build_policy("binpack", {"max_jobs_per_gpu": 4}).schedule(state, random.Random(0))
    on_alices_gpu = [d for d in plan.decisions if d.placement.gpu_indices == (0,)]
    assert on_alices_gpu and all(d.placement.job_id.startswith("alice") for d in on_alices_gpu)
