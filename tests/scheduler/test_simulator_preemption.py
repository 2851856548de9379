"""Simulator fidelity for issue 13: preemption cost, noisy estimates, measured pairs keyed by
GPU count, the generator's burst and duration settings, finish-time fairness."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from scheduler.domain import (
    Action,
    ActionKind,
    ClusterState,
    Decision,
    JobSpec,
    Placement,
    Plan,
    Profile,
    SharingMode,
)
from scheduler.estimates import with_noisy_estimates
from scheduler.ftf import ftf_ratios, round_wait_floors
from scheduler.interference import MeasuredInterference
from scheduler.policies.base import Policy
from scheduler.simulate import main as simulate_main
from scheduler.simulator import SimConfig, simulate
from scheduler.trace_generator import generate_jobs
from tests.scheduler.sim_helpers import cluster
from tests.scheduler.snapshots import gpu_node


def gjob(
    job_id: str, solo: float, *, arrival: float = 0.0, job_type: str | None = None, gpus: int = 1
) -> JobSpec:
    return JobSpec(
        id=job_id,
        arrival_s=arrival,
        gpus=gpus,
        job_type=job_type,
        profile=Profile(name=job_id, gpu_time_s={"V100": solo}),
    )


class RequeueOnce(Policy):
    """Places jobs in order on GPU 0; at t >= 100 requeues job 'a' once, then places it again."""

    name = "test-requeue-once"

    def __init__(self) -> None:
        super().__init__()
        self.done = False

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        actions = []
        busy = any(r.job.id == "a" for r in state.running)
        if busy and state.now_s >= 100 and not self.done:
            self.done = True
            actions.append(Action(ActionKind.REQUEUE, "a", self.name, "test"))
            busy = False
        decisions = []
        if not busy and state.pending:
            j = state.pending[0]
            decisions.append(
                Decision(Placement(j.id, "v100-0", (0,), SharingMode.EXCLUSIVE), self.name, "x")
            )
        return Plan(decisions=tuple(decisions), actions=tuple(actions))


def one_v100():
    return cluster({"name": "v100", "count": 1, "gpu_model": "V100", "gpus_per_node": 1})


@pytest.mark.parametrize("cost", [0.0, 60.0])
def test_a_requeued_job_pays_the_preemption_cost_when_it_restarts(cost: float) -> None:
    # 'a' runs 0-100, is requeued (keeping its progress) and placed again at once: it makes no
    # progress for `cost` seconds, then needs its other 900 s.
    res = simulate(
        one_v100(),
        [gjob("a", 1000.0), gjob("tick", 1.0, arrival=100.0)],
        RequeueOnce(),
        config=SimConfig(preemption_cost_s=cost),
    )
    a = {r.job_id: r for r in res.jobs}["a"]
    assert a.preemptions == 1
    assert a.finish_s == pytest.approx(1000.0 + cost + 1.0)  # 'tick' ran 1 s before it


def test_preemption_cost_by_job_type_overrides_the_default() -> None:
    cfg = SimConfig(preemption_cost_s=60.0, preemption_cost_by_type={"LM": 5.0})
    assert cfg.preemption_cost("LM") == 5.0
    assert cfg.preemption_cost("ResNet") == 60.0
    assert cfg.preemption_cost(None) == 60.0
    with pytest.raises(ValueError):
        SimConfig(preemption_cost_s=-1.0)


def test_noisy_estimates_change_what_policies_see_not_the_truth() -> None:
    jobs = [gjob(f"j{i}", 1000.0) for i in range(200)]
    noisy, truth = with_noisy_estimates(jobs, 0.5, seed=3)
    est = [j.profile.gpu_time_s["V100"] for j in noisy]
    logs = [math.log(t / 1000.0) for t in est]
    assert statistics.pstdev(logs) == pytest.approx(0.5, abs=0.08)
    assert all(truth[j.id] * j.profile.gpu_time_s["V100"] == pytest.approx(1000.0) for j in noisy)
    # The truth stays out of the jobs the policy sees.
    assert all(j.params == {} for j in noisy)
    assert with_noisy_estimates(jobs, 0.5, seed=3) == (noisy, truth)  # seeded
    assert with_noisy_estimates(jobs, 0.0, seed=3) == (jobs, {})
    # The simulator runs the true 1,000 s whatever the estimate says.
    res = simulate(one_v100(), noisy[:1], RequeueOnce(), true_work=truth)
    assert res.jobs[0].finish_s == pytest.approx(1000.0)
    # SimConfig.estimate_noise draws the same noise inside the engine.
    res = simulate(
        one_v100(), jobs[:1], RequeueOnce(), config=SimConfig(estimate_noise=0.5, seed=3)
    )
    assert res.jobs[0].finish_s == pytest.approx(1000.0)
    with pytest.raises(ValueError):
        with_noisy_estimates(jobs, -1.0, seed=0)


def test_reported_progress_is_done_over_declared_work() -> None:
    # Declared 500 s, true 1,000 s: at t = 250 a quarter is done, half of the declared work.
    import dataclasses

    declared = dataclasses.replace(
        gjob("a", 1000.0), profile=Profile(name="a", gpu_time_s={"V100": 500.0})
    )
    seen: list[float] = []

    class Watch(RequeueOnce):
        def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
            seen.extend(r.progress for r in state.running if state.now_s == 250.0)
            self.done = True
            return super().schedule(state, rng)

    res = simulate(
        one_v100(), [declared, gjob("t", 1.0, arrival=250.0)], Watch(), true_work={"a": 2.0}
    )
    assert seen and seen[0] == pytest.approx(0.5, abs=0.02)
    assert {r.job_id: r for r in res.jobs}["a"].finish_s == pytest.approx(1000.0)


def test_measured_pairs_only_between_jobs_of_the_same_gpu_count() -> None:
    table = MeasuredInterference()
    spec = gpu_node("v", "V100", 1).gpus[0].spec
    t = "ResNet-50 (batch size 64)"
    u = "Transformer (batch size 64)"
    one_a, one_b = gjob("a", 1.0, job_type=t), gjob("b", 1.0, job_type=u)
    four_a, four_b = gjob("c", 1.0, job_type=t, gpus=4), gjob("d", 1.0, job_type=u, gpus=4)
    measured = table.measured_pair(one_a, one_b, spec)
    assert measured is not None and measured > 1.0
    # Two 4-GPU jobs sharing their GPUs pairwise read the same measured pair.
    assert table.measured_pair(four_a, four_b, spec) == measured
    assert table.pair_slowdown(four_a, four_b, spec) == measured
    # A 4-GPU job next to a 1-GPU job was never measured: no value, the fallback is counted.
    assert table.measured_pair(four_a, one_b, spec) is None
    before = table.misses
    table.pair_slowdown(four_a, one_b, spec)
    assert table.misses == before + 1


def test_generator_burst_and_duration_range() -> None:
    jobs = generate_jobs(100, seed=0, burst=True, duration_hours=(1.0, 4.0))
    assert all(j.arrival_s == 0.0 for j in jobs)
    assert all(3600.0 <= j.duration_v100_s <= 4 * 3600.0 for j in jobs)
    # Log-uniform: about half below the geometric middle (2 h).
    below = sum(1 for j in jobs if j.duration_v100_s < 7200.0)
    assert 35 <= below <= 65
    poisson = generate_jobs(100, seed=0, jobs_per_hour=4.0, duration_hours=(1.0, 4.0))
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(poisson, poisson[1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(900.0, rel=0.25)
    # The job types and durations do not depend on the arrival setting (separate streams).
    assert [j.job_type for j in jobs] == [j.job_type for j in poisson]
    with pytest.raises(ValueError):
        generate_jobs(10, duration_hours=(4.0, 1.0))


def test_ftf_ratio_is_jct_over_a_fair_share() -> None:
    # Two equal jobs at t=0 on one V100, run one after the other: n = 2 while both are
    # present; the first finishes at 1000 (isolated: 2 x 1000 -> rho 0.5), the second at 2000
    # with n averaging 1.5 over its life (rounded to 2: rho 1.0).
    res = simulate(one_v100(), [gjob("a", 1000.0), gjob("b", 1000.0)], RequeueOnce())
    rho = ftf_ratios(res, [gjob("a", 1000.0), gjob("b", 1000.0)], {"V100": 1})
    assert rho["a"] == pytest.approx(0.5)
    assert rho["b"] == pytest.approx(1.0)


def test_the_round_wait_floor_is_what_the_rounds_alone_force() -> None:
    # A 10-s job arrives at t = 50 on an idle V100; with 360-s rounds it starts at 360 and
    # ends at 370: JCT 320 over an isolated 10 s, rho 32, all of it the wait for the round.
    from scheduler.policies.registry import build_policy

    job = gjob("s", 10.0, arrival=50.0)
    for round_s, expected in ((360.0, 32.0), (None, 1.0)):
        res = simulate(one_v100(), [job], build_policy("fifo"), config=SimConfig(round_s=round_s))
        rho = ftf_ratios(res, [job], {"V100": 1})
        floor = round_wait_floors(res, [job], {"V100": 1}, round_s)
        assert rho["s"] == pytest.approx(expected)
        assert floor["s"] == pytest.approx(expected)


def test_no_job_does_better_than_its_round_wait_floor() -> None:
    # Noisy estimates, packing and preemption on a generated trace: every job's ratio is at
    # least its floor, and the rounds raise the floors.
    from scheduler.policies.registry import build_policy
    from scheduler.scenarios import load_scenario

    sc = load_scenario("gavel100_p900")  # 4 V100 + 4 P100 + 4 K80, one arrival per 900 s
    jobs, c = list(sc.jobs[:40]), sc.cluster
    counts = {"V100": 4, "P100": 4, "K80": 4}
    floors = {}
    for round_s in (360.0, None):
        config = SimConfig(seed=1, round_s=round_s, estimate_noise=0.5, preemption_cost_s=60.0)
        res = simulate(
            c, jobs, build_policy("hetero_srtf"), interference=MeasuredInterference(), config=config
        )
        rho = ftf_ratios(res, jobs, counts)
        floors[round_s] = floor = round_wait_floors(res, jobs, counts, round_s)
        assert set(floor) == set(rho) and len(rho) == len(jobs)
        assert all(rho[j] >= floor[j] * (1 - 1e-9) for j in rho)
    late = [j for j in jobs if j.arrival_s % 360.0 > 0]
    assert late and all(floors[360.0][j.id] > 0 for j in late)
    assert max(floors[360.0].values()) > max(floors[None].values())


def test_cli_takes_preemption_cost_and_estimate_noise(tmp_path, capsys) -> None:
    rc = simulate_main(
        [
            "--scenario",
            "gavel100_p1800",
            "--policy",
            "hetero_srtf",
            "--preemption-cost-s",
            "60",
            "--estimate-noise",
            "0.5",
            "--quiet",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "hetero_srtf" in out and "100" in out
    assert simulate_main(["--scenario", "gavel100_p1800", "--estimate-noise", "-1"]) == 2


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("burst", {"burst": True}),
        ("p900", {"jobs_per_hour": 4.0}),
        ("p1800", {"jobs_per_hour": 2.0}),
    ],
)
def test_the_gavel100_scenario_traces_are_what_the_documented_commands_write(
    tmp_path, name: str, kwargs: dict
) -> None:
    from pathlib import Path

    from scheduler.trace_generator import write_gavel_trace

    out = tmp_path / "t.csv"
    write_gavel_trace(generate_jobs(100, seed=0, duration_hours=(1.0, 4.0), **kwargs), out)
    traces = Path(__file__).resolve().parents[2] / "scheduler" / "scenarios" / "traces"
    vendored = traces / f"gavel100_{name}_seed0.csv"
    assert out.read_bytes() == vendored.read_bytes()
