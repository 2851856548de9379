"""``sharing_chain``: placement rate -> sharing mode -> pairing -> memory plan."""

from __future__ import annotations

import random

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
from scheduler.interference import build_interference
from scheduler.policies.exec_plan import ExecPlanPolicy
from scheduler.policies.registry import build_policy
from scheduler.scenarios import load_scenario
from scheduler.simulator import simulate
from tests.scheduler.snapshots import GB


def dl(id, cm, cpu=None, mem=2.0, sens=1.2):
    profile = Profile(
        id,
        gpu_time_s={"V100": 100.0},
        cpu_time_s=cpu,
        cm_ratio=cm,
        sensitivity=sens,
        batch_size=16,
        image_size=224,
    )
    return JobSpec(id=id, gpu_memory_mb=mem * GB, profile=profile)


def test_explanations_name_each_stage():
    node = NodeState("g", NodeKind.GPU, 8, 8, gpus=(GpuState("g", 0, gpu_spec("V100")),))
    cpu = NodeState("c", NodeKind.CPU, 8, 8)
    state = ClusterState(0.0, (node, cpu), (dl("gpu-job", 18.0), dl("cpu-job", 18.0, cpu=90.0)))
    policy = build_policy("sharing_chain")
    assert isinstance(policy, ExecPlanPolicy) and policy.tick_interval_s == 5.0
    plan = policy.schedule(state, random.Random(0))
    text = {d.placement.job_id: d.explanation for d in plan.decisions}
    assert text["gpu-job"].startswith("rate ") and "gpu side" in text["gpu-job"]
    assert "mode: criterion 3" in text["gpu-job"]
    # A job that finishes sooner on the CPU node goes there (stage 1).
    assert "cpu side" in text["cpu-job"] and "CPU side" in text["cpu-job"]


def test_pairing_keeps_memory_intensive_jobs_apart():
    v100 = gpu_spec("V100")
    resident = dl("r", 5.0)
    busy = GpuState("g", 0, v100, SharingMode.MPS, ("r",), resident.memory_need_mb())
    node = NodeState("g", NodeKind.GPU, 8, 7, gpus=(busy, GpuState("g", 1, v100)))
    run = RunningJob(resident, Placement("r", "g", (0,), SharingMode.MPS), 0.0)
    state = ClusterState(0.0, (node,), (dl("m", 6.0),), (run,))
    (d,) = build_policy("sharing_chain").schedule(state, random.Random(0)).decisions
    assert d.placement.gpu_indices == (1,)
    # Only one GPU, already running a memory-intensive job: taken as a last resort.
    one = NodeState("g", NodeKind.GPU, 8, 7, gpus=(busy,))
    state = ClusterState(0.0, (one,), (dl("m", 6.0),), (run,))
    (d,) = build_policy("sharing_chain").schedule(state, random.Random(0)).decisions
    assert "pairing: two memory-intensive jobs together, taken as a last resort" in d.explanation
    off = build_policy("sharing_chain", {"placement_params": {"pairing": False}})
    (d,) = off.schedule(state, random.Random(0)).decisions
    assert "pairing: off" in d.explanation and "last resort" not in d.explanation


def test_runs_the_sharing001_scenario_to_the_end():
    sc = load_scenario("sharing001")
    result = simulate(
        sc.cluster,
        sc.jobs[:40],
        build_policy("sharing_chain", {"max_jobs_per_gpu": 4}),
        interference=build_interference(sc.interference),
        config=sc.config,
    )
    assert all(r.end_reason == "completed" for r in result.jobs)
    assert {r.mode for r in result.jobs} >= {"mig", "mps", "time_slicing"}


def test_sharing_chain_replays_a_long_philly_stretch_without_idle_ticks() -> None:
    # The memory plan's 5-s ticks only run while a job with memory steps does: on Philly jobs
    # (no steps) over months, the policy is called on arrivals and completions only (before,
    # ~10^6 idle calls: the 951-job trace did not finish in hours).
    from scheduler.policies.registry import build_policy
    from scheduler.scenarios import load_scenario
    from scheduler.simulator import simulate

    sc = load_scenario("philly")
    jobs = list(sc.jobs)[:120]
    res = simulate(sc.cluster, jobs, build_policy("sharing_chain"), config=sc.config)
    assert all(r.end_reason == "completed" for r in res.jobs)
    assert res.policy_calls <= 3 * len(jobs)
