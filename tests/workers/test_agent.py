"""The node agent against the real portal service (in-process transport: the protocol's JSON
messages, no HTTP), real runners and job subprocesses, and the virtual GPU backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from portal.core import services
from portal.core.agent_sync import InProcessTransport
from portal.core.metrics import log_tail_get, metrics_store_clear
from portal.core.models import (
    ApplicationProfile,
    Gpu,
    Job,
    JobEvent,
    MetricSample,
    Node,
    Placement,
    PlacementPart,
    ProfileGpuTime,
    ProfileMemoryStep,
)
from tests.nodes import catalogue_node
from workers import runner as runner_files
from workers.agent import NodeAgent, kill_marked_processes
from workers.gpu.virtual_backend import VirtualBackend
from workers.protocol import AttemptKey, SyncReply, SyncRequest, TransportError

NODE = "agent-t1"
ROOT = Path(__file__).resolve().parents[2]


class Switch:
    """The in-process transport, which a test can cut (the portal unreachable)."""

    def __init__(self) -> None:
        self.inner = InProcessTransport()
        self.down = False
        self.requests: list[SyncRequest] = []

    def sync(self, request: SyncRequest) -> SyncReply:
        if self.down:
            raise TransportError("cut by the test")
        self.requests.append(request)
        return self.inner.sync(request)


@pytest.fixture(autouse=True)
def _clean_store():
    metrics_store_clear()
    yield
    metrics_store_clear()


@pytest.fixture
def node(db) -> Node:
    return catalogue_node(NODE, "A30", 2, "GPU-test", cores=16, memory_mb=65536)


@pytest.fixture
def backend() -> VirtualBackend:
    return VirtualBackend("A30x2", node=NODE)


@pytest.fixture
def transport() -> Switch:
    return Switch()


def _agent(tmp_path: Path, backend, transport) -> NodeAgent:
    return NodeAgent(
        NODE,
        backend,
        transport,
        cores=16,
        memory_mb=65536,
        data_dir=tmp_path,
        address="10.0.0.7",
        sample_every_s=0.0,
    )


@pytest.fixture
def agent(node, backend, transport, tmp_path):
    agent = _agent(tmp_path, backend, transport)
    yield agent
    transport.down = False
    agent.shutdown(kill_jobs=True)
    kill_marked_processes(agent.marker)


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
    cpus: int = 1,
) -> Job:
    """A SCHEDULED job with its first attempt on ``node``, as the scheduler leaves it."""
    job = Job.objects.create(
        owner=owner, name="t", command=command, gpus=len(gpus), state="SCHEDULED", profile=profile
    )
    _attempt(job, node, gpus=gpus, mode=mode, mps=mps, mig=mig, cpus=cpus)
    return job


def _attempt(job: Job, node: Node, *, gpus=(0,), mode="exclusive", mps=None, mig="", cpus=1):
    number = Placement.objects.filter(job=job).count() + 1
    placement = Placement.objects.create(
        job=job,
        attempt=number,
        node=node,
        sharing_mode=mode,
        mps_percentage=mps,
        mig_profile=mig,
        policy="test",
        cpus=cpus,
    )
    placement.gpus.set(Gpu.objects.filter(node=node, index__in=gpus))
    PlacementPart.objects.create(
        placement=placement, node=node, node_rank=0, gpu_indices=list(gpus), cpus=cpus
    )
    return placement


def _state(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def _step_until(agent: NodeAgent, job: Job, *states: str, timeout: float = 20.0) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.step()
        if _state(job) in states:
            job.refresh_from_db()
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job.pk} still {_state(job)}, wanted {states}")


def _job_pid(agent: NodeAgent, job: Job, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.step()
        pid = agent.job_pid(job.pk)
        if pid:
            return pid
        time.sleep(0.02)
    raise AssertionError(f"job {job.pk} has no process after {timeout} s")


def _proc_state(pid: int) -> str:
    """The one-letter state of /proc/<pid>/stat (R, S, T, Z, ...); "gone" if there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _wait(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _alive(pid: int) -> bool:
    return _proc_state(pid) not in ("gone", "Z", "X")


def _metric(metric: str, **where) -> list[float]:
    return list(
        MetricSample.objects.filter(metric=metric, **where)
        .order_by("at", "id")
        .values_list("value", flat=True)
    )


def _part(job: Job, attempt: int = 1) -> PlacementPart:
    return PlacementPart.objects.get(placement__job=job, placement__attempt=attempt)


def test_the_first_sync_registers_the_node_its_gpus_and_its_lease(node, agent):
    Node.objects.filter(pk=node.pk).update(status="down", last_heartbeat=None)
    assert agent.step()
    node.refresh_from_db()
    assert node.status == "up" and node.address == "10.0.0.7"
    assert node.lease_expires_at is not None and node.sync_seq > 0
    gpus = list(node.gpus.order_by("index"))
    assert [(g.uuid, g.model, g.memory_mb) for g in gpus] == [
        (f"GPU-virtual-{NODE}-0", "A30", 24576),
        (f"GPU-virtual-{NODE}-1", "A30", 24576),
    ]
    assert {p["name"] for p in gpus[0].mig_profiles} == {"1g.6gb", "2g.12gb", "4g.24gb"}
    lease = runner_files.read_json(agent.lease_file)
    assert lease["deadline"] > runner_files.lease_clock() + 5  # 20 s lease by default


def test_the_node_reports_how_it_keeps_jobs_apart(node, agent):
    assert agent.step()
    node.refresh_from_db()
    aspects = {a["what"]: a for a in node.isolation}
    assert list(aspects) == ["accounts", "limits", "gpu_devices"]
    # every job runs as this process's account: one account for every user's jobs
    assert aspects["accounts"]["level"] == "weak"
    assert aspects["accounts"]["text"] == agent.job_users.describe()
    assert aspects["limits"]["text"] == agent.limits.describe()
    assert aspects["limits"]["level"] == ("ok" if agent.limits.kind == "cgroup" else "weak")
    assert aspects["gpu_devices"]["level"] == "n/a"  # virtual GPUs have no device nodes
    assert "virtual GPUs have no device nodes" in aspects["gpu_devices"]["text"]


def test_an_emulated_job_runs_to_completed_with_gpu_and_job_metrics(
    alice, node, agent, backend, profile
):
    command = "python -m workers.emulate --profile toy --scale 0.05 --report-every 0.1"
    job = _job(alice, node, command, profile=profile)

    agent.step()  # launch, then report it running in a follow-up sync

    job.refresh_from_db()
    assert job.state == "RUNNING" and job.started_at is not None
    event = JobEvent.objects.filter(job=job).latest("id")
    assert (event.from_state, event.to_state, event.actor) == (
        "SCHEDULED",
        "RUNNING",
        f"node:{NODE}",
    )
    assert "GPU 0 (exclusive), attempt 1" in event.message
    assert str(job.pk) in backend.jobs  # the virtual GPU follows the job

    job = _step_until(agent, job, "COMPLETED", "FAILED")

    assert job.state == "COMPLETED" and job.exit_code == 0 and job.failure_reason == ""
    gpu0 = Gpu.objects.get(node=node, index=0)
    gpu1 = Gpu.objects.get(node=node, index=1)
    assert 60.0 in _metric("util_pct", gpu=gpu0)  # the profile's utilisation while alone
    used = _metric("memory_used_mb", gpu=gpu0)
    assert max(used) > 1000.0 and max(used) <= 2000.0  # walking its memory step
    assert set(_metric("memory_total_mb", gpu=gpu0)) == {24576.0}
    assert set(_metric("util_pct", gpu=gpu1)) == {0.0}  # nothing ran there
    progress = _metric("progress", job=job)
    assert progress[-1] == 1.0 and any(0.0 < p < 1.0 for p in progress)
    slowdown = _metric("slowdown", job=job)
    assert slowdown and all(0.9 <= s <= 3.0 for s in slowdown)
    assert str(job.pk) not in backend.jobs  # detached: its memory is free again
    assert "@cosched done" in (log_tail_get(job.pk) or "")
    part = _part(job)
    assert (part.outcome, part.exit_code, part.detail) == ("exited", 0, "exit code 0")
    assert part.reported_at is not None and part.settled_at is not None
    placement = part.placement
    assert placement.outcome == "completed" and not placement.active
    assert agent.running() == [] and agent.pending_results() == []
    assert not any(agent.attempts_dir.iterdir())  # acknowledged: the local copy is gone
    assert JobEvent.objects.filter(job=job, to_state="RUNNING").count() == 1


def test_a_failing_command_is_failed_with_its_exit_code(alice, node, agent):
    job = _job(alice, node, "echo about to fail; exit 3")
    job = _step_until(agent, job, "COMPLETED", "FAILED")
    assert job.state == "FAILED" and job.exit_code == 3
    assert job.failure_reason == "exit code 3"
    assert JobEvent.objects.filter(job=job, to_state="FAILED", actor=f"node:{NODE}").exists()
    assert _part(job).placement.outcome == "failed"


def test_pause_stops_the_process_and_resume_continues_it(alice, node, agent, backend, profile):
    job = _job(alice, node, "sleep 30", profile=profile)
    pid = _job_pid(agent, job)
    agent.step()
    assert backend.utilisation(0) == 60.0

    services.job_pause(Job.objects.get(pk=job.pk), actor="user:alice")
    agent.step()

    assert _wait(lambda: _proc_state(pid) == "T", what="SIGSTOP")
    assert backend.utilisation(0) == 0.0  # a paused job keeps its memory but computes nothing
    assert backend.sample()[0].memory_used_mb == 1000.0
    assert _part(job).run_state in ("running", "paused")
    agent.step()
    assert _part(job).run_state == "paused"

    services.job_resume(Job.objects.get(pk=job.pk), actor="user:alice")
    agent.step()

    # Any state but stopped: under load the process may be runnable or in the kernel.
    assert _wait(lambda: _proc_state(pid) not in ("T", "t"), what="SIGCONT")
    assert backend.utilisation(0) == 60.0
    assert _state(job) == "RUNNING"


def test_cancel_kills_the_process_group_and_the_job_stays_cancelled(alice, node, agent, backend):
    job = _job(alice, node, "sleep 30 & sleep 30; wait")
    pid = _job_pid(agent, job)
    services.job_cancel(Job.objects.get(pk=job.pk), actor="user:alice")

    agent.step()  # the attempt is not desired any more: its runner stops the job

    assert _wait(lambda: not runner_files.group_alive(pid), what="the job's group to die")
    job = _step_until(agent, job, "CANCELLED")
    _wait(lambda: agent.step() and _part(job).reported_at is not None, what="the result")
    _wait(lambda: agent.step() and not agent.pending_results(), what="the result to be acked")
    job.refresh_from_db()
    assert job.state == "CANCELLED" and job.exit_code is None
    assert not JobEvent.objects.filter(job=job, to_state="FAILED").exists()
    part = _part(job)
    assert part.outcome == "killed" and "no longer assigned" in part.detail
    assert part.placement.outcome == "cancelled"
    assert agent.running() == [] and backend.jobs == {}


def test_a_requeued_attempt_is_stopped_and_the_job_stays_pending(alice, node, agent):
    job = _job(alice, node, "sleep 30")
    pid = _job_pid(agent, job)
    services.job_transition(job, "PENDING", actor="scheduler", message="preempted")
    _wait(lambda: agent.step() and not _alive(pid), what="the stop")
    # The runner writes the result once nothing of the job is left (its sweep), a moment after
    # the job's process died: wait for the portal to have recorded it.
    _wait(lambda: agent.step() and _part(job).reported_at is not None, what="the result")
    _wait(lambda: agent.step() and not agent.pending_results(), what="the result to be acked")
    job.refresh_from_db()
    assert job.state == "PENDING" and job.exit_code is None
    assert _part(job).outcome == "killed" and _part(job).placement.outcome == "requeued"


def test_the_next_attempt_waits_until_the_previous_one_is_settled(alice, node, agent, tmp_path):
    """Two attempts of one job never run at once: attempt 2 (on another node) is not offered
    until attempt 1's agent reported that it stopped."""
    from portal.core.agent_sync import agent_sync

    other = Node.objects.create(name="other-node", kind="cpu", cores=4)
    job = _job(alice, node, "trap 'sleep 1; exit 0' TERM; sleep 30 & wait")
    pid = _job_pid(agent, job)
    services.job_transition(job, "PENDING", actor="scheduler", message="preempted")
    _attempt(job, other, gpus=())
    services.job_transition(job, "SCHEDULED", actor="scheduler", expected="PENDING")

    def other_desired(seq: int) -> list:
        reply = agent_sync(SyncRequest(node="other-node", instance="x", seq=seq, sent_at=0.0))
        return [(a.job_id, a.attempt, a.launch) for a in reply.desired]

    assert other_desired(1) == []  # attempt 1 may still run on agent-t1
    agent.step()  # agent-t1 stops attempt 1 (its trap makes it take a second)
    assert _alive(pid) and other_desired(2) == []
    _wait(lambda: agent.step() and _part(job, 1).settled_at is not None, what="attempt 1 settled")
    assert not _alive(pid)
    assert other_desired(3) == [(job.pk, 2, True)]
    job.refresh_from_db()
    assert job.state == "SCHEDULED"  # attempt 1's result did not touch the job
    assert _part(job, 1).outcome == "killed"
    note = JobEvent.objects.filter(job=job, message__contains="no longer current").get()
    assert note.actor == f"node:{NODE}" and "attempt 1" in note.message


def test_a_job_that_ends_while_marked_paused_is_completed(alice, node, agent):
    # The scheduler wrote PAUSED, but the process ended before the pause reached the node.
    go = agent.state_dir.parent / "go"
    job = _job(alice, node, f"while [ ! -e {go} ]; do sleep 0.05; done")
    _job_pid(agent, job)
    go.touch()
    result = agent.attempts_dir / f"{job.pk}-1" / runner_files.RESULT
    _wait(result.exists, what="the job to end")
    services.job_transition(job, "PAUSED", actor="scheduler", expected="RUNNING")
    job = _step_until(agent, job, "COMPLETED", "FAILED")
    assert job.state == "COMPLETED" and job.exit_code == 0
    states = list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True))
    assert states[-2:] == ["RUNNING", "COMPLETED"]


def test_the_environment_follows_the_placement(alice, node, agent, profile):
    show = (
        "echo CVD=$CUDA_VISIBLE_DEVICES ORDER=$CUDA_DEVICE_ORDER MODEL=$COSCHED_GPU_MODEL "
        "PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE PIPE=$CUDA_MPS_PIPE_DIRECTORY "
        "ATTEMPT=$COSCHED_ATTEMPT WORLD=$WORLD_SIZE; pwd; "
        "python -c \"import os; print('PROFILE', os.environ.get('COSCHED_PROFILE_JSON'))\""
    )
    two = _job(alice, node, show, gpus=(0, 1), profile=profile)
    mps = _job(alice, node, show, gpus=(1,), mode="mps", mps=40)
    mig = _job(alice, node, show, gpus=(0,), mode="mig", mig="1g.6gb")
    for job in (two, mps, mig):
        _step_until(agent, job, "COMPLETED", "FAILED")

    out = agent.log_path(two.pk).read_text()
    assert "CVD=0,1 ORDER=PCI_BUS_ID MODEL=A30 PCT= PIPE= ATTEMPT=1 WORLD=" in out
    assert str(agent.work_dir / f"job-{two.pk}") in out
    assert '"toy"' in out and '"A30": 20.0' in out  # the profile as COSCHED_PROFILE_JSON

    out = agent.log_path(mps.pk).read_text()
    assert f"CVD=1 ORDER=PCI_BUS_ID MODEL=A30 PCT=40 PIPE={agent.mps_pipe_dir}" in out
    assert "PROFILE None" in out

    out = agent.log_path(mig.pk).read_text()
    assert f"CVD=MIG-virtual-{NODE}-0-" in out


def test_a_job_sees_none_of_the_agents_configuration(alice, node, agent, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/x")
    monkeypatch.setenv("COSCHED_NODE_TOKEN", "cosn_secret")
    job = _job(alice, node, "env", gpus=())
    _step_until(agent, job, "COMPLETED")
    out = agent.log_path(job.pk).read_text()
    assert "DATABASE_URL" not in out and "cosn_secret" not in out
    assert f"COSCHED_JOB_ID={job.pk}" in out and "COSCHED_ATTEMPT=1" in out


def test_the_log_holds_stdout_and_stderr(alice, node, agent):
    job = _job(alice, node, "echo to-stdout; echo to-stderr >&2")
    _step_until(agent, job, "COMPLETED")
    text = agent.log_path(job.pk).read_text()
    assert "to-stdout" in text and "to-stderr" in text
    assert f"[cosched] job {job.pk} attempt 1 on {NODE} GPU 0 (exclusive)" in text
    assert "to-stderr" in log_tail_get(job.pk)


def test_an_attempt_is_started_once_whatever_the_replies_repeat(alice, node, agent, transport):
    job = _job(alice, node, "sleep 30")
    pid = _job_pid(agent, job)
    for _ in range(3):
        agent.step()
    assert agent.job_pid(job.pk) == pid
    assert len(list(agent.attempts_dir.iterdir())) == 1
    assert JobEvent.objects.filter(job=job, to_state="RUNNING").count() == 1
    # Every request listed it once it ran; the portal never offered it again after that.
    assert all(len(r.running) <= 1 for r in transport.requests)


def test_a_job_without_a_command_fails_at_launch(alice, node, agent, backend):
    job = _job(alice, node, "  ")
    job = _step_until(agent, job, "FAILED")
    assert "no command" in job.failure_reason
    assert _part(job).outcome == "launch_failed"
    assert backend.jobs == {}


def test_a_cpu_job_gets_no_gpu(alice, agent, node):
    job = _job(alice, node, "echo CVD=[$CUDA_VISIBLE_DEVICES]", gpus=(), cpus=2)
    _step_until(agent, job, "COMPLETED")
    assert "CVD=[]" in agent.log_path(job.pk).read_text()


def test_many_attempts_start_in_one_round(alice, node, agent):
    jobs = [
        _job(alice, node, f"sleep 0.{i + 2}", gpus=(i % 2,), mode="time_slicing") for i in range(6)
    ]
    agent.step()
    assert {_state(j) for j in jobs} == {"RUNNING"}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_state(j) != "COMPLETED" for j in jobs):
        agent.step()
        time.sleep(0.05)
    assert [_state(j) for j in jobs] == ["COMPLETED"] * 6
    assert all(JobEvent.objects.filter(job=j, to_state="RUNNING").count() == 1 for j in jobs)


# --- restarts, leases, shutdown -------------------------------------------------------------------


def test_a_restarted_agent_adopts_its_running_attempt(alice, node, backend, transport, tmp_path):
    first = _agent(tmp_path, backend, transport)
    job = _job(alice, node, "sleep 1.5")
    pid = _job_pid(first, job)
    first.shutdown(kill_jobs=False)  # SIGTERM of the agent: its jobs keep running
    assert _alive(pid)

    second = _agent(tmp_path, VirtualBackend("A30x2", node=NODE), transport)
    try:
        second.start()
        assert second.running() == [AttemptKey(job.pk, 1)] and second.job_pid(job.pk) == pid
        job = _step_until(second, job, "COMPLETED", "FAILED")
    finally:
        second.shutdown(kill_jobs=True)
    assert job.state == "COMPLETED"
    assert JobEvent.objects.filter(job=job, to_state="RUNNING").count() == 1
    assert Placement.objects.filter(job=job).count() == 1


def test_a_result_recorded_while_the_agent_was_away_is_reported_once(
    alice, node, backend, transport, tmp_path
):
    first = _agent(tmp_path, backend, transport)
    go = tmp_path / "go"
    job = _job(alice, node, f"while [ ! -e {go} ]; do sleep 0.05; done; echo done")
    _job_pid(first, job)
    first.shutdown(kill_jobs=False)
    go.touch()  # the job ends while no agent follows it
    result = next(first.attempts_dir.iterdir()) / runner_files.RESULT
    _wait(result.exists, what="the runner's result file")

    second = _agent(tmp_path, VirtualBackend("A30x2", node=NODE), transport)
    try:
        job = _step_until(second, job, "COMPLETED", "FAILED")
        second.step()
    finally:
        second.shutdown(kill_jobs=True)
    assert job.state == "COMPLETED" and job.exit_code == 0
    assert JobEvent.objects.filter(job=job, to_state="COMPLETED").count() == 1
    assert not any(second.attempts_dir.iterdir())


def test_a_restarted_agent_kills_processes_it_does_not_know(agent, tmp_path):
    env = {**os.environ, "COSCHED_AGENT_ID": agent.marker}
    leftover = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True)
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        agent.start()
        assert leftover.wait(5) == -signal.SIGKILL
        assert stranger.poll() is None  # not ours: left alone
    finally:
        for p in (leftover, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_second_agent_on_the_same_state_is_refused(node, agent, backend, transport, tmp_path):
    from workers.agent import AgentLocked

    agent.start()
    with pytest.raises(AgentLocked, match="another agent process"):
        _agent(tmp_path, backend, transport).start()


def test_the_runner_stops_the_job_when_the_lease_runs_out(alice, node, agent, transport, settings):
    settings.COSCHED = {**settings.COSCHED, "LEASE_S": 3.0, "LEASE_MARGIN_S": 2.0}
    job = _job(alice, node, "sleep 60")
    pid = _job_pid(agent, job)
    deadline = agent.lease_deadline
    assert deadline is not None and 2.0 < deadline - runner_files.lease_clock() <= 3.0

    transport.down = True  # the portal is unreachable: the lease is not renewed
    died = _wait(
        lambda: agent.step() or (not _alive(pid) and runner_files.lease_clock()), 15, "the kill"
    )
    assert deadline - 0.1 <= died <= deadline + 1.0 + 1.5  # lease, then SIGTERM (1 s grace)
    assert _part(job).reported_at is None  # the portal has not heard yet

    transport.down = False
    job = _step_until(agent, job, "PENDING")
    part = _part(job)
    assert part.outcome == "lease_expired" and "lease ran out" in part.detail
    event = JobEvent.objects.filter(job=job, to_state="PENDING").get()
    assert "attempt 1 on agent-t1 ended" in event.message and "lease" in event.message


def test_shutdown_with_kill_jobs_stops_them_and_requeues(alice, node, agent):
    job = _job(alice, node, "sleep 30")
    pid = _job_pid(agent, job)
    agent.shutdown(kill_jobs=True)
    assert not _alive(pid)
    assert _state(job) == "PENDING"
    assert "node agent on agent-t1 stopped" in JobEvent.objects.filter(job=job).latest("id").message


# --- the command line -----------------------------------------------------------------------------


def _agent_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m workers.agent ARGS`` with no portal configuration in its environment."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL") and not k.startswith("COSCHED_")
    }
    return subprocess.run(
        [sys.executable, "-m", "workers.agent", *args],
        cwd=ROOT,
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


def test_the_agent_command_fails_clearly_without_nvml(tmp_path):
    token = tmp_path / "token"
    token.write_text("cosn_x\n")
    # This machine has no NVIDIA driver: NVML cannot load (the real pynvml, no fake here).
    args = ["--name", "g1", "--backend", "nvml", "--portal", "http://127.0.0.1:9"]
    line = _one_line_error(_agent_cli(tmp_path, *args, "--token-file", str(token)))
    assert "NVML is not available" in line and "--backend virtual" in line


def test_the_agent_command_needs_a_portal_and_a_token(tmp_path):
    line = _one_line_error(_agent_cli(tmp_path, "--name", "v1", "--gpus", "T4"))
    assert "no portal URL" in line and "--portal" in line
    line = _one_line_error(_agent_cli(tmp_path, "--name", "v1", "--portal", "http://x:1"))
    assert "no node token" in line and "node_token create" in line
