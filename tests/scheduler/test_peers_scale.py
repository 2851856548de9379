"""The peers at scale: one cycle with 1,000 jobs waiting on 1,000 GPUs (idle, then all busy)."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest

from scheduler.domain import ClusterState, JobSpec, Placement, Profile, RunningJob, SharingMode
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import GB, check_plan, gpu_node

PEERS = ["tiresias", "gavel_maxmin", "gavel_ftf", "allox", "themis"]
MODELS = ("V100", "P100", "K80")
#: Generous against a loaded CI machine; on an idle core each takes 0.1-0.5 s.
BUDGET_S = 3.0


def _job(rng: random.Random, i: int, arrival: float, gpus: int = 1) -> JobSpec:
    base = rng.uniform(600, 36000)
    times = {"V100": base, "P100": base * 1.7, "K80": base * rng.uniform(2, 5)}
    return JobSpec(
        id=f"j{i}", arrival_s=arrival, gpus=gpus, gpu_memory_mb=2 * GB,
        profile=Profile(f"type{i % 20}", gpu_time_s=times),
    )  # fmt: skip


def _cluster(busy: bool) -> ClusterState:
    rng = random.Random(1)
    nodes, running, k = [], [], 0
    for n in range(125):
        node = gpu_node(f"n{n}", MODELS[n % 3], 8)
        if busy:
            gpus = []
            for g in node.gpus:
                j = _job(rng, k, 0.0)
                k += 1
                gpus.append(replace(g, mode=SharingMode.EXCLUSIVE, job_ids=(j.id,),
                                    committed_memory_mb=2 * GB))  # fmt: skip
                pl = Placement(j.id, node.name, (g.index,), SharingMode.EXCLUSIVE)
                running.append(RunningJob(j, pl, started_s=0.0, progress=0.3))
            node = replace(node, gpus=tuple(gpus))
        nodes.append(node)
    sizes = [1, 1, 1, 1, 2, 4, 8]
    pending = [_job(rng, k + i, 100.0 + i, rng.choice(sizes)) for i in range(1000)]
    return ClusterState(now_s=5000.0, nodes=tuple(nodes), pending=tuple(pending),
                        running=tuple(running))  # fmt: skip


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
@pytest.mark.parametrize("name", PEERS)
def test_a_cycle_with_1000_pending_on_1000_gpus_is_fast(name, busy):
    state = _cluster(busy)
    policy = build_policy(name)
    t0 = time.perf_counter()
    plan = policy.schedule(state, random.Random(0))
    took = time.perf_counter() - t0
    check_plan(state, plan)
    assert took < BUDGET_S, f"{name}: {took:.2f} s"
    if not busy:
        assert len(plan.decisions) > 100  # the idle cluster was filled
