"""The emulated elastic job (workers/emulate_elastic.py) without a portal: its ranks are real
processes that meet at MASTER_ADDR:MASTER_PORT; rank 0 trains at the curve's throughput times
the slowest rank's speed, checkpoints every window and resumes from the checkpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from workers.emulate_elastic import (
    CHECKPOINT,
    Group,
    Slowness,
    leader,
    parse_curve,
    throughput,
)
from workers.report_lines import parse_report

ROOT = Path(__file__).resolve().parents[2]


def test_curve_parsing_and_interpolation():
    curve = parse_curve("1:10, 2:20,4:30")
    assert curve == {1: 10.0, 2: 20.0, 4: 30.0}
    assert throughput(curve, 3) == pytest.approx(25.0)
    assert throughput(curve, 8) == 30.0  # flat beyond the last count
    for bad in ("", "1-10", "0:5", "2:0", "x:1"):
        with pytest.raises(ValueError):
            parse_curve(bad)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_group(tmp_path: Path, world: int, args: list[str], ranks=None) -> list:
    port = free_port()
    procs = []
    for rank in ranks if ranks is not None else range(world):
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(ROOT),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "COSCHED_GPU": f"n/{rank}",
            "COSCHED_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "workers.emulate_elastic", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def test_a_group_of_three_trains_at_its_slowest_ranks_speed_and_checkpoints(tmp_path):
    args = ["--curve", "1:100,3:300", "--steps", "60", "--warmup-s", "0"]
    args += ["--slow-gpu", "n/2", "--slow-factor", "0.5"]
    procs = start_group(tmp_path, 3, args)
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    lines = [parse_report(line) for line in outs[0][0].splitlines()]
    group = next(r for r in lines if r.event == "elastic")
    assert group.get("workers") == 3 and group.get("gpus") == "n/0,n/1,n/2"
    progress = [r for r in lines if r.event == "progress"]
    assert len(progress) == 6 and {r.get("slowest") for r in progress} == {0.5}
    # 60 steps at 300 steps/s x 0.5 (the slow rank holds the group back)
    assert progress[-1].get("elapsed_s") == pytest.approx(60 / 150, rel=1e-6)
    saved = json.loads((tmp_path / "ckpt" / CHECKPOINT).read_text())
    assert saved["done"] == 60
    assert outs[1][0] == outs[2][0] == ""  # only rank 0 reports


def test_rank_0_waits_for_every_rank_and_says_who_is_missing(tmp_path):
    args = ["--curve", "1:100", "--steps", "10", "--rendezvous-timeout-s", "1"]
    procs = start_group(tmp_path, 3, args, ranks=[0, 1])  # rank 2 never starts
    outs = [p.communicate(timeout=60) for p in procs]
    assert procs[0].returncode == 3
    assert "ranks [2] did not join" in outs[0][1]
    assert not (tmp_path / "ckpt" / CHECKPOINT).exists()  # it never trained


def test_a_new_group_resumes_from_the_checkpoint(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / CHECKPOINT).write_text(json.dumps({"done": 40, "elapsed_s": 2.0}))
    procs = start_group(tmp_path, 2, ["--curve", "2:200", "--steps", "60", "--warmup-s", "0"])
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    lines = [parse_report(line) for line in outs[0][0].splitlines()]
    assert lines[0].event == "start" and lines[0].get("resumed") == 40
    assert [r.get("iter") for r in lines if r.event == "progress"] == [50, 60]


class Scripted:
    """Answers the windows with a fixed script of replies and keeps what it was sent."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen = []

    def report_window(self, workers, batches, seconds, rank_rates, remaining, checkpointed=False):
        self.seen.append((workers, tuple(rank_rates), checkpointed))
        return self.replies.pop(0) if self.replies else None


def test_every_window_is_a_checkpointed_safe_point_and_a_regroup_ends_the_attempt(tmp_path):
    group = Group(0, 1, "127.0.0.1", 0, "n/0", tmp_path, 1)
    client = Scripted([{"workers": 1}, {"workers": 2, "regroup": True, "attempt": 2}])
    lines: list[str] = []
    slept: list[float] = []
    code = leader(
        group,
        {1: 10.0},
        200,
        Slowness(),
        client,
        warmup_s=0.5,
        timeout_s=1,
        sleep=slept.append,
        emit=lines.append,
    )
    # regrouped after the second window: it waits to be stopped (and gives up after 300 s)
    assert code == 3 and sum(slept) == pytest.approx(0.5 + 2 * 1.0 + 300)
    assert client.seen == [(1, (1.0,), True), (1, (1.0,), True)]
    assert json.loads((tmp_path / CHECKPOINT).read_text())["done"] == 20
    assert parse_report(lines[-1]).get("change") == "regroup_to_2"
