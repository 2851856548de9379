"""The job emulator, run as a real process (``python -m workers.emulate``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.emulate import EmulatorError, build_parser, plan_run
from workers.report_lines import parse_report
from workers.slowdown import live_slowdown

ROOT = Path(__file__).resolve().parents[2]

LAMMPS = {
    "name": "lammps",
    "kind": "hpc",
    "cpu_time_s": 990,
    "gpu_time_s": {"V100": 50.0},
    "gpu_util_pct": 60,
    "memory_steps": [[0, 0, 833], [0.25, 833, 1895], [0.5, 1895, 2795], [0.75, 2795, 8317]],
}


def emulator(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("COSCHED_", "CUDA_"))}
    return subprocess.Popen(
        [sys.executable, "-m", "workers.emulate", *args],
        cwd=ROOT,
        env={**base, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def run_emulator(*args: str, env: dict[str, str] | None = None, timeout: float = 15):
    proc = emulator(*args, env=env)
    out, err = proc.communicate(timeout=timeout)
    reports = [r for r in map(parse_report, out.splitlines()) if r is not None]
    return proc.returncode, reports, err


def events(reports, name):
    return [r for r in reports if r.event == name]


def plan(*args: str, env: dict[str, str] | None = None):
    return plan_run(build_parser().parse_args(["--profile", "lammps", *args]), env or {})


def test_runs_walks_the_memory_steps_and_exits_0():
    code, reports, err = run_emulator(
        "--profile",
        "demo",
        "--duration",
        "0.6",
        "--report-every",
        "0.05",
        "--iterations",
        "20",
        "--epochs",
        "2",
        "--steps-json",
        "[[0, 0, 100], [0.5, 100, 300]]",
    )
    assert code == 0, err
    assert reports[0].event == "start"
    assert reports[0].get("run_s") == pytest.approx(0.6) and reports[0].get("iters") == 20
    progress = events(reports, "progress")
    fractions = [r.get("fraction") for r in progress]
    assert fractions == sorted(fractions) and fractions[0] == 0 and fractions[-1] == 1
    assert len(progress) >= 8
    assert {r.get("step") for r in progress} == {1, 2}
    assert progress[-1].get("mem_mb") == 300 and progress[-1].get("iter") == 20
    for r in progress[1:]:  # memory is the step's line at that fraction
        f = r.get("fraction")
        expected = 200 * f if f < 0.5 else 100 + 400 * (f - 0.5)
        assert r.get("mem_mb") == pytest.approx(expected, abs=0.2)
    assert [r.get("epoch") for r in events(reports, "epoch")] == [1, 2]
    assert events(reports, "epoch")[0].get("iter") == 10
    (done,) = events(reports, "done")
    assert done.get("active_s") == pytest.approx(0.6, abs=0.1)
    assert reports[-1].event == "done"


def test_profile_file_scale_and_gpu_model(tmp_path):
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"lammps": LAMMPS}))
    code, reports, err = run_emulator(
        "--profile", "lammps", "--profile-file", str(path), "--gpu-model", "v100", "--scale", "0.01"
    )
    assert code == 0, err
    start = reports[0]
    assert (start.get("gpu_model"), start.get("solo_s"), start.get("run_s")) == ("V100", 50, 0.5)
    assert start.get("steps") == 4
    assert events(reports, "progress")[-1].get("mem_mb") == 8317


def test_profile_and_model_from_the_environment():
    p = plan(
        "--scale",
        "0.1",
        env={"COSCHED_PROFILE_JSON": json.dumps([LAMMPS]), "COSCHED_GPU_MODEL": "V100"},
    )
    assert (p.gpu_model, p.solo_s, p.run_s) == ("V100", 50.0, pytest.approx(5.0))
    assert len(p.profile.memory_steps) == 4


def test_cpu_placement_uses_the_cpu_time():
    env = {"COSCHED_PROFILE_JSON": json.dumps(LAMMPS), "CUDA_VISIBLE_DEVICES": ""}
    p = plan("--scale", "0.001", env=env)
    assert p.gpu_model is None and p.solo_s == 990 and p.run_s == pytest.approx(0.99)


def test_duration_is_the_fallback_not_scaled():
    env = {"COSCHED_PROFILE_JSON": json.dumps(LAMMPS)}
    p = plan("--gpu-model", "T4", "--duration", "3", "--scale", "0.1", env=env)
    assert (p.solo_s, p.run_s) == (None, 3.0)
    with pytest.raises(EmulatorError, match="no solo time for GPU model T4; pass --duration"):
        plan("--gpu-model", "T4", env=env)
    with pytest.raises(EmulatorError, match="not in the profile document"):
        plan_run(build_parser().parse_args(["--profile", "gromacs", "--duration", "1"]), env)


def test_profile_errors_exit_2():
    code, reports, err = run_emulator("--profile", "x")
    assert code == 2 and reports == []
    assert "pass --duration" in err
    code, _, err = run_emulator("--profile", "x", "--duration", "1", "--steps-json", "[[2, 0, 1]]")
    assert code == 2 and "0..1" in err


def test_fail_at_exits_with_the_exit_code():
    code, reports, err = run_emulator(
        "--profile", "x", "--duration", "0.6", "--fail-at", "0.5", "--exit-code", "7"
    )
    assert code == 7
    (fail,) = events(reports, "fail")
    assert 0.5 <= fail.get("fraction") < 0.65 and fail.get("exit_code") == 7
    assert events(reports, "done") == []
    assert "emulated failure of x at 5" in err


def test_fail_as_gpu_oom_prints_the_message_the_portal_recognises():
    from portal.core.oom import gpu_oom_line  # the portal reads the job's log tail with it

    code, _, err = run_emulator(
        "--profile", "x", "--duration", "0.4", "--fail-at", "0.5", "--fail-as", "gpu-oom"
    )
    assert code == 1
    line = gpu_oom_line(err)
    assert line is not None and line.startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert (
        gpu_oom_line(run_emulator("--profile", "x", "--duration", "0.4", "--fail-at", "0.5")[2])
        is None
    )


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Wait until process ``pid`` is stopped (state T in /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                return
        except OSError:
            break
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


def read_until(proc: subprocess.Popen[str], predicate, timeout: float = 10.0) -> list:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        report = parse_report(line)
        if report is not None:
            seen.append(report)
            if predicate(report):
                return seen
    raise AssertionError(f"condition not met; saw {seen}")


def test_sigstop_does_not_make_progress_jump():
    proc = emulator("--profile", "x", "--duration", "1.2", "--report-every", "0.05")
    try:
        before = read_until(proc, lambda r: r.event == "progress" and r.get("fraction") >= 0.2)
        proc.send_signal(signal.SIGSTOP)
        wait_stopped(proc.pid)
        time.sleep(1.0)  # the stop itself: a second not working
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0
    after = [r for r in map(parse_report, out.splitlines()) if r is not None]
    progress = [r for r in before + after if r.event == "progress"]
    fractions = [r.get("fraction") for r in progress]
    jumps = [b - a for a, b in zip(fractions, fractions[1:], strict=False)]
    assert max(jumps) < 0.15  # one report is ~0.05 s of work = 0.04; a counted stop would be 0.8
    (done,) = events(after, "done")
    assert done.get("active_s") == pytest.approx(1.2, abs=0.15)
    assert done.get("elapsed_s") >= 2.1  # the stop happened, and was not counted as work
    stalled = [r for r in progress if r.get("elapsed_s") - r.get("active_s") > 0.8]
    assert stalled and stalled[0].get("fraction") < 0.5


def test_sigterm_exits_143_with_a_term_line():
    proc = emulator("--profile", "x", "--duration", "30", "--report-every", "0.05")
    try:
        read_until(proc, lambda r: r.event == "progress" and r.get("fraction") > 0)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=5)
    finally:
        proc.kill()
    assert proc.returncode == 143
    (term,) = [r for r in map(parse_report, out.splitlines()) if r and r.event == "term"]
    assert term.get("signal") == "SIGTERM" and term.get("exit_code") == 143
    assert term.get("fraction") < 0.1


def test_an_uncontended_jobs_live_slowdown_stays_near_1():
    """ALGORITHMS.md §5: SD = (elapsed + iters_left * iter_time) / solo_time, with iter_time the
    mean over the current epoch. Default 100 iterations of 0.3 s and a report every 0.4 s: one
    or two iterations end per report, so a per-report iteration time made SD jump 0.67..1.67."""
    proc = emulator("--profile", "x", "--duration", "30", "--report-every", "0.4")
    progress_seen = []

    def enough(report) -> bool:
        if report.event == "progress":
            progress_seen.append(report)
        return len(progress_seen) >= 8

    try:
        first = read_until(proc, enough, timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    reports = first + [r for r in map(parse_report, out.splitlines()) if r is not None]
    run_s = reports[0].get("run_s")
    assert run_s == 30 and reports[0].get("iters") == 100, err
    sds = [
        live_slowdown(
            r.get("elapsed_s"),
            0.0,
            run_s,
            progress=r.get("fraction"),
            iters_done=r.get("iter"),
            iters_total=r.get("iters"),
            iter_time_s=r.get("iter_time_s"),
            active_s=r.get("active_s"),
        )
        for r in events(reports, "progress")[1:]
    ]
    assert len(sds) >= 6
    assert all(0.8 <= sd <= 1.25 for sd in sds), sds
