"""placement_rate and all_gpu (seed 004, ALGORITHMS.md §1): the rate, the split, the scenario."""

from __future__ import annotations

import random

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
from scheduler.interference import build_interference
from scheduler.policies.base import PolicyError
from scheduler.policies.placement_rate import job_times, ordinal, placement_rates
from scheduler.policies.registry import build_policy
from scheduler.scenarios import load_scenario
from scheduler.simulator import simulate


def pjob(job_id: str, cpu: float | None, gpu: float | None, mem: float = 1000.0, **kw) -> JobSpec:
    profile = Profile(
        name=kw.pop("name", job_id),
        cpu_time_s=cpu,
        gpu_time_s={"TitanXp": gpu} if gpu is not None else {},
        gpu_memory_max_mb=mem,
    )
    return JobSpec(id=job_id, name=profile.name, profile=profile, **kw)


def titan_node(name: str = "g0", *, gpu: GpuState | None = None, cores: int = 8) -> NodeState:
    state = gpu or GpuState(node=name, index=0, spec=gpu_spec("TitanXp"))
    return NodeState(name, NodeKind.GPU, cores, cores, gpus=(state,))


def cpu_nodes(count: int) -> tuple[NodeState, ...]:
    return tuple(NodeState(f"c{i}", NodeKind.CPU, 1, 1) for i in range(count))


MODELS = frozenset({"TitanXp"})


def test_rate_matches_a_hand_computed_example():
    jobs = [pjob("a", 100, 10), pjob("b", 50, 25), pjob("c", 40, 20)]
    times = [job_times(j, MODELS, True) for j in jobs]
    rates = placement_rates(jobs, times, {"time_saved": 1.0, "speedup": 1.0})
    # time saved 90, 25, 20 (sum 135); speedup 10, 2, 2 (sum 14)
    assert rates == pytest.approx([90 / 135 + 10 / 14, 25 / 135 + 2 / 14, 20 / 135 + 2 / 14])
    # A negative weight on memory pushes the bigger job down; normalised by the queue's sum.
    more_mem = [pjob("x", 100, 10, mem=3000), pjob("y", 100, 10, mem=1000)]
    t2 = [job_times(j, MODELS, True) for j in more_mem]
    r2 = placement_rates(more_mem, t2, {"speedup": 1.0, "gpu_memory": -1.0})
    assert r2 == pytest.approx([0.5 - 0.75, 0.5 - 0.25])


def test_default_features_rank_the_papers_applications_as_published():
    sc = load_scenario("seed004")
    jobs = list(sc.jobs)
    times = [job_times(j, MODELS, True) for j in jobs]
    policy = build_policy("placement_rate")
    rates = placement_rates(jobs, times, policy.features)
    by_app: dict[str, set[float]] = {}
    for j, r in zip(jobs, rates, strict=True):
        by_app.setdefault(j.name, set()).add(round(r, 9))
    assert all(len(v) == 1 for v in by_app.values())  # same profile, same rate
    order = sorted(by_app, key=lambda a: -next(iter(by_app[a])))
    assert order == ["CNN-MNIST", "LAMMPS", "GROMACS", "BlackScholes", "Binomial"]


def test_rank_and_capacity_appear_in_the_explanations():
    state = ClusterState(
        now_s=0.0,
        nodes=(titan_node(), *cpu_nodes(2)),
        pending=(pjob("slow", 30, 20), pjob("fast", 1000, 10)),
    )
    plan = build_policy("placement_rate").schedule(state, random.Random(0))
    text = {d.placement.job_id: d.explanation for d in plan.decisions}
    assert text["fast"].startswith("rate ") and "1st of 2" in text["fast"]
    assert "2nd of 2" in text["slow"]
    assert "GPU capacity for 1 job" in text["fast"]
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "101st",
    ]


def test_split_sends_top_rates_to_the_gpu_and_the_rest_to_cpu_at_once():
    # One GPU with 2 container slots (time-sliced: a job there is predicted 2x its GPU time),
    # two 1-core CPU nodes. g1, g2 gain a lot on the GPU (1000 s -> 10 s); s1, s2 little.
    # k=2 on the GPU: GPU side 2 x 10 x 2 = 20 s, CPU side 20 s -> the shortest split.
    pending = (pjob("s1", 20, 15), pjob("g1", 1000, 10), pjob("s2", 20, 15), pjob("g2", 1000, 10))
    state = ClusterState(0.0, (titan_node(), *cpu_nodes(2)), pending)
    policy = build_policy("placement_rate", {"max_jobs_per_gpu": 2})
    plan = policy.schedule(state, random.Random(0))
    where = {d.placement.job_id: d.placement for d in plan.decisions}
    assert set(where) == {"g1", "g2", "s1", "s2"} and not plan.waiting
    assert where["g1"].on_gpu and where["g2"].on_gpu
    assert {where["s1"].node, where["s2"].node} == {"c0", "c1"}
    assert not where["s1"].on_gpu and not where["s2"].on_gpu
    assert all("GPU capacity for 2 jobs" in d.explanation for d in plan.decisions)


def test_gpu_side_jobs_wait_for_the_gpu_rather_than_take_a_slow_cpu():
    # Three GPU-worthy jobs, one GPU slot, a free CPU node: the third waits for the GPU
    # (predicted 30 s there) instead of taking the CPU for 1000 s.
    pending = tuple(pjob(f"g{i}", 1000, 10) for i in range(3))
    state = ClusterState(0.0, (titan_node(), *cpu_nodes(1)), pending)
    plan = build_policy("placement_rate", {"max_jobs_per_gpu": 1}).schedule(state, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["g0"]
    assert set(plan.waiting) == {"g1", "g2"}
    assert all("GPU side" in r and "GPU capacity for 3 jobs" in r for r in plan.waiting.values())


def test_without_cpu_nodes_everything_is_gpu_side():
    pending = (pjob("a", 20, 15), pjob("b", 1000, 10))
    state = ClusterState(0.0, (titan_node(),), pending)
    plan = build_policy("placement_rate", {"max_jobs_per_gpu": 1}).schedule(state, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["b"]
    assert "GPU side" in plan.waiting["a"]


def test_gpu_memory_in_use_beyond_declarations_blocks_a_placement():
    # A running job declared 2 GB but uses 11.5 GB now (it outgrew its profile, like LAMMPS):
    # the framework's declared-memory check would pass, the memory in use does not.
    grown = pjob("grown", None, 85, mem=2000)
    gpu = GpuState(
        node="g0",
        index=0,
        spec=gpu_spec("TitanXp"),
        mode=SharingMode.TIME_SLICING,
        job_ids=("grown",),
        committed_memory_mb=2000,
        used_memory_mb=11500,
    )
    running = RunningJob(
        grown, Placement("grown", "g0", (0,), SharingMode.TIME_SLICING), 0.0, progress=0.9
    )
    new = pjob("new", None, 100, mem=1228)
    state = ClusterState(10.0, (titan_node(gpu=gpu),), (new,), (running,))
    for name in ("placement_rate", "all_gpu"):
        plan = build_policy(name, {"max_jobs_per_gpu": 5}).schedule(state, random.Random(0))
        assert plan.decisions == () and "new" in plan.waiting, name
    roomy = GpuState(
        node="g0",
        index=0,
        spec=gpu_spec("TitanXp"),
        mode=SharingMode.TIME_SLICING,
        job_ids=("grown",),
        committed_memory_mb=2000,
        used_memory_mb=2000,
    )
    state2 = ClusterState(10.0, (titan_node(gpu=roomy),), (new,), (running,))
    plan2 = build_policy("placement_rate", {"max_jobs_per_gpu": 5}).schedule(
        state2, random.Random(0)
    )
    assert [d.placement.job_id for d in plan2.decisions] == ["new"]


def test_all_gpu_keeps_gpu_jobs_off_cpu_nodes_in_queue_order():
    pending = (
        pjob("a", 20, 15),
        pjob("b", 1000, 10),
        JobSpec(id="cpuonly", gpus=0),
        pjob("c", 20, 15),
        pjob("d", 20, 15),
    )
    state = ClusterState(0.0, (titan_node(), *cpu_nodes(3)), pending)
    plan = build_policy("all_gpu", {"max_jobs_per_gpu": 2}).schedule(state, random.Random(0))
    where = {d.placement.job_id: d.placement for d in plan.decisions}
    assert where["a"].on_gpu and where["b"].on_gpu
    assert not where["cpuonly"].on_gpu  # no GPU asked: CPU node
    # GPU full: c waits although CPU nodes are free, and d waits behind it (strict FIFO).
    assert "c" in plan.waiting and "behind job c" in plan.waiting["d"]


def test_unknown_feature_is_rejected():
    with pytest.raises(PolicyError, match="unknown rate feature"):
        build_policy("placement_rate", {"features": {"colour": 1.0}})
    with pytest.raises(PolicyError, match="gpu_share_slowdown"):
        build_policy("placement_rate", {"gpu_share_slowdown": -1})


def _run(name: str, scenario: str = "seed004"):
    sc = load_scenario(scenario)
    policy = build_policy(name, sc.policy_params.get(name))
    return simulate(
        sc.cluster,
        sc.jobs,
        policy,
        interference=build_interference(sc.interference),
        config=sc.config,
    )


def test_seed004_rate_split_beats_all_on_gpu_and_runs_both_sides():
    everything = _run("all_gpu")
    split = _run("placement_rate")
    assert all(r.end_reason == "completed" for r in everything.jobs + split.jobs)

    def makespan(res):
        return max(r.finish_s for r in res.jobs)

    assert makespan(split) < 0.9 * makespan(everything)
    assert all(r.location.endswith("/0") for r in everything.jobs)
    sides = {}
    for r in split.jobs:
        sides.setdefault(r.name, set()).add("gpu" if r.location.endswith("/0") else "cpu")
    assert sides["CNN-MNIST"] == {"gpu"}
    assert sides["BlackScholes"] == sides["Binomial"] == sides["GROMACS"] == {"cpu"}
    # Both sides busy from the start.
    started_at_0 = {r.location for r in split.jobs if r.start_s == 0.0}
    assert any(loc.endswith("/cpu") for loc in started_at_0)
    assert any(loc.endswith("/0") for loc in started_at_0)


def test_seed004_is_deterministic():
    a, b = _run("placement_rate"), _run("placement_rate")
    assert a.jobs == b.jobs


def test_an_idle_gpu_beats_joining_residents_on_a_faster_model():
    """A one-GPU job that allows sharing joins residents only when no GPU it may use is idle:
    the idle Titan Xp, not the A30 beside a resident, although its profile is faster on A30."""
    times = {"A30": 50.0, "TitanXp": 100.0}

    def job(job_id: str) -> JobSpec:
        profile = Profile(name="cnn", gpu_time_s=times, gpu_memory_max_mb=1000)
        return JobSpec(id=job_id, name="cnn", profile=profile)

    busy = GpuState(
        node="a30",
        index=0,
        spec=gpu_spec("A30"),
        mode=SharingMode.MPS,
        job_ids=("r",),
        committed_memory_mb=1000,
    )
    a30 = NodeState("a30", NodeKind.GPU, 8, 7, gpus=(busy,))
    resident = RunningJob(job("r"), Placement("r", "a30", (0,), SharingMode.MPS), 0.0)
    state = ClusterState(10.0, (a30, titan_node("titan")), (job("new"),), (resident,))
    plan = build_policy("placement_rate", {"max_jobs_per_gpu": 5}).schedule(state, random.Random(0))
    assert [(d.placement.node, d.placement.gpu_indices) for d in plan.decisions] == [
        ("titan", (0,))
    ]
    # with the Titan Xp taken, the job does join the A30's resident
    taken = GpuState(
        node="titan",
        index=0,
        spec=gpu_spec("TitanXp"),
        mode=SharingMode.EXCLUSIVE,
        job_ids=("t",),
        committed_memory_mb=1000,
    )
    other = RunningJob(job("t"), Placement("t", "titan", (0,), SharingMode.EXCLUSIVE), 0.0)
    full = ClusterState(
        10.0, (a30, titan_node("titan", gpu=taken)), (job("new"),), (resident, other)
    )
    plan = build_policy("placement_rate", {"max_jobs_per_gpu": 5}).schedule(full, random.Random(0))
    assert [d.placement.node for d in plan.decisions] == ["a30"]
