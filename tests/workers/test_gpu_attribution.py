"""Per-job GPU readings: NVML's per-process memory and utilisation (the fake NVML module)
attributed to attempts through real process trees, process groups and (faked /proc) cgroups."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.workers.fake_nvml import NVML_ERROR_NOT_SUPPORTED, FakeGpu, FakeNvml
from workers.gpu.attribution import AttemptProcesses, attribute, owner_of
from workers.gpu.nvml_backend import NvmlBackend


def _children(pid: int, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = Path(f"/proc/{pid}/task/{pid}/children")
        found = [int(x) for x in path.read_text().split()] if path.exists() else []
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"process {pid} started no child")


@pytest.fixture
def job_tree():
    """A job: a shell (its own session and group) whose child ``sleep`` is the GPU process."""
    proc = subprocess.Popen(["sh", "-c", "sleep 30; true"], start_new_session=True)
    try:
        yield proc.pid, _children(proc.pid)[0]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def stranger():
    """Somebody else's GPU process on the same node (not of any attempt)."""
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_child_of_the_job_is_its_memory_and_a_stranger_is_nobodys(job_tree, stranger):
    job_pid, child = job_tree
    fake = FakeNvml(
        [
            FakeGpu(
                memory_used_mb=7000.0,
                processes={child: 5000.0, stranger: 2000.0},
                process_samples=[(child, 10, 70), (child, 20, 90), (stranger, 20, 10)],
            )
        ]
    )
    sample = NvmlBackend(nvml=fake).sample()[0]
    assert sample.process_util_pct == {child: pytest.approx(80.0), stranger: pytest.approx(10.0)}
    attempts = [AttemptProcesses(key=(7, 1), job_pid=job_pid, pgids=())]
    got = attribute(0, sample.process_memory_mb, sample.process_util_pct, attempts)
    assert list(got) == [(7, 1)]
    assert got[(7, 1)].memory_mb == pytest.approx(5000.0)
    assert got[(7, 1)].util_pct == pytest.approx(80.0)
    assert got[(7, 1)].pids == (child,)


def test_utilisation_samples_are_read_once_and_absent_where_unsupported(job_tree):
    job_pid, child = job_tree
    gpu = FakeGpu(processes={child: 100.0}, process_samples=[(child, 5, 40)])
    backend = NvmlBackend(nvml=FakeNvml([gpu]))
    assert backend.sample()[0].process_util_pct == {child: pytest.approx(40.0)}
    # nothing newer since: no utilisation sample, so the job reads 0 % only if others have one
    assert backend.sample()[0].process_util_pct == {}
    gpu.process_samples.append((child, 9, 60))
    assert backend.sample()[0].process_util_pct == {child: pytest.approx(60.0)}
    gpu.unsupported.add("nvmlDeviceGetProcessUtilization")
    sample = backend.sample()[0]
    assert sample.process_util_pct == {}
    got = attribute(0, sample.process_memory_mb, {}, [AttemptProcesses((1, 1), job_pid=job_pid)])
    assert got[(1, 1)].memory_mb == pytest.approx(100.0) and got[(1, 1)].util_pct is None
    assert NVML_ERROR_NOT_SUPPORTED  # the fake answers NOT_SUPPORTED, which is no error


def test_a_process_that_left_the_tree_is_found_by_its_process_group():
    # ``( sleep & )``: the sleep is orphaned (re-parented away from the job) but keeps its group.
    proc = subprocess.Popen(
        ["sh", "-c", "(sleep 30 &); sleep 30"], start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 5
        orphan = None
        while orphan is None and time.monotonic() < deadline:
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) == proc.pid:
                    continue
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                fields = stat[stat.rfind(")") + 2 :].split()
                if int(fields[2]) == proc.pid and int(fields[1]) != proc.pid:
                    orphan = int(entry.name)
            time.sleep(0.02)
        assert orphan is not None, "no orphaned process in the job's group"
        by_group = AttemptProcesses(key="mine", job_pid=None, pgids=(proc.pid,))
        assert owner_of(orphan, [by_group], Path("/proc")) == "mine"
        by_tree_only = AttemptProcesses(key="mine", job_pid=proc.pid, pgids=())
        assert owner_of(orphan, [by_tree_only], Path("/proc")) is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_cgroup_of_the_attempt_claims_its_processes(tmp_path):
    # A container runtime's processes are neither children nor in the job's group: the cgroup
    # the agent made for the attempt says whose they are.
    for pid, group, cgroup in (
        (501, 501, "0::/cosched/m1-job-9-2/ctr\n"),
        (502, 502, "0::/cosched/m1-job-10-1\n"),
        (503, 503, "0::/user.slice\n"),
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(cgroup)
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (python) S 1 {group} {group} 0\n")
    attempts = [
        AttemptProcesses((9, 2), job_pid=900, cgroup="m1-job-9-2"),
        AttemptProcesses((10, 1), job_pid=901, cgroup="m1-job-10-1"),
    ]
    got = attribute(0, {501: 300.0, 502: 200.0, 503: 999.0}, {501: 50.0}, attempts, tmp_path)
    assert {k: (r.memory_mb, r.util_pct) for k, r in got.items()} == {
        (9, 2): (300.0, 50.0),
        (10, 1): (200.0, 0.0),  # the GPU keeps samples, none for it: idle
    }
