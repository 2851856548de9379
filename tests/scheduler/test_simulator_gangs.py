"""The simulator's gangs (jobs spread over nodes) and admission (jobs rejected at arrival).
Expected values follow from the execution model (docs/simulator.md), not from output."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from scheduler.domain import UNCONSOLIDATED_SPEED, Decision, Placement, PlacementPart, Plan
from scheduler.policies.registry import build_policy
from scheduler.simulator import EndReason, SimConfig, simulate
from scheduler.traces import GAVEL_SOLO_CSV, read_gavel_trace
from tests.scheduler.sim_helpers import Scripted, cluster, job

TWO_BY_4 = cluster({"name": "n", "count": 2, "gpu_model": "V100", "gpus_per_node": 4, "cpus": 4})


def records(result):
    return {r.job_id: r for r in result.jobs}


def spread_job(job_id: str, solo: float, spread: float | None, *, arrival: float = 0.0):
    spec = job(job_id, solo, gpus=8, arrival=arrival)
    if spread is not None:
        profile = dataclasses.replace(spec.profile, gpu_time_unconsolidated_s={"V100": spread})
        spec = dataclasses.replace(spec, profile=profile)
    return dataclasses.replace(spec, cpus=4)


def gang_on_both(job_id: str) -> Placement:
    return Placement(
        job_id, "n-0", (0, 1, 2, 3), cpus=4, more=(PlacementPart("n-1", (0, 1, 2, 3), 4),)
    )


def place_in_order(state, rng):
    """Each pending 8-GPU job on both nodes when they are free."""
    if state.running or not state.pending:
        return Plan()
    return Plan(decisions=(Decision(gang_on_both(state.pending[0].id), "t", "both"),))


def test_a_gang_runs_at_its_measured_unconsolidated_speed_and_frees_every_part():
    jobs = [spread_job("a", 100.0, 250.0), spread_job("b", 100.0, 250.0, arrival=10.0)]
    recs = records(simulate(TWO_BY_4, jobs, Scripted(place_in_order)))
    a, b = recs["a"], recs["b"]
    assert a.finish_s == pytest.approx(250.0)
    # b needs every GPU and core of both nodes: it starts when a has released all of them.
    assert b.start_s == pytest.approx(250.0) and b.finish_s == pytest.approx(500.0)
    assert a.nodes == 2 and a.location == "n-0/0,1,2,3+n-1/0,1,2,3"
    assert a.solo_s == 100.0 and a.slowdown == pytest.approx(2.5)  # one-node solo time


def test_a_gang_without_a_measured_time_runs_at_the_configured_speed():
    jobs = [spread_job("a", 100.0, None)]
    default = records(simulate(TWO_BY_4, jobs, Scripted(place_in_order)))["a"]
    assert default.finish_s == pytest.approx(100.0 / UNCONSOLIDATED_SPEED)
    half = simulate(
        TWO_BY_4, jobs, Scripted(place_in_order), config=SimConfig(unconsolidated_speed=0.5)
    )
    assert records(half)["a"].finish_s == pytest.approx(200.0)


def test_unconsolidated_speed_must_be_positive():
    with pytest.raises(ValueError, match="unconsolidated_speed"):
        SimConfig(unconsolidated_speed=0.0)


def test_gavel_loader_reads_the_unconsolidated_rows(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,job_type,arrival_time_s,total_steps,scale_factor\n"
        "0,ResNet-50 (batch size 64),0,100000,8\n"
        "1,ResNet-50 (batch size 64),0,100000,1\n"
    )
    eight, one = read_gavel_trace(trace)
    with open(GAVEL_SOLO_CSV) as f:
        rows = {
            (r["gpu_type"], r["scale_factor"]): float(r["throughput"])
            for r in csv.DictReader(f)
            if r["job_type"] == "ResNet-50 (batch size 64)"
        }
    assert eight.profile.gpu_time_s["V100"] == pytest.approx(100000 / rows[("v100", "8")])
    assert eight.profile.gpu_time_unconsolidated_s["V100"] == pytest.approx(
        100000 / rows[("v100_unconsolidated", "8")]
    )
    assert one.profile.gpu_time_unconsolidated_s == {}  # a 1-GPU job is never spread


def test_a_job_that_can_never_run_is_rejected_at_arrival_and_blocks_nobody():
    jobs = [
        job("huge", 10.0, gpus=20, arrival=5.0),  # 8 V100 in the whole cluster
        job("k80", 10.0, model="K80", arrival=6.0),  # no K80 here
        job("next", 10.0, arrival=7.0),
    ]
    result = simulate(TWO_BY_4, jobs, build_policy("fifo"))  # strict queue order
    recs = records(result)
    assert recs["huge"].end_reason == EndReason.REJECTED == "rejected"
    assert recs["huge"].end_s == 5.0 and recs["huge"].start_s is None
    assert recs["huge"].explanation == (
        "rejected at arrival: gpus: asks 20 GPUs of one model; at most 8 exist (V100: 8)"
    )
    assert recs["k80"].end_reason == "rejected" and "profile" in recs["k80"].explanation
    assert recs["next"].start_s == 7.0 and recs["next"].end_reason == "completed"


@pytest.mark.parametrize(
    "name", ["fifo", "binpack", "random", "placement_rate", "all_gpu+exec_plan"]
)
def test_policies_run_gangs_to_completion_in_the_simulator(name):
    clus = cluster(
        {"name": "v", "count": 3, "gpu_model": "V100", "gpus_per_node": 4, "cpus": 8},
        {"name": "k", "count": 3, "gpu_model": "K80", "gpus_per_node": 4, "cpus": 8},
    )
    jobs = [job(f"s{i}", 50.0 + i, arrival=float(i)) for i in range(6)]
    jobs += [job(f"g{i}", 200.0, gpus=8, arrival=3.0 + i) for i in range(3)]
    jobs += [job("wide", 100.0, gpus=12, arrival=4.5)]
    recs = records(simulate(clus, sorted(jobs, key=lambda j: j.arrival_s), build_policy(name)))
    assert all(r.end_reason == "completed" for r in recs.values()), {
        r.job_id: r.end_reason for r in recs.values()
    }
    for g in ("g0", "g1", "g2", "wide"):  # larger than a node: spread, over one model
        assert recs[g].nodes >= 2 and recs[g].gpu_model in ("V100", "K80"), recs[g].location
        assert sum(len(p.split("/")[1].split(",")) for p in recs[g].location.split("+")) == (
            12 if g == "wide" else 8
        )
