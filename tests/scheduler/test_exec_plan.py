"""exec_plan (seed 004 Algorithm 1): pause before a memory step that does not fit, resume when
room returns; on hand-built snapshots and in the simulator."""

from __future__ import annotations

import random

import pytest

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ActionKind,
    ClusterState,
    GpuState,
    JobSpec,
    MemoryStep,
    NodeKind,
    NodeState,
    Placement,
    Profile,
    RunningJob,
    SharingMode,
)
from scheduler.interference import build_interference
from scheduler.policies.exec_plan import ExecPlanPolicy
from scheduler.policies.memory_steps import memory_at
from scheduler.policies.registry import build_policy
from scheduler.scenarios import load_scenario
from scheduler.simulator import Simulator

TS = SharingMode.TIME_SLICING
LAMMPS = Profile(
    name="LAMMPS",
    cpu_time_s=990,
    gpu_time_s={"TitanXp": 85},
    gpu_memory_max_mb=2273,
    memory_steps=(
        MemoryStep(0.0, 0, 833),
        MemoryStep(0.25, 833, 1895),
        MemoryStep(0.5, 1895, 2795),
        MemoryStep(0.75, 2795, 8317),
    ),
)
CNN = Profile(
    name="CNN-MNIST", cpu_time_s=3752, gpu_time_s={"TitanXp": 198}, gpu_memory_max_mb=1228
)


def snapshot(
    running: list[tuple[JobSpec, float, bool]],
    pending: tuple[JobSpec, ...] = (),
    now: float = 730.0,
) -> ClusterState:
    """A Titan Xp running ``(job, progress, paused)`` under time-slicing (started at 0)."""
    used = sum(memory_at(j, p) for j, p, _ in running)
    gpu = GpuState(
        node="g0",
        index=0,
        spec=gpu_spec("TitanXp"),
        mode=TS if running else None,
        job_ids=tuple(j.id for j, _, _ in running),
        committed_memory_mb=sum(j.memory_need_mb() for j, _, _ in running),
        used_memory_mb=used,
    )
    node = NodeState("g0", NodeKind.GPU, 8, 8, gpus=(gpu,))
    rjs = tuple(
        RunningJob(j, Placement(j.id, "g0", (0,), TS), 0.0, progress=p, paused=paused)
        for j, p, paused in running
    )
    return ClusterState(now, (node,), pending, rjs)


def lammps() -> JobSpec:
    return JobSpec(id="lmp", name="LAMMPS", profile=LAMMPS)


def cnn(i: int) -> JobSpec:
    return JobSpec(id=f"cnn{i}", name="CNN-MNIST", profile=CNN)


def plan_for(state: ClusterState, **params):
    return build_policy("all_gpu+exec_plan", {"max_jobs_per_gpu": 6, **params}).schedule(
        state, random.Random(0)
    )


def test_pauses_the_growing_job_when_its_next_step_would_overflow():
    # LAMMPS at 76 %: in step 4 (2795 -> 8317 MB), using ~3 GB now. 4 CNN hold 4.9 GB.
    # Predicted: 4 x 1228 + 8317 + 128 = 13357 MB = 13.0 GB > 12.0 GB -> pause LAMMPS (the CNNs
    # do not grow, pausing them would free nothing).
    state = snapshot([(lammps(), 0.76, False)] + [(cnn(i), 0.5, False) for i in range(4)])
    plan = plan_for(state)
    assert [(a.kind, a.job_id) for a in plan.actions] == [(ActionKind.PAUSE, "lmp")]
    text = plan.actions[0].explanation
    assert text.startswith("paused 730 s after its start: LAMMPS step 4 needs 8.2 GB")
    assert "13.0 of 12.0 GB predicted on g0/gpu0" in text
    assert plan.actions[0].policy == "all_gpu+exec_plan"


def test_looks_ahead_into_the_next_step():
    # At 70 % LAMMPS is in step 3 (peak 2.8 GB). Its speed is taken as at least a fifth of
    # solo (5 jobs share the GPU): 1 / 425 per s; 2 intervals of 5 s reach 72.4 %, not step 4
    # (75 %) -> no pause. With 10 intervals (79.4 %) the look-ahead sees step 4 -> pause.
    state = snapshot([(lammps(), 0.70, False)] + [(cnn(i), 0.5, False) for i in range(4)])
    assert plan_for(state).actions == ()
    far = plan_for(state, lookahead_intervals=10)
    assert [(a.kind, a.job_id) for a in far.actions] == [(ActionKind.PAUSE, "lmp")]
    assert "step 4" in far.actions[0].explanation


def test_fits_means_no_pause():
    # 3 CNN + LAMMPS's step 4 peak: 3684 + 8317 + 128 = 12129 <= 12288 MB.
    state = snapshot([(lammps(), 0.8, False)] + [(cnn(i), 0.5, False) for i in range(3)])
    assert plan_for(state).actions == ()
    # A larger alpha tips it over.
    assert [a.kind for a in plan_for(state, alpha_mb=300).actions] == [ActionKind.PAUSE]


def test_resumes_when_room_returns_and_not_before():
    still_full = snapshot(
        [(lammps(), 0.76, True)] + [(cnn(i), 0.9, False) for i in range(4)], now=900.0
    )
    assert plan_for(still_full).actions == ()
    room = snapshot([(lammps(), 0.76, True), (cnn(0), 0.9, False)], now=1100.0)
    plan = plan_for(room)
    assert [(a.kind, a.job_id) for a in plan.actions] == [(ActionKind.RESUME, "lmp")]
    assert plan.actions[0].explanation.startswith(
        "resumed 1100 s after its start: LAMMPS step 4 needs 8.2 GB"
    )
    assert "9.4 of 12.0 GB predicted" in plan.actions[0].explanation


def test_paused_job_alone_is_resumed_even_if_its_step_is_too_big():
    huge = Profile(
        name="Huge",
        gpu_time_s={"TitanXp": 10},
        memory_steps=(MemoryStep(0.0, 100, 200), MemoryStep(0.5, 200, 20000)),
    )
    job = JobSpec(id="h", name="Huge", profile=huge)
    plan = plan_for(snapshot([(job, 0.5, True)]))
    assert [(a.kind, a.job_id) for a in plan.actions] == [(ActionKind.RESUME, "h")]
    assert "alone on g0/gpu0" in plan.actions[0].explanation


def test_lowest_priority_growing_job_is_paused_first():
    # Two jobs growing; LAMMPS gains less from the GPU than 'Big' (cpu 9000 s), so it goes.
    big = JobSpec(
        id="big",
        name="Big",
        profile=Profile(
            name="Big",
            cpu_time_s=9000,
            gpu_time_s={"TitanXp": 100},
            memory_steps=(MemoryStep(0.0, 1000, 6000),),
        ),
    )
    state = snapshot([(lammps(), 0.76, False), (big, 0.2, False)])
    plan = plan_for(state)
    assert [(a.kind, a.job_id) for a in plan.actions] == [(ActionKind.PAUSE, "lmp")]


def test_new_placements_leave_room_for_a_paused_job():
    state = snapshot(
        [(lammps(), 0.76, True), (cnn(0), 0.5, False), (cnn(1), 0.5, False)],
        pending=(cnn(7), cnn(8)),
    )
    plan = plan_for(state)
    # Paused LAMMPS resumes (2 x 1228 + 8445 fits); a third CNN still fits (11.9 GB), a
    # fourth would not: it is held back with the numbers.
    assert [a.kind for a in plan.actions] == [ActionKind.RESUME]
    assert [d.placement.job_id for d in plan.decisions] == ["cnn7"]
    assert "held back by all_gpu+exec_plan" in plan.waiting["cnn8"]
    assert "12.0 GB" in plan.waiting["cnn8"]
    assert all(d.policy == "all_gpu+exec_plan" for d in plan.decisions)


def test_registry_composes_any_placement_policy_and_passes_its_parameters():
    p = build_policy("binpack+exec_plan", {"max_jobs_per_gpu": 4, "interval_s": 2})
    assert isinstance(p, ExecPlanPolicy) and p.name == "binpack+exec_plan"
    assert p.inner.name == "binpack" and p.inner.params["max_jobs_per_gpu"] == 4
    assert p.tick_interval_s == 2.0
    assert build_policy("placement_rate+exec_plan").inner.name == "placement_rate"
    with pytest.raises(ValueError):
        build_policy("exec_plan", {"placement": "exec_plan"})
    with pytest.raises(ValueError):
        build_policy("exec_plan", {"interval_s": 0})


def _sim(scenario: str, name: str) -> Simulator:
    sc = load_scenario(scenario)
    sim = Simulator(
        sc.cluster,
        sc.jobs,
        build_policy(name, sc.policy_params.get(name)),
        interference=build_interference(sc.interference),
        config=sc.config,
    )
    sim.result = sim.run()  # type: ignore[attr-defined]
    return sim


def test_simulator_oom_without_the_plan_none_with_it():
    # LAMMPS submitted first shares the Titan Xp with 4 CNN-MNIST: its step 4 (8.3 GB) does not
    # fit next to them (4.9 GB). Without the plan it is OOM-killed; with it, paused and resumed.
    without = _sim("seed004_lammps_first", "all_gpu")
    assert without.result.oom_count > 0
    assert without.action_log == []
    with_plan = _sim("seed004_lammps_first", "all_gpu+exec_plan")
    assert with_plan.result.oom_count == 0
    assert all(r.end_reason == "completed" for r in with_plan.result.jobs)
    kinds = [(k, j) for _, k, j, _ in with_plan.action_log]
    assert ("pause", "0000-LAMMPS") in kinds and ("resume", "0000-LAMMPS") in kinds
    lmp = next(r for r in with_plan.result.jobs if r.job_id == "0000-LAMMPS")
    assert lmp.paused_s > 0 and "s after its start: LAMMPS step 4 needs" in lmp.explanation
    # The policy asked for ticks: it was called far more often than arrivals + completions
    # (ticks come while a job with memory steps runs: the plan's watch).
    assert with_plan.result.policy_calls > 4 * len(with_plan.result.jobs)


def test_simulator_plan_on_the_seed004_scenario_is_harmless_and_deterministic():
    a = _sim("seed004", "placement_rate+exec_plan")
    b = _sim("seed004", "placement_rate+exec_plan")
    assert a.result.oom_count == 0
    assert a.result.jobs == b.result.jobs and a.action_log == b.action_log
    c = _sim("seed004_lammps_first", "all_gpu+exec_plan")
    d = _sim("seed004_lammps_first", "all_gpu+exec_plan")
    assert c.action_log == d.action_log and c.result.jobs == d.result.jobs


def test_a_paused_job_waits_until_its_next_step_fits_whatever_the_look_ahead():
    # LAMMPS paused at 60 %, in step 3 (peak 2.8 GB), with 4 CNN (4.9 GB) still running. The
    # look-ahead at solo speed (10 s of 85 s: +12 %) stays in step 3, where 7.8 GB would fit; but
    # resumed it grows into step 4 (8.3 GB) next: 13.0 GB, so it stays paused.
    crowded = snapshot([(lammps(), 0.60, True)] + [(cnn(i), 0.5, False) for i in range(4)])
    assert plan_for(crowded).actions == ()
    # With one CNN left, step 4 fits: resumed, and the text names step 4.
    room = snapshot([(lammps(), 0.60, True), (cnn(0), 0.9, False)], now=1100.0)
    plan = plan_for(room)
    assert [(a.kind, a.job_id) for a in plan.actions] == [(ActionKind.RESUME, "lmp")]
    assert "LAMMPS step 4 needs 8.2 GB" in plan.actions[0].explanation
