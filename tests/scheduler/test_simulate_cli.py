"""The command line, run as a subprocess like a user would."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
GAVEL_HEADER = "job_id,job_type,arrival_time_s,total_steps,scale_factor\n"
CLUSTER = """\
nodes:
  - {name: v, count: 1, gpu_model: V100, gpus_per_node: 2, cpus: 8}
  - {name: k, count: 1, gpu_model: K80, gpus_per_node: 2, cpus: 8}
"""


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scheduler.simulate", "--quiet", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def small_inputs(tmp_path):
    rows = [
        f"{i},{t},{i * 30.0},{steps},1"
        for i, (t, steps) in enumerate(
            [
                ("ResNet-18 (batch size 32)", 20000),
                ("A3C", 5000),
                ("LM (batch size 20)", 3000),
                ("Transformer (batch size 64)", 4000),
                ("CycleGAN", 2000),
                ("A3C", 8000),
            ]
        )
    ]
    trace = tmp_path / "trace.csv"
    trace.write_text(GAVEL_HEADER + "\n".join(rows) + "\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    return trace, cluster


def test_trace_run_writes_consistent_csvs_and_an_offline_report(small_inputs, tmp_path):
    trace, cluster = small_inputs
    out = tmp_path / "out"
    proc = run_cli(
        "--trace",
        str(trace),
        "--cluster",
        str(cluster),
        "--policy",
        "fifo",
        "--policy",
        "random",
        "--interference",
        "none",
        "--seed",
        "3",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    summary = pd.read_csv(out / "summary.csv")
    jobs = pd.read_csv(out / "jobs.csv")
    for col in (
        "policy",
        "jobs",
        "completed",
        "avg_jct_s",
        "makespan_s",
        "gpu_util",
        "max_slowdown",
        "oom_count",
        "decision_ms_p50",
    ):
        assert col in summary.columns
    assert list(summary["policy"]) == ["fifo", "random"]
    assert len(jobs) == 2 * 6
    for policy, group in jobs.groupby("policy"):
        row = summary[summary["policy"] == policy].iloc[0]
        done = group[group["end_reason"] == "completed"]
        assert row["jobs"] == len(group)
        assert row["completed"] == len(done)
        assert row["avg_jct_s"] == pytest.approx(done["jct_s"].mean())
        assert row["makespan_s"] == pytest.approx(done["finish_s"].max() - done["arrival_s"].min())
        assert group["explanation"].notna().all()
        assert (done["jct_s"] >= done["solo_s"] - 1e-6).all()
    for policy in ("fifo", "random"):
        assert policy in proc.stdout
    html = (out / "report.html").read_text()
    external = re.findall(r"<script[^>]*\bsrc=|<link[^>]*\bhref=\"?https?:", html)
    assert external == []  # nothing loaded from the network
    assert len(html) > 1_000_000  # plotly.js is inline
    for title in ("Job completion time", "GPU utilisation", "Slow-Down", "Queue length"):
        assert title in html


def test_an_incomplete_run_is_marked_in_the_table_csv_and_report(tmp_path):
    out = tmp_path / "cut"
    proc = run_cli(
        "--scenario", "physical96", "--policy", "fifo", "--max-time", "50000", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    assert "INCOMPLETE fifo:" in proc.stdout and "unfinished" in proc.stdout
    assert "ranking: no complete run to rank" in proc.stdout
    summary = pd.read_csv(out / "summary.csv", keep_default_na=False)
    row = summary.iloc[0]
    assert row["status"].startswith("incomplete:") and row["unfinished"] > 0
    assert row["avg_jct_s"] == "" and row["makespan_s"] == ""  # empty cells, not figures
    html = (out / "report.html").read_text()
    assert 'class="incomplete">INCOMPLETE fifo:' in html


def test_scenario_run_and_listing(tmp_path):
    listing = run_cli("--list-scenarios")
    assert listing.returncode == 0
    for name in ("philly", "physical96", "seed004", "coscheml003", "sharing001", "slowdown000"):
        assert name in listing.stdout
    out = tmp_path / "seed"
    proc = run_cli("--scenario", "seed004", "--policy", "fifo", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(out / "summary.csv")
    assert summary.loc[0, "jobs"] == 25 and summary.loc[0, "completed"] == 25
    assert summary.loc[0, "status"] == "complete"
    assert "ranking by avg JCT (complete runs only): 1. fifo" in proc.stdout
    jobs = pd.read_csv(out / "jobs.csv")
    assert set(jobs["gpu_model"]) == {"TitanXp"}
    assert (out / "report.html").exists()


@pytest.mark.parametrize(
    ("trace_text", "words"),
    [
        (GAVEL_HEADER + "0,A3C,0,10,1\n1,Nope,5,10,1\n", "trace.csv:3: field 'job_type'"),
        ("job_id,job_type\n1,A3C\n", "not a known trace format"),
        (GAVEL_HEADER + "0,A3C,soon,10,1\n", "field 'arrival_time_s'"),
    ],
)
def test_bad_trace_is_one_readable_line_and_exit_2(tmp_path, trace_text, words):
    trace = tmp_path / "trace.csv"
    trace.write_text(trace_text)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(CLUSTER)
    proc = run_cli("--trace", str(trace), "--cluster", str(cluster))
    assert proc.returncode == 2
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_cluster_policy_and_scenario_names_exit_2(small_inputs, tmp_path):
    trace, _ = small_inputs
    bad = tmp_path / "c.yaml"
    bad.write_text("nodes:\n  - {name: a, gpu_model: Z80}\n")
    proc = run_cli("--trace", str(trace), "--cluster", str(bad))
    assert proc.returncode == 2 and "c.yaml:2: field 'nodes[0].gpu_model'" in proc.stderr
    proc = run_cli("--scenario", "seed004", "--policy", "nonesuch")
    assert proc.returncode == 2 and "unknown policy" in proc.stderr
    proc = run_cli("--scenario", "nonesuch")
    assert proc.returncode == 2 and "unknown scenario" in proc.stderr
    proc = run_cli("--trace", str(trace))
    assert proc.returncode == 2 and "--cluster" in proc.stderr
