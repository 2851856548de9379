"""``scheduler.jct_bound``: a lower bound on the average JCT that no schedule can beat."""

from __future__ import annotations

import pytest

from scheduler.domain import JobSpec, Profile
from scheduler.interference import build_interference
from scheduler.jct_bound import avg_jct_lower_bound, first_round_s, srpt_total_completion_s
from scheduler.peers import TRACES, trace_jobs
from scheduler.policies.registry import build_policy
from scheduler.scenarios import load_scenario
from scheduler.simulator import SimConfig, simulate
from tests.scheduler.sim_helpers import cluster


def _job(job_id: str, times: dict[str, float], arrival: float = 0.0, gpus: int = 1) -> JobSpec:
    return JobSpec(
        id=job_id,
        arrival_s=arrival,
        gpus=gpus,
        profile=Profile(name=job_id, gpu_time_s=times),
    )


def test_srpt_on_one_machine_by_hand() -> None:
    # speed 2, all at 0: works 1, 2, 3 end at 0.5, 1.5, 3.0
    assert srpt_total_completion_s([0, 0, 0], [3, 1, 2], 2.0) == pytest.approx(5.0)
    # the short job arriving at 1 preempts the long one: ends at 2, the long one at 4
    assert srpt_total_completion_s([0, 1], [3, 1], 1.0) == pytest.approx(6.0)
    # an idle gap: the second job starts at its release
    assert srpt_total_completion_s([0, 10], [1, 1], 1.0) == pytest.approx(1 + 11)
    with pytest.raises(ValueError):
        srpt_total_completion_s([0], [1], 0.0)


def test_rounds_delay_the_first_decision() -> None:
    assert first_round_s(100.0, 360.0) == 360.0
    assert first_round_s(720.0, 360.0) == 720.0
    assert first_round_s(100.0, None) == 100.0


def test_per_job_and_pooled_bounds_by_hand() -> None:
    two = cluster({"name": "v", "gpu_model": "V100", "gpus_per_node": 2})
    jobs = [_job(str(i), {"V100": t}) for i, t in enumerate((3600.0, 7200.0, 10_800.0))]
    b = avg_jct_lower_bound(jobs, two)
    assert b.per_job_s == pytest.approx(7200.0)  # each on its own GPU at once
    assert b.pooled_s == pytest.approx((1800 + 5400 + 10_800) / 3)  # two GPUs fused, SRPT
    assert b.avg_jct_s == b.per_job_s
    one = cluster({"name": "v", "gpu_model": "V100", "gpus_per_node": 1})
    assert avg_jct_lower_bound(jobs, one).avg_jct_s == pytest.approx((1 + 3 + 6) * 3600 / 3)
    # a K80 that runs every job at half speed adds half a GPU of capacity
    mixed = cluster(
        {"name": "v", "gpu_model": "V100", "gpus_per_node": 1},
        {"name": "k", "gpu_model": "K80", "gpus_per_node": 1},
    )
    slow = [_job(str(i), {"V100": t, "K80": 2 * t}) for i, t in enumerate((3600.0, 7200.0))]
    b = avg_jct_lower_bound(slow, mixed)
    assert b.pooled_s == pytest.approx((3600 / 1.5 + 10_800 / 1.5) / 2)
    assert b.per_job_s == pytest.approx(5400.0)
    # a 2-GPU job spread over two 1-GPU nodes runs at the unconsolidated speed
    spread = avg_jct_lower_bound([_job("g", {"V100": 3600.0}, gpus=2)], two)
    apart = avg_jct_lower_bound(
        [_job("g", {"V100": 3600.0}, gpus=2)],
        cluster({"name": "v", "count": 2, "gpu_model": "V100", "gpus_per_node": 1}),
    )
    assert apart.per_job_s > spread.per_job_s == pytest.approx(3600.0)


def test_a_lone_job_reaches_the_bound_and_rounds_add_the_wait() -> None:
    mixed = cluster(
        {"name": "v", "gpu_model": "V100", "gpus_per_node": 1},
        {"name": "k", "gpu_model": "K80", "gpus_per_node": 1},
    )
    lone = [_job("a", {"V100": 3000.0, "K80": 9000.0}, arrival=100.0)]
    for round_s in (None, 360.0):
        result = simulate(
            mixed, lone, build_policy("hetero_srtf"), config=SimConfig(round_s=round_s)
        )
        (rec,) = result.jobs
        bound = avg_jct_lower_bound(lone, mixed, round_s)
        assert rec.jct_s == pytest.approx(bound.avg_jct_s)
        assert bound.avg_jct_s == pytest.approx(3000.0 + (260.0 if round_s else 0.0))


@pytest.mark.parametrize("trace", ["light", "burst", "physical96"])
def test_no_policy_beats_the_bound(trace: str) -> None:
    # The true lengths, with and without rounds, policies that pack and that do not: every
    # run's average JCT is at or above the bound (it would not be if the bound were wrong).
    t = TRACES[trace]
    sc = load_scenario(t.scenario)
    jobs = trace_jobs(t, sc.jobs, 0)
    if trace != "physical96":
        jobs = jobs[:40]
    model = build_interference(sc.interference)
    for round_s in (None, 360.0):
        bound = avg_jct_lower_bound(jobs, sc.cluster, round_s).avg_jct_s
        for name in ("fifo", "hetero_srtf", "gavel_ftf", "placement_rate"):
            config = SimConfig(seed=0, round_s=round_s)
            result = simulate(
                sc.cluster, jobs, build_policy(name), interference=model, config=config
            )
            jcts = [r.jct_s for r in result.jobs if r.jct_s is not None]
            assert len(jcts) == len(jobs)
            assert sum(jcts) / len(jcts) >= bound * (1 - 1e-9), (trace, name, round_s)
