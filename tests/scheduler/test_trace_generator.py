"""The Gavel-settings trace generator and the philly_multigpu scenario built from it."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler import trace_generator as gen
from scheduler.policies.registry import build_policy
from scheduler.scenarios import SCENARIO_DIR, load_scenario
from scheduler.simulator import simulate
from scheduler.traces import load_solo_throughputs, main, read_trace

ROOT = Path(__file__).resolve().parents[2]
VENDORED = SCENARIO_DIR / "traces" / "gavel_multigpu_500jobs_seed0.csv"


def test_same_seed_same_bytes_and_the_vendored_trace_is_reproducible(tmp_path):
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    gen.write_gavel_trace(gen.generate_jobs(500, multi_gpu=True, seed=0), a)
    gen.write_gavel_trace(gen.generate_jobs(500, multi_gpu=True, seed=0), b)
    gen.write_gavel_trace(gen.generate_jobs(500, multi_gpu=True, seed=1), c)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    # The scenario's trace is exactly what the documented command writes.
    assert a.read_bytes() == VENDORED.read_bytes()


def test_draws_follow_gavels_settings():
    jobs = gen.generate_jobs(6000, multi_gpu=True, seed=3, jobs_per_hour=2.0)
    n = len(jobs)
    for scale, p in gen.SCALE_FACTORS:
        share = sum(1 for j in jobs if j.scale_factor == scale) / n
        assert abs(share - p) < 0.02, (scale, share)
    long = [j for j in jobs if j.duration_v100_s > 60 * 10**3]
    assert abs(len(long) / n - 0.2) < 0.02  # 20 % drawn from 10**U(3, 4) minutes
    assert all(60 * 10**1.5 <= j.duration_v100_s <= 60 * 10**4 for j in jobs)
    table = load_solo_throughputs()
    for j in jobs:
        v100 = table[(j.job_type, j.scale_factor)]["V100"]
        assert j.total_steps == max(1, round(j.duration_v100_s * v100))
    multi_types = {j.job_type.split(" (")[0] for j in jobs if j.scale_factor > 1}
    assert multi_types == {"ResNet-18", "ResNet-50", "Transformer", "LM"}
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(jobs, jobs[1:], strict=False)]
    assert jobs[0].arrival_s == 0.0
    assert statistics.mean(gaps) == pytest.approx(1800.0, rel=0.05)  # 2 jobs an hour


def test_without_multi_gpu_every_job_asks_one_gpu():
    assert {j.scale_factor for j in gen.generate_jobs(300, seed=0)} == {1}


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="jobs_per_hour"):
        gen.generate_jobs(3, jobs_per_hour=0)
    with pytest.raises(ValueError, match="jobs_per_hour"):
        gen.generate_jobs(3, jobs_per_hour=math.inf)


def test_command_line_generate_and_describe(tmp_path, capsys):
    out = tmp_path / "t.csv"
    assert main(["generate", "--jobs", "40", "--multi-gpu", "--seed", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}: 40 jobs (")
    jobs = read_trace(out)
    assert len(jobs) == 40 and {j.gpus for j in jobs} <= {1, 2, 4, 8}
    assert main(["describe", str(out)]) == 0
    assert "40 jobs" in capsys.readouterr().out
    assert main(["generate", "--jobs", "3", "--jobs-per-hour", "-1", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: jobs_per_hour must be")


def test_module_runs_as_documented(tmp_path):
    out = tmp_path / "t.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.traces", "generate", "--jobs", "5", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(read_trace(out)) == 5


def test_philly_multigpu_scenario_has_gangs_and_fifo_runs_them_in_order():
    sc = load_scenario("philly_multigpu")
    assert len(sc.jobs) == 500 and sum(1 for j in sc.jobs if j.gpus == 8) == 21
    assert {n.gpu_count for n in sc.cluster.nodes} == {4} and len(sc.cluster.nodes) == 9
    eights = [j for j in sc.jobs if j.gpus == 8]
    assert all(j.profile.gpu_time_unconsolidated_s for j in eights)
    # The first 120 jobs (a few gangs among them) under strict FIFO: all complete, and no job
    # starts before one that arrived earlier (strict order, no job blocked for ever).
    jobs = list(sc.jobs[:120])
    result = simulate(sc.cluster, jobs, build_policy("fifo"), config=sc.config)
    records = sorted(result.jobs, key=lambda r: (r.arrival_s, int(r.job_id)))
    assert all(r.end_reason == "completed" for r in records)
    assert any(r.nodes == 2 for r in records)
    starts = [r.start_s for r in records]
    assert starts == sorted(starts)
