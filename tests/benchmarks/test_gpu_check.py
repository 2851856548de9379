"""``make gpu-check`` (benchmarks/gpu_check.py): it skips cleanly without a GPU, and its whole
path runs on a virtual GPU (the dry run: real portal, agent, accounts and device hiding)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[2]


def test_without_an_nvidia_gpu_it_says_why_and_exits_0(tmp_path):
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin", "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "gpu-check: skipped: no nvidia-smi on PATH" in done.stdout


def test_rates_are_measured_over_the_time_two_jobs_ran_together():
    text = "\n".join(f"gpu-check t={100 + t}.000 steps={10 * t}" for t in range(10))
    points = gpu_check.timings(text)
    assert gpu_check.rate_between(points, 103.0, 107.0) == pytest.approx(10.0)
    assert gpu_check.rate_between(points, 200.0, 300.0) is None
    assert gpu_check.own_rate("x\ngpu-check done it_per_s=608.25 steps=12165\n") == 608.25


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the dry run makes a unix account: root only")
def test_the_dry_run_passes_every_check_on_a_virtual_gpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "REDIS_"))}
    env["OUT"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--backend", "virtual", "--seconds", "6"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    table = (tmp_path / "gpu-check.txt").read_text()
    for check in (
        "| solo job ",
        "| pair under time_slicing ",
        "| time limit ",
        "| CPU job on the GPU node opens no GPU ",
        "| per-job readings and observations in the API ",
    ):
        (row,) = [line for line in table.splitlines() if line.startswith(check)]
        assert "| pass " in row, row
