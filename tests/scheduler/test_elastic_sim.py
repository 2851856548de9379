"""The elastic job simulator (scheduler/simulator/elastic.py) and scenario elastic002."""

from __future__ import annotations

import csv

import pytest

from scheduler import elastic as en
from scheduler.scenarios.elastic002 import run_elastic002, summarize_elastic002
from scheduler.simulator.elastic import (
    GAVEL_THROUGHPUTS,
    ElasticSimConfig,
    ScalingCurve,
    StragglerFaults,
    load_curves,
    simulate_elastic,
)

ENGINE = en.ElasticConfig(scale_step_workers=2, scale_interval_batches=50)
# linear up to 4 workers, flat beyond: the engine should settle on 4
KNEE = ScalingCurve(
    "knee",
    "x",
    {1: 10.0, 2: 20.0, 4: 40.0, 8: 41.0},
    {1: 10.0, 2: 20.0, 4: 40.0, 8: 41.0},
)


def config(**kw) -> ElasticSimConfig:
    base = {
        "total_steps": 10.0 * 7200,
        "start_workers": 2,
        "job": en.ElasticJob(1, 8),
        "engine": ENGINE,
        "noise_sd": 0.0,
    }
    base.update(kw)
    return ElasticSimConfig(**base)


def test_curves_are_gavels_measurements():
    curves = load_curves()
    assert len(curves) == 55
    with open(GAVEL_THROUGHPUTS, newline="") as fh:
        rows = {
            (r["job_type"], r["gpu_type"], int(r["scale_factor"])): float(r["throughput"])
            for r in csv.DictReader(fh)
        }
    for c in curves:
        for w in (1, 2, 4, 8):
            assert c.consolidated[w] == rows[(c.job_type, c.gpu_type, w)]
        assert c.unconsolidated[8] == rows[(c.job_type, c.gpu_type + "_unconsolidated", 8)]


def test_throughput_is_consolidated_within_a_node_and_interpolated_between_measurements():
    c = ScalingCurve("t", "x", {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}, {1: 1.0, 2: 1.5, 4: 2.0, 8: 6.0})
    assert c.throughput(4, gpus_per_node=8) == 4.0
    assert c.throughput(4, gpus_per_node=2) == 2.0  # crosses machines
    assert c.throughput(6, gpus_per_node=8) == pytest.approx(6.0)
    assert c.throughput(6, gpus_per_node=2) == pytest.approx(4.0)
    assert not c.measured(6, 8) and c.measured(8, 2)
    with pytest.raises(ValueError):
        c.throughput(9, 8)


def test_a_static_run_takes_warm_up_plus_work_over_throughput():
    run = simulate_elastic(KNEE, config(static=4, warmup_s=60.0))
    assert run.completion_s == pytest.approx(60.0 + 72000.0 / 40.0)
    assert run.gpu_s == pytest.approx(4 * run.completion_s)
    assert run.changes == [] and run.final_workers == 4 and run.completed


def test_elastic_settles_at_the_knee_and_saves_gpu_time_over_an_over_allocation():
    run = simulate_elastic(KNEE, config())
    assert run.final_workers == 4
    static8 = simulate_elastic(KNEE, config(static=8))
    static1 = simulate_elastic(KNEE, config(static=1))
    assert run.gpu_s < 0.7 * static8.gpu_s
    assert run.completion_s < 0.5 * static1.completion_s
    ups = [c for c in run.scale_changes if c.workers_to > c.workers_from]
    assert ups and all(c.effective_s - c.decided_s >= 60.0 for c in ups)  # warm-up first
    assert any("S=" in c.reason for c in run.scale_changes)


def test_recovery_from_an_over_allocation():
    run = simulate_elastic(KNEE, config(start_workers=8))
    assert run.final_workers == 4
    assert [c.workers_to for c in run.scale_changes][:2] == [6, 4]
    assert 0 < run.settled_s < 600  # minutes, not the job's two hours


def test_straggler_replacement_beats_keeping_the_straggler_and_is_seeded():
    faults = StragglerFaults(persistent_per_hour=1.0, slow_factor=0.5)
    held = en.ElasticJob(4, 4)
    static = simulate_elastic(KNEE, config(static=4, faults=faults, seed=3))
    fixed = simulate_elastic(KNEE, config(start_workers=4, job=held, faults=faults, seed=3))
    assert static.persistent_stragglers >= 1
    replaced = [c for c in fixed.changes if c.kind == "replace"]
    assert replaced and all("straggler" in c.reason for c in replaced)
    assert fixed.completion_s < 0.9 * static.completion_s
    again = simulate_elastic(KNEE, config(start_workers=4, job=held, faults=faults, seed=3))
    assert (again.completion_s, again.gpu_s) == (fixed.completion_s, fixed.gpu_s)


def test_transient_slow_windows_are_not_replaced():
    faults = StragglerFaults(transient_per_hour=30.0, transient_factor=0.6)
    run = simulate_elastic(KNEE, config(start_workers=4, job=en.ElasticJob(4, 4), faults=faults))
    assert not [c for c in run.changes if c.kind == "replace"]


def test_scenario_elastic002_on_two_curves():
    curves = [c for c in load_curves() if c.gpu_type == "v100"][:2]
    runs = run_elastic002(curves=curves)
    assert runs.completed.all()
    # 2 curves x 2 layouts x (clean: 4 static + 4 elastic; faults: 4 static + elastic + 3)
    assert len(runs) == 2 * 2 * (8 + 8)
    summary = summarize_elastic002(runs)
    assert "paper" in set(summary.layout)
    assert "runs that did not complete" not in set(summary.comparison)
