"""Container jobs under the real node agent in this process (root, ``--run-jobs-as owner``) and
real Podman: a pause is ``podman pause`` (the container's processes are frozen, not only the
client), a resume ``podman unpause``, a cancel stops and removes the container; a node without a
runtime fails the launch and says why. The image: the busybox one of
``test_containers_live``."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from portal.core import services
from portal.core.agent_sync import InProcessTransport
from portal.core.models import Job, Node, Placement, PlacementPart
from tests.security.test_containers_live import ACCOUNT, PORTAL_USER, _conf, account, image  # noqa: F401
from workers.agent import NodeAgent, kill_marked_processes
from workers.isolation import OWNER, JobUsers

pytestmark = pytest.mark.django_db

NODE = "ctr-agent-cpu"


@pytest.fixture
def owner(django_user_model, account):  # noqa: F811 (the fixture imported above)
    return django_user_model.objects.create_user(PORTAL_USER, password="ctr-pw-12345")


@pytest.fixture
def node(db) -> Node:
    return Node.objects.create(name=NODE, kind="cpu", cores=8, memory_mb=16384)


@pytest.fixture
def data_dir():
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="cosched-ctr-agent-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _agent(data_dir: Path, runtimes: tuple[str, ...]) -> NodeAgent:
    return NodeAgent(
        NODE,
        None,
        InProcessTransport(),
        kind="cpu",
        cores=8,
        memory_mb=16384,
        data_dir=data_dir,
        sample_every_s=0.0,
        job_users=JobUsers(OWNER, user_map={PORTAL_USER: ACCOUNT}, fallback="none"),
        container_runtimes=runtimes,
    )


@pytest.fixture
def agent(node, data_dir, image):  # noqa: F811
    agent = _agent(data_dir, ("podman",))
    yield agent
    agent.shutdown(kill_jobs=True)
    kill_marked_processes(agent.marker)


def _job(owner, node: Node, command: str, image_name: str) -> Job:
    job = Job.objects.create(
        owner=owner,
        name="ctr",
        command=command,
        container_image=image_name,
        gpus=0,
        state="SCHEDULED",
    )
    placement = Placement.objects.create(
        job=job, attempt=1, node=node, sharing_mode="exclusive", policy="test", cpus=1
    )
    PlacementPart.objects.create(
        placement=placement, node=node, node_rank=0, gpu_indices=[], cpus=1
    )
    return job


def _state(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def _until(agent: NodeAgent, predicate, what: str, timeout: float = 40.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.step()
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _status(agent: NodeAgent, job: Job) -> str | None:
    """The container's status (``running``, ``paused``, ...), None when there is none."""
    from workers.containers import container_name

    name = container_name(agent.marker, job.pk, 1)
    out = subprocess.run(
        ["podman", "inspect", "--type", "container", name],
        capture_output=True,
        text=True,
        env=_conf(agent.state_dir),
    )
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)[0]["State"]["Status"]


# Among the heaviest live tests: in `make test-slow` (CI runs it after `make test`).
@pytest.mark.slow
def test_pause_freezes_the_container_and_cancel_removes_it(owner, node, agent, image, account):  # noqa: F811
    job = _job(owner, node, "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done", image)
    log = agent.log_path(job.pk)
    _until(agent, lambda: "tick 3" in log.read_text(errors="replace"), "the job's output")
    assert _status(agent, job) == "running"
    spec = json.loads((agent.attempts_dir / f"{job.pk}-1" / "spec.json").read_text())
    argv = spec["argv"]
    assert argv[:2] == ["podman", "run"] and argv[argv.index("--user") + 1] == (
        f"{account.pw_uid}:{account.pw_gid}"
    )
    assert argv[argv.index("--network") + 1] == "none"
    assert "COSCHED_JOB_ID" in argv and not any(a.startswith("COSCHED_JOB_ID=") for a in argv)
    assert spec["env"]["CONTAINERS_CONF"] == str(agent.containers_conf)
    assert "default_ulimits = []" in agent.containers_conf.read_text()
    assert spec["isolation"]["client"] and "limits" not in spec["isolation"]

    services.job_pause(Job.objects.get(pk=job.pk), actor=f"user:{PORTAL_USER}")
    _until(agent, lambda: _status(agent, job) == "paused", "podman pause")
    time.sleep(0.3)
    frozen = log.read_text(errors="replace").count("tick")
    time.sleep(1.0)
    assert log.read_text(errors="replace").count("tick") == frozen  # nothing runs inside

    services.job_resume(Job.objects.get(pk=job.pk), actor=f"user:{PORTAL_USER}")
    _until(agent, lambda: _status(agent, job) == "running", "podman unpause")
    _until(agent, lambda: log.read_text(errors="replace").count("tick") > frozen + 2, "ticks")

    services.job_cancel(Job.objects.get(pk=job.pk), actor=f"user:{PORTAL_USER}")
    _until(agent, lambda: agent.job_pid(job.pk) is None and not agent.running(), "the stop")
    assert _status(agent, job) is None  # stopped and removed
    assert _state(job) == "CANCELLED"


def test_a_node_without_a_runtime_fails_the_launch_and_says_why(owner, node, data_dir, image):  # noqa: F811
    agent = _agent(data_dir, ())
    try:
        job = _job(owner, node, "echo never", image)
        _until(agent, lambda: _state(job) in ("FAILED", "PENDING"), "the launch failure")
        text = agent.log_path(job.pk).read_text()
        assert "has no container runtime" in text and "never" not in text.split("\n", 1)[1]
    finally:
        agent.shutdown(kill_jobs=True)
        kill_marked_processes(agent.marker)


def test_a_container_past_its_time_limit_is_stopped_and_removed(owner, node, agent, image):  # noqa: F811
    job = _job(owner, node, "trap 'echo got-term; exit 143' TERM; sleep 60 & wait", image)
    Job.objects.filter(pk=job.pk).update(time_limit_s=2)
    ended = _until(agent, lambda: _state(job) in ("FAILED", "COMPLETED") and _state(job), "the end")
    job.refresh_from_db()
    assert "time limit" in (job.failure_reason or ""), (ended, job.failure_reason)
    assert "got-term" in agent.log_path(job.pk).read_text(errors="replace")
    assert _status(agent, job) is None
