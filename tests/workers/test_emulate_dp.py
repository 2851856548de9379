"""The data-parallel emulator (workers.emulate_dp): its speed model, the virtual GPUs' load board,
and that it runs to the end without Cosched (no token: it is just not rebalanced)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.emulate_dp import LoadBoard, iteration_factor

ROOT = Path(__file__).resolve().parents[2]


def test_alone_on_a_gpu_an_iteration_takes_its_solo_time() -> None:
    assert iteration_factor((10, 0), 1.0, []) == 1.0


def test_sharing_a_gpu_doubles_the_device_phase_only() -> None:
    other = [{"ratio": [10, 0], "u": 1.0}]
    assert iteration_factor((10, 0), 1.0, other) == pytest.approx(2.0)
    # a job with half its time on the host: only the device half is shared
    assert iteration_factor((10, 0), 0.5, other) == pytest.approx(0.5 + 0.5 * 2.0)
    # a co-runner that is busy half the time counts half
    assert iteration_factor((10, 0), 1.0, [{"ratio": [10, 0], "u": 0.5}]) == pytest.approx(1.5)


def test_a_split_waits_for_its_slowest_share() -> None:
    others = [{"ratio": [10, 0], "u": 1.0}, {"ratio": [10, 0], "u": 1.0}]
    # 5/10 on GPU 0 (load 3) and 5/10 on GPU 1 (load 1): max(0.5 * 3, 0.5 * 1) = 1.5
    assert iteration_factor((5, 5), 1.0, others) == pytest.approx(1.5)
    # moving 2 more tenths to the idle GPU: max(0.3 * 3, 0.7 * 1) = 0.9
    assert iteration_factor((3, 7), 1.0, others) == pytest.approx(0.9)


def test_the_board_lists_live_co_runners_only(tmp_path) -> None:
    mine = LoadBoard(str(tmp_path), "1-1", 1.0)
    mine.publish((10, 0))
    (tmp_path / "2-1.json").write_text(json.dumps({"ratio": [0, 10], "u": 1, "pid": os.getpid()}))
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    (tmp_path / "3-1.json").write_text(
        json.dumps({"ratio": [10, 0], "u": 1, "pid": int(dead.stdout)})
    )
    assert [e["ratio"] for e in mine.others()] == [[0, 10]]
    mine.withdraw()
    assert not (tmp_path / "1-1.json").exists()


def test_a_data_parallel_job_without_cosched_runs_to_the_end(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSCHED_")} | {
        "COSCHED_VIRTUAL_GPU_DIR": str(tmp_path),
        "COSCHED_NODE_GPUS": "2",
    }
    argv = [sys.executable, "-m", "workers.emulate", "--profile", "x", "--duration", "0.4"]
    argv += ["--iterations", "8", "--epochs", "2", "--data-parallel", "--tick", "0.02"]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("@cosched start") and "data_parallel=1" in lines[0]
    assert sum(line.startswith("@cosched epoch") for line in lines) == 2
    assert lines[-1].startswith("@cosched done iters=8")
    assert list(tmp_path.iterdir()) == []  # it withdrew its share


def test_the_virtual_backend_reads_utilisation_from_the_ratios(tmp_path) -> None:
    from scheduler.domain import Profile, SharingMode
    from workers.gpu.virtual_backend import VirtualBackend

    backend = VirtualBackend("V100x2", node="n")
    backend.shares_dir = tmp_path
    # job 7 is placed on GPU 0 but its ratio sends 4/10 to GPU 1; its iterations are slowed 1.25x
    backend.attach("7", 0, Profile("p", gpu_util_pct=100), SharingMode.TIME_SLICING)
    backend.attach("8", 1, Profile("q", gpu_util_pct=40), SharingMode.TIME_SLICING)
    entry = {"job": "7", "ratio": [6, 4], "u": 1.0, "factor": 1.25, "pid": os.getpid()}
    (tmp_path / "7-1.json").write_text(json.dumps(entry))
    assert backend.utilisation(0) == pytest.approx(100 * 0.6 / 1.25)
    # GPU 1: job 8 through its placement (40 %, time-sliced with nobody placed there) + job 7
    assert backend.utilisation(1) == pytest.approx(min(100.0, 40.0 + 100 * 0.4 / 1.25))
    (tmp_path / "7-1.json").unlink()
    assert backend.utilisation(0) == pytest.approx(100.0)  # back to its placement
