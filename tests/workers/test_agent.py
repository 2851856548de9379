"""The node agent against the real database, real subprocesses and the virtual GPU backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from portal.core import services
from portal.core.metrics import log_tail_get, metrics_store_clear
from portal.core.models import (
    ApplicationProfile,
    Gpu,
    Job,
    JobEvent,
    MetricSample,
    Node,
    Placement,
    ProfileGpuTime,
    ProfileMemoryStep,
)
from scheduler.catalog import gpu_spec
from workers import triggers
from workers.agent import NodeAgent, local_agent, local_agents, register_local
from workers.gpu.virtual_backend import VirtualBackend

NODE = "agent-t1"


@pytest.fixture(autouse=True)
def _clean_store():
    metrics_store_clear()
    yield
    metrics_store_clear()


@pytest.fixture
def wakes():
    """Reasons the scheduling loop was woken with (through the real triggers module)."""
    seen: list[str] = []
    triggers.set_local_waker(seen.append)
    yield seen
    triggers.set_local_waker(None)


@pytest.fixture
def node(db) -> Node:
    node = Node.objects.create(name=NODE, kind="gpu", cores=16, memory_mb=65536)
    spec = gpu_spec("A30")
    for index in range(2):
        Gpu.objects.create(
            node=node,
            index=index,
            uuid=f"GPU-test-{index}",
            model=spec.model,
            memory_mb=spec.memory_mb,
            sm_count=spec.sm_count,
            sharing_modes=[m.value for m in spec.sharing_modes],
        )
    return node


@pytest.fixture
def backend() -> VirtualBackend:
    return VirtualBackend("A30x2", node=NODE)


@pytest.fixture
def agent(node, backend, tmp_path):
    agent = NodeAgent(NODE, backend, cores=16, memory_mb=65536, log_dir=tmp_path / "logs")
    yield agent
    agent.shutdown(kill_jobs=True)


@pytest.fixture
def profile(db) -> ApplicationProfile:
    """Alone on an A30 it runs 20 s (1 s at --scale 0.05), busy 60 %, 1-2 GB of memory."""
    profile = ApplicationProfile.objects.create(
        name="toy", kind="dl-train", status="approved", gpu_util_pct=60.0, gpu_memory_max_mb=2000
    )
    ProfileGpuTime.objects.create(profile=profile, gpu_model="A30", time_s=20.0)
    ProfileMemoryStep.objects.create(
        profile=profile, index=1, start_fraction=0.0, from_mb=1000, to_mb=2000
    )
    return profile


def _job(
    owner,
    node: Node,
    command: str,
    *,
    gpus: tuple[int, ...] = (0,),
    mode: str = "exclusive",
    mps: int | None = None,
    mig: str = "",
    profile: ApplicationProfile | None = None,
) -> Job:
    """A SCHEDULED job with an active placement on ``node``, as the scheduler leaves it."""
    job = Job.objects.create(
        owner=owner, name="t", command=command, gpus=len(gpus), state="SCHEDULED", profile=profile
    )
    placement = Placement.objects.create(
        job=job, node=node, sharing_mode=mode, mps_percentage=mps, mig_profile=mig, policy="test"
    )
    placement.gpus.set(Gpu.objects.filter(node=node, index__in=gpus))
    return job


def _state(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def _tick_until(agent: NodeAgent, job: Job, *states: str, timeout: float = 15.0) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.tick()
        if _state(job) in states:
            job.refresh_from_db()
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job.pk} still {_state(job)}, wanted {states}")


def _proc_state(pid: int) -> str:
    """The one-letter state of /proc/<pid>/stat (R, S, T, Z, ...)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _live_members(pgid: int, timeout: float = 3.0) -> list[int]:
    """Processes of group ``pgid`` that are not dead (zombies awaiting their reaper count as
    dead), after waiting up to ``timeout`` seconds for the list to empty."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                alive.append(int(entry.name))
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _wait_state(pid: int, wanted: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    state = _proc_state(pid)
    while state != wanted and time.monotonic() < deadline:
        time.sleep(0.02)
        state = _proc_state(pid)
    return state


def _metric(metric: str, **where) -> list[float]:
    return list(
        MetricSample.objects.filter(metric=metric, **where)
        .order_by("at", "id")
        .values_list("value", flat=True)
    )


def test_an_emulated_job_runs_to_completed_with_gpu_and_job_metrics(
    alice, node, agent, backend, profile, wakes
):
    command = "python -m workers.emulate --profile toy --scale 0.05 --report-every 0.1"
    job = _job(alice, node, command, profile=profile)

    agent.launch(job.pk)

    job.refresh_from_db()
    assert job.state == "RUNNING" and job.started_at is not None
    event = JobEvent.objects.filter(job=job).latest("id")
    assert (event.from_state, event.to_state, event.actor) == (
        "SCHEDULED",
        "RUNNING",
        f"node:{NODE}",
    )
    assert "GPU 0 (exclusive)" in event.message
    assert str(job.pk) in backend.jobs  # the virtual GPU follows the job

    job = _tick_until(agent, job, "COMPLETED", "FAILED")

    assert job.state == "COMPLETED" and job.exit_code == 0 and job.failure_reason == ""
    gpu0 = Gpu.objects.get(node=node, index=0)
    gpu1 = Gpu.objects.get(node=node, index=1)
    util = _metric("util_pct", gpu=gpu0)
    used = _metric("memory_used_mb", gpu=gpu0)
    assert 60.0 in util  # the profile's utilisation while it ran alone
    assert max(used) > 1000.0 and max(used) <= 2000.0  # walking its memory step
    assert set(_metric("memory_total_mb", gpu=gpu0)) == {24576.0}
    assert set(_metric("util_pct", gpu=gpu1)) == {0.0}  # nothing ran there
    progress = _metric("progress", job=job)
    assert progress[-1] == 1.0 and any(0.0 < p < 1.0 for p in progress)
    assert progress == sorted(progress)
    slowdown = _metric("slowdown", job=job)
    # Alone and never paused: elapsed (interpreter start included) over the 1 s solo time.
    assert slowdown and all(0.9 <= s <= 3.0 for s in slowdown)
    assert MetricSample.objects.filter(job=job, node=node).exists()
    assert str(job.pk) not in backend.jobs  # detached: its memory is free again
    assert "@cosched done" in (log_tail_get(job.pk) or "")
    assert f"job {job.pk} finished" in wakes
    assert agent.running_job_ids() == []


def test_a_failing_command_is_failed_with_its_exit_code(alice, node, agent, wakes):
    job = _job(alice, node, "echo about to fail; exit 3")
    agent.launch(job.pk)
    job = _tick_until(agent, job, "COMPLETED", "FAILED")
    assert job.state == "FAILED" and job.exit_code == 3
    assert job.failure_reason == "exit code 3"
    assert JobEvent.objects.filter(job=job, to_state="FAILED", actor=f"node:{NODE}").exists()
    assert f"job {job.pk} finished" in wakes


def test_pause_stops_the_process_and_resume_continues_it(alice, node, agent, backend, profile):
    job = _job(alice, node, "sleep 30", profile=profile)
    agent.launch(job.pk)
    pid = agent.process_of(job.pk).pid
    agent.tick()
    assert backend.utilisation(0) == 60.0

    agent.control(job.pk, "pause")

    assert _state(job) == "PAUSED"
    assert _wait_state(pid, "T") == "T"
    assert backend.utilisation(0) == 0.0  # a paused job keeps its memory but computes nothing
    assert backend.sample()[0].memory_used_mb == 1000.0
    assert JobEvent.objects.filter(job=job, to_state="PAUSED", actor=f"node:{NODE}").exists()

    agent.control(job.pk, "resume")

    assert _state(job) == "RUNNING"
    assert _wait_state(pid, "S") == "S"
    assert backend.utilisation(0) == 60.0


def test_pause_after_the_scheduler_wrote_paused_only_stops_the_process(alice, node, agent):
    job = _job(alice, node, "sleep 30")
    agent.launch(job.pk)
    services.job_transition(job, "PAUSED", actor="scheduler", expected="RUNNING")
    agent.control(job.pk, "pause")
    assert _wait_state(agent.process_of(job.pk).pid, "T") == "T"
    assert _state(job) == "PAUSED"
    assert JobEvent.objects.filter(job=job, to_state="PAUSED").count() == 1


def test_kill_after_cancel_ends_the_process_and_the_job_stays_cancelled(
    alice, node, agent, backend
):
    job = _job(alice, node, "sleep 30 & sleep 30; wait")
    agent.launch(job.pk)
    process = agent.process_of(job.pk)
    services.job_cancel(job, actor="user:alice")

    agent.control(job.pk, "kill")

    assert process.poll() is not None
    assert _live_members(process.pgid) == []  # the shell's children went too
    agent.tick()
    job.refresh_from_db()
    assert job.state == "CANCELLED" and job.exit_code is None
    assert not JobEvent.objects.filter(job=job, to_state="FAILED").exists()
    assert agent.running_job_ids() == [] and backend.jobs == {}
    agent.control(job.pk, "kill")  # a second kill (duplicate delivery) is harmless


def test_a_requeued_job_killed_by_the_scheduler_stays_pending(alice, node, agent):
    job = _job(alice, node, "sleep 30")
    agent.launch(job.pk)
    services.job_transition(job, "PENDING", actor="scheduler", message="preempted")
    agent.control(job.pk, "kill")
    agent.tick()
    job.refresh_from_db()
    assert job.state == "PENDING" and job.exit_code is None


def test_a_late_kill_does_not_touch_the_jobs_next_attempt_elsewhere(alice, node, agent):
    job = _job(alice, node, "sleep 30")
    agent.launch(job.pk)
    services.job_transition(job, "PENDING", actor="scheduler", message="preempted")
    # The next cycle placed it on another node, which started it before our kill arrived.
    other = Node.objects.create(name="other-node", kind="cpu")
    Placement.objects.create(job=job, node=other, policy="test")
    services.job_transition(job, "SCHEDULED", actor="scheduler")
    services.job_transition(job, "RUNNING", actor="node:other-node")

    agent.control(job.pk, "kill")
    agent.tick()

    job.refresh_from_db()
    assert job.state == "RUNNING" and job.exit_code is None
    assert job.placements.get(active=True).node == other


def test_a_job_that_ends_while_marked_paused_is_completed(alice, node, agent):
    # The scheduler wrote PAUSED but the process finished before the pause reached the node.
    job = _job(alice, node, "sleep 0.3")
    agent.launch(job.pk)
    services.job_transition(job, "PAUSED", actor="scheduler", expected="RUNNING")
    job = _tick_until(agent, job, "COMPLETED", "FAILED")
    assert job.state == "COMPLETED" and job.exit_code == 0
    states = list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True))
    assert states[-2:] == ["RUNNING", "COMPLETED"]


def test_the_environment_follows_the_placement(alice, node, agent, profile):
    show = (
        "echo CVD=$CUDA_VISIBLE_DEVICES ORDER=$CUDA_DEVICE_ORDER MODEL=$COSCHED_GPU_MODEL "
        "PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE PIPE=$CUDA_MPS_PIPE_DIRECTORY; pwd; "
        "python -c \"import os; print('PROFILE', os.environ.get('COSCHED_PROFILE_JSON'))\""
    )
    two = _job(alice, node, show, gpus=(0, 1), profile=profile)
    mps = _job(alice, node, show, gpus=(1,), mode="mps", mps=40)
    mig = _job(alice, node, show, gpus=(0,), mode="mig", mig="1g.6gb")
    for job in (two, mps, mig):
        agent.launch(job.pk)
        _tick_until(agent, job, "COMPLETED", "FAILED")

    out = agent.log_path(two.pk).read_text()
    assert "CVD=0,1 ORDER=PCI_BUS_ID MODEL=A30 PCT= PIPE=" in out
    assert str(agent.work_dir / f"job-{two.pk}") in out
    assert '"toy"' in out and '"A30": 20.0' in out  # the profile as COSCHED_PROFILE_JSON

    out = agent.log_path(mps.pk).read_text()
    assert f"CVD=1 ORDER=PCI_BUS_ID MODEL=A30 PCT=40 PIPE={agent.mps_pipe_dir}" in out
    assert "PROFILE None" in out

    out = agent.log_path(mig.pk).read_text()
    assert f"CVD=MIG-virtual-{NODE}-0-" in out


def test_the_log_holds_stdout_and_stderr(alice, node, agent):
    job = _job(alice, node, "echo to-stdout; echo to-stderr >&2")
    agent.launch(job.pk)
    _tick_until(agent, job, "COMPLETED")
    text = agent.log_path(job.pk).read_text()
    assert "to-stdout" in text and "to-stderr" in text
    assert agent.log_path(job.pk) == agent.log_dir / f"job-{job.pk}.log"
    assert "to-stderr" in log_tail_get(job.pk)


def test_launch_is_idempotent(alice, node, agent):
    job = _job(alice, node, "sleep 30")
    agent.launch(job.pk)
    pid = agent.process_of(job.pk).pid
    agent.launch(job.pk)  # duplicate delivery of the launch task
    assert agent.process_of(job.pk).pid == pid
    assert JobEvent.objects.filter(job=job, to_state="RUNNING").count() == 1


def test_launch_ignores_a_job_placed_elsewhere_or_not_scheduled(alice, node, agent):
    other = Node.objects.create(name="elsewhere", kind="cpu")
    job = Job.objects.create(owner=alice, name="x", command="true", state="SCHEDULED")
    Placement.objects.create(job=job, node=other, policy="test")
    agent.launch(job.pk)
    pending = Job.objects.create(owner=alice, name="y", command="true")
    agent.launch(pending.pk)
    assert _state(job) == "SCHEDULED" and _state(pending) == "PENDING"
    assert agent.running_job_ids() == []


def test_a_job_without_a_command_fails_at_launch(alice, node, agent, backend, wakes):
    job = _job(alice, node, "  ")
    agent.launch(job.pk)
    job.refresh_from_db()
    assert job.state == "FAILED" and "no command" in job.failure_reason
    assert backend.jobs == {}
    assert f"job {job.pk} finished" in wakes


def test_a_cpu_job_gets_no_gpu(alice, agent, node):
    job = Job.objects.create(
        owner=alice, name="c", command="echo CVD=[$CUDA_VISIBLE_DEVICES]", state="SCHEDULED"
    )
    Placement.objects.create(job=job, node=node, policy="test", cpus=2)
    agent.launch(job.pk)
    _tick_until(agent, job, "COMPLETED")
    assert "CVD=[]" in agent.log_path(job.pk).read_text()


def test_register_writes_the_backend_gpus_and_requeues_jobs_it_does_not_follow(
    alice, node, agent, tmp_path
):
    orphan = _job(alice, node, "sleep 30")
    services.job_transition(orphan, "RUNNING", actor=f"node:{NODE}", expected="SCHEDULED")
    # A process an earlier agent of this node started for it, still running.
    env = dict(os.environ, COSCHED_NODE=NODE, COSCHED_JOB_ID=str(orphan.pk))
    leftover = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True)
    try:
        node_row = agent.register()
        assert leftover.wait(5) == -signal.SIGKILL
    finally:
        if leftover.poll() is None:
            leftover.kill()
    assert node_row.status == "up" and node_row.backend == "virtual"
    gpus = list(node_row.gpus.order_by("index"))
    assert [(g.uuid, g.model, g.memory_mb) for g in gpus] == [
        (f"GPU-virtual-{NODE}-0", "A30", 24576),
        (f"GPU-virtual-{NODE}-1", "A30", 24576),
    ]
    assert {p["name"] for p in gpus[0].mig_profiles} == {"1g.6gb", "2g.12gb", "4g.24gb"}
    orphan.refresh_from_db()
    assert orphan.state == "PENDING"
    assert "restarted" in JobEvent.objects.filter(job=orphan).latest("id").message


def test_tick_heartbeats(node, agent):
    Node.objects.filter(pk=node.pk).update(last_heartbeat=None, status="down")
    agent.tick()
    node.refresh_from_db()
    assert node.last_heartbeat is not None and node.status == "up"


def test_shutdown_kills_and_requeues_the_jobs_it_runs(alice, node, agent):
    job = _job(alice, node, "sleep 30")
    agent.launch(job.pk)
    process = agent.process_of(job.pk)
    agent.shutdown(kill_jobs=True)
    assert process.poll() is not None
    assert _state(job) == "PENDING"


def test_local_registry(node, agent):
    register_local(agent)
    assert local_agent(NODE) is agent and agent in local_agents()
    agent.shutdown()
    assert local_agent(NODE) is None


@pytest.mark.django_db(transaction=True)
def test_launches_from_worker_threads_while_the_sampler_ticks(alice, node, agent):
    """The shape of a running agent: Celery threads launch while the sampler thread ticks."""
    jobs = [
        _job(alice, node, f"sleep 0.{i + 2}", gpus=(i % 2,), mode="time_slicing") for i in range(6)
    ]
    stop = threading.Event()
    errors: list[BaseException] = []

    def sampler() -> None:
        from django.db import connection

        try:
            while not stop.is_set():
                agent.tick()
                time.sleep(0.02)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    def launch(job_id: int) -> None:
        from django.db import connection

        try:
            agent.launch(job_id)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    ticker = threading.Thread(target=sampler)
    ticker.start()
    launchers = [threading.Thread(target=launch, args=(j.pk,)) for j in jobs]
    for t in launchers:
        t.start()
    for t in launchers:
        t.join()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_state(j) != "COMPLETED" for j in jobs):
        time.sleep(0.05)
    stop.set()
    ticker.join()
    assert errors == []
    assert [_state(j) for j in jobs] == ["COMPLETED"] * 6
    assert all(JobEvent.objects.filter(job=j, to_state="RUNNING").count() == 1 for j in jobs)


def _node_agent(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``manage.py node_agent ARGS`` in a subprocess (no broker, no database unless given)."""
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return subprocess.run(
        [sys.executable, "manage.py", "node_agent", *args],
        cwd=Path(__file__).resolve().parents[2],
        env={**base, "COSCHED_DATA_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_the_node_agent_command_fails_clearly_without_nvml(tmp_path):
    # This machine has no NVIDIA driver: NVML cannot load (the real pynvml, no fake here).
    line = _one_line_error(_node_agent(tmp_path, "--name", "g1", "--backend", "nvml"))
    assert "NVML is not available" in line and "--backend virtual" in line


def test_the_node_agent_command_needs_a_broker(tmp_path):
    line = _one_line_error(_node_agent(tmp_path, "--name", "v1", "--gpus", "T4"))
    assert "needs a broker" in line and "REDIS_URL" in line
