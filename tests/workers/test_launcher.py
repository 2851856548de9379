"""Launching and controlling job processes: real subprocesses, real signals."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from scheduler.domain import Placement, SharingMode
from workers.launcher import (
    JobProcess,
    LaunchError,
    ProcessState,
    build_env,
    docker_control_argv,
    docker_run_argv,
    exit_to_state,
    job_env,
    new_reports,
    read_new_lines,
    tail,
)

ROOT = Path(__file__).resolve().parents[2]
PY = shlex.quote(sys.executable)

EXCLUSIVE = Placement("j7", "gpu-1", (0, 2))
MPS = Placement("j8", "gpu-1", (1,), SharingMode.MPS, mps_percentage=40)
MIG = Placement("j9", "gpu-2", (0,), SharingMode.MIG, mig_profile="1g.6gb")
CPU = Placement("j10", "cpu-1")


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def proc_state(pid: int) -> str:
    """The one-letter state in /proc/<pid>/stat (R, S, T, Z, ...), "gone" if none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


# --- environment ------------------------------------------------------------------------------


def test_exclusive_gpus_are_visible_by_pci_index():
    env = build_env(EXCLUSIVE, {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "5", "COSCHED_X": "1"})
    assert env["PATH"] == "/bin"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["COSCHED_JOB_ID"] == "j7" and env["COSCHED_NODE"] == "gpu-1"
    assert env["COSCHED_GPU_INDICES"] == "0,2" and env["COSCHED_SHARING_MODE"] == "exclusive"
    assert "COSCHED_X" not in env
    assert not any(k.startswith("CUDA_MPS_") for k in env)


def test_mps_sets_pipe_log_and_thread_percentage():
    base = {"CUDA_MPS_PIPE_DIRECTORY": "/agent/own", "HOME": "/root"}
    env = build_env(MPS, base, mps_pipe_dir="/run/mps/1", mps_log_dir=Path("/var/log/mps/1"))
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps/1"
    assert env["CUDA_MPS_LOG_DIRECTORY"] == "/var/log/mps/1"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert env["COSCHED_SHARING_MODE"] == "mps" and env["HOME"] == "/root"
    with pytest.raises(LaunchError, match="not in 1..100"):
        job_env(Placement("j", "n", (0,), SharingMode.MPS, mps_percentage=0))


def test_mig_uses_the_instance_uuid():
    env = job_env(MIG, mig_uuid="MIG-4a5b", gpu_model="A30")
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-4a5b"
    assert env["COSCHED_MIG_PROFILE"] == "1g.6gb" and env["COSCHED_GPU_MODEL"] == "A30"
    assert "CUDA_DEVICE_ORDER" not in env
    with pytest.raises(LaunchError, match="needs the instance UUID"):
        job_env(MIG)


def test_cpu_jobs_see_no_gpu():
    env = job_env(CPU, gpu_model="V100", extra={"OMP_NUM_THREADS": "4"})
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["COSCHED_SHARING_MODE"] == "cpu" and "COSCHED_GPU_MODEL" not in env
    assert env["OMP_NUM_THREADS"] == "4"


def test_the_process_really_gets_the_environment(tmp_path):
    env = build_env(MPS, mps_pipe_dir=str(tmp_path / "pipe"))
    log = tmp_path / "logs" / "job.log"
    cmd = (
        "echo CVD=$CUDA_VISIBLE_DEVICES PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE JOB=$COSCHED_JOB_ID"
    )
    proc = JobProcess.start(cmd, env, log)
    assert proc.wait(5) == 0
    assert log.read_text() == "CVD=1 PCT=40 JOB=j8\n"


# What a portal / node agent host typically has in its environment (the values are fakes).
AGENT_SECRETS = {
    "DATABASE_URL": "postgres://cosched:db-pass-123@db:5432/cosched",
    "REDIS_URL": "redis://:redis-pass@redis:6379/0",
    "SECRET_KEY": "django-secret-key-xyz",
    "DEBUG": "0",
    "ALLOWED_HOSTS": "portal.example.org",
    "CSRF_TRUSTED_ORIGINS": "https://portal.example.org",
    "STATIC_ROOT": "/srv/static",
    "LOG_LEVEL": "DEBUG",
    "SECURE_SSL_REDIRECT": "1",
    "SECURE_HSTS_SECONDS": "60",
    "TEST_DB_NAME": "test_x",
    "TEST_DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test",
    "TEST_REDIS_URL": "redis://127.0.0.1:6379/15",
    "BENCH_PG_ADMIN_URL": "postgres://postgres@127.0.0.1:5432/postgres",
    "CELERY_BROKER_URL": "redis://:redis-pass@redis:6379/0",
    "DJANGO_SETTINGS_MODULE": "portal.settings",
    "DJANGO_SUPERUSER_PASSWORD": "admin-pass",
    "COSCHED_DATA_DIR": "/srv/cosched",
    "COSCHED_TOKEN": "cos_abc",
    "PGPASSWORD": "db-pass-123",
    "POSTGRES_PASSWORD": "db-pass-123",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "GITHUB_TOKEN": "ghp_x",
    "OPENAI_API_KEY": "sk-x",
}
HARMLESS = {"LANG": "C.UTF-8", "TZ": "UTC", "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "0"}


def test_build_env_drops_the_portals_configuration_and_credentials():
    base = {"PATH": "/usr/bin:/bin", "HOME": "/home/agent", **HARMLESS, **AGENT_SECRETS}
    env = build_env(MPS, base, mps_pipe_dir="/run/mps/1", extra={"JOB_VAR": "1"})
    assert not set(AGENT_SECRETS) & set(env), sorted(set(AGENT_SECRETS) & set(env))
    assert {k: env[k] for k in ("PATH", "HOME", *HARMLESS)} == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/agent",
        **HARMLESS,
    }
    # the placement's own variables are set after the removal, COSCHED_* ones included
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps/1"
    assert env["COSCHED_JOB_ID"] == "j8" and env["COSCHED_SHARING_MODE"] == "mps"
    assert env["JOB_VAR"] == "1"


def test_a_job_process_cannot_read_the_agents_secrets(tmp_path, monkeypatch):
    """The default base is the agent's own environment: a real job printing its whole
    environment sees PATH and its placement, none of the portal's settings."""
    for key, value in {**AGENT_SECRETS, **HARMLESS}.items():
        monkeypatch.setenv(key, value)
    env = build_env(EXCLUSIVE, gpu_model="V100")
    log = tmp_path / "job.log"
    cmd = f"{PY} -c 'import json, os; print(json.dumps(dict(os.environ)))'"
    proc = JobProcess.start(cmd, env, log)
    assert proc.wait(10) == 0
    seen = json.loads(log.read_text())
    leaked = sorted(set(AGENT_SECRETS) & set(seen))
    assert not leaked, f"the job sees the agent's {leaked}"
    secret_values = {"db-pass-123", "django-secret-key-xyz", "redis-pass", "admin-pass"}
    assert not [v for v in seen.values() if any(s in v for s in secret_values)]
    assert seen["PATH"] == os.environ["PATH"] and seen["LANG"] == "C.UTF-8"
    assert seen["CUDA_VISIBLE_DEVICES"] == "0,2" and seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert seen["COSCHED_JOB_ID"] == "j7" and seen["COSCHED_NODE"] == "gpu-1"
    assert seen["COSCHED_GPU_MODEL"] == "V100" and seen["COSCHED_SHARING_MODE"] == "exclusive"


# --- processes --------------------------------------------------------------------------------


def test_stdout_and_stderr_go_to_the_log_and_runs_append(tmp_path):
    log = tmp_path / "job.log"
    JobProcess.start("echo out; echo err >&2; exit 3", dict(os.environ), log).wait(5)
    proc = JobProcess.start(["/bin/sh", "-c", "pwd"], dict(os.environ), log, cwd=tmp_path)
    assert proc.wait(5) == 0
    assert log.read_text() == f"out\nerr\n{tmp_path}\n"
    assert proc.state is ProcessState.EXITED


def test_exit_codes_map_to_states(tmp_path):
    proc = JobProcess.start("exit 3", dict(os.environ), tmp_path / "log")
    assert proc.wait(5) == 3 and proc.poll() == 3 and proc.returncode == 3
    assert exit_to_state(proc.returncode) == ("FAILED", "exit code 3")
    assert exit_to_state(0) == ("COMPLETED", "exit code 0")
    assert exit_to_state(-9) == ("FAILED", "killed by SIGKILL")
    assert exit_to_state(-15) == ("FAILED", "killed by SIGTERM")
    assert exit_to_state(143) == ("FAILED", "exit code 143 (SIGTERM)")
    assert exit_to_state(137) == ("FAILED", "exit code 137 (SIGKILL)")
    assert exit_to_state(255) == ("FAILED", "exit code 255")


def test_a_command_that_cannot_start_is_a_launch_error(tmp_path):
    with pytest.raises(LaunchError, match="cannot start"):
        JobProcess.start(["/nonexistent/binary"], {}, tmp_path / "log")
    with pytest.raises(LaunchError, match="empty"):
        JobProcess.start("  ", {}, tmp_path / "log")


def test_pause_stops_output_and_resume_continues(tmp_path):
    log = tmp_path / "job.log"
    env = build_env(CPU)
    cmd = f"{PY} -m workers.emulate --profile demo --duration 0.8 --report-every 0.02"
    proc = JobProcess.start(cmd, env, log, cwd=ROOT)
    wait_for(lambda: len(read_new_lines(log)[0]) >= 3)
    assert proc.state is ProcessState.RUNNING
    assert proc.pause() and proc.state is ProcessState.PAUSED
    wait_for(lambda: proc_state(proc.pid) == "T")  # stopped: every write it made has landed
    size = log.stat().st_size
    time.sleep(0.6)  # the pause itself: 0.6 s stopped (the emulator may count a tick of it)
    assert proc_state(proc.pid) == "T"
    assert log.stat().st_size == size  # stopped: nothing written
    assert proc.poll() is None
    assert proc.resume() and proc.state is ProcessState.RUNNING
    assert proc.wait(10) == 0
    reports, _ = new_reports(log)
    assert reports[-1].event == "done"
    assert reports[-1].get("elapsed_s") - reports[-1].get("active_s") >= 0.45
    assert not proc.pause() and not proc.resume()  # ended: nothing to do


def test_kill_ends_the_whole_group_children_included(tmp_path):
    log = tmp_path / "job.log"
    proc = JobProcess.start("sleep 60 & echo child=$!; wait", dict(os.environ), log)
    wait_for(lambda: "child=" in log.read_text())
    child = int(log.read_text().split("child=")[1].split()[0])
    assert alive(child)
    code = proc.kill(grace_s=2)
    assert code == -signal.SIGTERM
    wait_for(lambda: not alive(child))
    assert exit_to_state(code) == ("FAILED", "killed by SIGTERM")


def test_kill_escalates_to_sigkill_after_the_grace_period(tmp_path):
    log = tmp_path / "log"
    proc = JobProcess.start("trap '' TERM; echo trapped; sleep 60", dict(os.environ), log)
    wait_for(lambda: "trapped" in log.read_text())  # the shell installed its trap
    started = time.monotonic()
    assert proc.kill(grace_s=0.3) == -signal.SIGKILL
    assert 0.25 <= time.monotonic() - started < 3
    assert exit_to_state(proc.returncode) == ("FAILED", "killed by SIGKILL")


def test_kill_reaches_a_paused_job(tmp_path):
    log = tmp_path / "job.log"
    cmd = [sys.executable, "-m", "workers.emulate", "--profile", "x", "--duration", "30"]
    proc = JobProcess.start(cmd, build_env(CPU), log, cwd=ROOT)
    wait_for(lambda: new_reports(log)[0] != [])
    proc.pause()
    assert proc.kill(grace_s=5) == 143  # the emulator got SIGTERM once continued
    assert proc.state is ProcessState.EXITED
    assert new_reports(log)[0][-1].event == "term"


def test_emulator_launched_with_a_placement_reads_profile_and_model(tmp_path):
    profile = {"name": "cnn", "gpu_time_s": {"V100": 30.0}, "gpu_memory_max_mb": 1228}
    env = build_env(
        Placement("j1", "gpu-1", (0,)), profile_json=json.dumps(profile), gpu_model="V100"
    )
    log = tmp_path / "job.log"
    cmd = f"{PY} -m workers.emulate --profile cnn --scale 0.01 --report-every 0.1"
    proc = JobProcess.start(cmd, env, log, cwd=ROOT)
    assert proc.wait(10) == 0
    reports, offset = new_reports(log)
    assert offset == log.stat().st_size
    assert reports[0].event == "start" and reports[0].get("gpu_model") == "V100"
    assert reports[0].get("run_s") == pytest.approx(0.3)
    assert reports[-2].get("mem_mb") == 1228 and reports[-1].event == "done"


# --- logs -------------------------------------------------------------------------------------


def test_tail_starts_at_a_line_boundary(tmp_path):
    log = tmp_path / "job.log"
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(1000)) + b"\xff end")
    text = tail(log, max_bytes=40)
    assert text.startswith("line 99") and text.endswith("\ufffd end")
    assert text.splitlines()[0] in {f"line {i}" for i in range(990, 1000)}
    assert tail(log, max_bytes=10**6).startswith("line 0\n")
    assert tail(tmp_path / "missing.log") == ""


def test_read_new_lines_keeps_a_partial_line_for_later(tmp_path):
    log = tmp_path / "job.log"
    assert read_new_lines(log, 0) == ([], 0)
    log.write_text("a\n@cosched progress fraction=0.5\npart")
    lines, offset = read_new_lines(log, 0)
    assert lines == ["a", "@cosched progress fraction=0.5"] and offset == 33
    with open(log, "a") as f:
        f.write("ial\n@cosched done iters=3\n")
    reports, offset = new_reports(log, offset)
    assert [r.event for r in reports] == ["done"] and offset == log.stat().st_size
    assert read_new_lines(log, offset) == ([], offset)


# --- containers (argv only: there is no Docker engine here) ----------------------------------


def test_docker_run_argv_for_a_gpu_job():
    env = job_env(EXCLUSIVE)
    argv = docker_run_argv(
        "pytorch:24.01", "python train.py", env, name="cosched-j7", gpu_devices=["0", "2"]
    )
    assert argv[:6] == ["docker", "run", "--rm", "--init", "--name", "cosched-j7"]
    assert argv[argv.index("--gpus") + 1] == '"device=0,2"'
    assert argv[6:8] == ["--label", "cosched.job=j7"]
    assert "COSCHED_JOB_ID=j7" in argv and "PYTHONUNBUFFERED=1" in argv
    assert not any(a.startswith(("CUDA_VISIBLE_DEVICES=", "CUDA_DEVICE_ORDER=")) for a in argv)
    assert argv[-4:] == ["pytorch:24.01", "/bin/sh", "-c", "python train.py"]


def test_docker_run_argv_for_mps_mig_and_cpu_jobs():
    mps = docker_run_argv(
        "img",
        ["train", "--fast"],
        job_env(MPS, mps_pipe_dir="/run/mps"),
        name="c8",
        gpu_devices=["1"],
        mps_pipe_dir="/run/mps",
        workdir="/work",
    )
    assert "--ipc=host" in mps and mps[mps.index("-v") + 1] == "/run/mps:/run/mps"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40" in mps
    assert mps[-5:] == ["-w", "/work", "img", "train", "--fast"]
    mig = docker_run_argv(
        "img", None, job_env(MIG, mig_uuid="MIG-4a5b"), name="c9", gpu_devices=["MIG-4a5b"]
    )
    assert mig[mig.index("--gpus") + 1] == '"device=MIG-4a5b"' and mig[-1] == "img"
    cpu = docker_run_argv("img", "make", job_env(CPU), name="c10")
    assert "--gpus" not in cpu and "CUDA_VISIBLE_DEVICES=" in cpu


def test_docker_control_argv():
    assert docker_control_argv("pause", "c1") == ["docker", "pause", "c1"]
    assert docker_control_argv("unpause", "c1", docker="podman") == ["podman", "unpause", "c1"]
    assert docker_control_argv("stop", "c1", grace_s=2.5) == ["docker", "stop", "--time", "3", "c1"]
    assert docker_control_argv("rm", "c1") == ["docker", "rm", "-f", "c1"]
    with pytest.raises(ValueError):
        docker_control_argv("explode", "c1")


def test_nvidia_visible_devices_follow_the_placement_not_the_agent():
    base = {"NVIDIA_VISIBLE_DEVICES": "all", "PATH": "/bin"}
    assert build_env(EXCLUSIVE, base)["NVIDIA_VISIBLE_DEVICES"] == "0,2"
    assert job_env(MIG, mig_uuid="MIG-4a5b")["NVIDIA_VISIBLE_DEVICES"] == "MIG-4a5b"
    assert build_env(CPU, base)["NVIDIA_VISIBLE_DEVICES"] == "void"  # no GPU at all
    argv = docker_run_argv("img", "true", job_env(EXCLUSIVE), name="c", gpu_devices=["0", "2"])
    assert not any(a.startswith("NVIDIA_VISIBLE_DEVICES=") for a in argv)  # --gpus decides
