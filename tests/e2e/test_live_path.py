"""The live path end to end: API -> scheduler workers -> node agents -> real processes -> rows.

Each test submits through the HTTP API like a CI pipeline and watches the database the other
processes write. The node agents sync with the portal over HTTP (their node tokens only, no
database access) and use the ``virtual`` GPU backend (no GPU here); everything else is real:
gunicorn, PostgreSQL, Redis, Celery workers and beat, runners and job subprocesses.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.e2e.conftest import wait_for

# The marker makes pytest-django create the test database even when this module runs alone;
# each test's own transaction writes nothing (the stack's processes write, and commit).
pytestmark = pytest.mark.django_db

GPU_NODE = "e2e-gpu"
CPU_NODE = "e2e-cpu"


@pytest.fixture(scope="module")
def cluster(stack, db_access):
    """A virtual GPU node (8 Titan Xp) and a CPU node (32 cores), fifo policy."""
    from portal.core.models import Node, PolicySettings

    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(name="e2e", policy="fifo", active=True)
    stack.start_agent(GPU_NODE, gpus="TitanXpx8", cores="16")
    stack.start_agent(CPU_NODE, gpus=None, kind="cpu", cores="32")

    def registered() -> bool:
        return Node.objects.filter(name__in=[GPU_NODE, CPU_NODE], status="up").count() == 2

    wait_for(registered, 40, what="both node agents to register")
    return stack


def job_row(job_id: int):
    from portal.core.models import Job

    return Job.objects.get(pk=job_id)


def wait_state(job_id: int, states: set[str], timeout: float = 40) -> object:
    return wait_for(
        lambda: (j := job_row(job_id)).state in states and j,
        timeout,
        what=f"job {job_id} to reach {sorted(states)} (now {job_row(job_id).state})",
    )


def submit(stack, token: str, **body) -> int:
    body.setdefault("gpus", 1)
    if body["gpus"]:
        body.setdefault("gpu_memory_mb", 2000)
    code, data = stack.api("POST", "/api/v1/jobs/", token, body)
    assert code == 201, data
    return data["id"]


def procs_with(marker: str) -> list[int]:
    """PIDs whose command line contains ``marker`` (the job processes we started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline and "pytest" not in cmdline:
                found.append(int(entry.name))
    return found


def test_submit_runs_to_completion_with_metrics(cluster, user_token):
    from portal.core.models import JobEvent, MetricSample

    _, token = user_token
    job_id = submit(
        cluster,
        token,
        name="emulated",
        kind="dl-train",
        command="python -m workers.emulate --profile e2e --duration 2 --report-every 0.2",
    )
    job = wait_state(job_id, {"COMPLETED", "FAILED"}, timeout=60)
    assert job.state == "COMPLETED", (job.failure_reason, cluster.log_text(f"agent-{GPU_NODE}"))
    assert job.exit_code == 0
    path = [e.to_state for e in JobEvent.objects.filter(job_id=job_id).order_by("at", "id")]
    assert path[:4] == ["PENDING", "SCHEDULED", "RUNNING", "COMPLETED"] or path[1:4] == [
        "SCHEDULED",
        "RUNNING",
        "COMPLETED",
    ], path
    placement = job.placements.get()
    assert placement.node.name == GPU_NODE and placement.explanation
    assert MetricSample.objects.filter(job_id=job_id, metric="progress").exists()
    assert MetricSample.objects.filter(gpu__node__name=GPU_NODE, metric="util_pct").exists()
    code, data = cluster.api("GET", f"/api/v1/jobs/{job_id}/", token)
    assert code == 200 and data["state"] == "COMPLETED"
    # The whole log reached the portal over the agent's HTTP syncs (docs/job-control.md).
    from portal.core.models import JobLogChunk

    full = "".join(JobLogChunk.objects.filter(job_id=job_id).values_list("text", flat=True))
    assert "@cosched" in full and full.count("@cosched") >= 5, full[-2000:]


def test_failing_command_is_failed_with_its_exit_code(cluster, user_token):
    _, token = user_token
    job_id = submit(
        cluster, token, name="boom", gpus=0, command="echo to-stderr >&2; echo out; exit 3"
    )
    job = wait_state(job_id, {"COMPLETED", "FAILED"})
    assert job.state == "FAILED" and job.exit_code == 3
    assert job.placements.get().node.name == CPU_NODE
    code, data = cluster.api("GET", f"/api/v1/jobs/{job_id}/log/", token)
    assert code == 200, data
    assert "to-stderr" in data["text"] and "out" in data["text"], data
    assert data["source"] in ("live", "file")
    # The attempt and its part say how it ended, from the agent's own report.
    code, data = cluster.api("GET", f"/api/v1/jobs/{job_id}/", token)
    assert code == 200 and data["attempts"][0]["exit_code"] == 3, data
    assert data["attempts"][0]["outcome"] == "failed"


def test_pause_resume_and_cancel_reach_the_process(cluster, user_token):
    _, token = user_token
    marker = f"e2e-pause-{os.getpid()}-{time.time_ns()}"
    job_id = submit(
        cluster,
        token,
        name="sleeper",
        gpus=0,
        command=f"python -c 'import time; time.sleep(120)' {marker}",
    )
    wait_state(job_id, {"RUNNING"})
    pids = wait_for(lambda: procs_with(marker), 10, what="the job's process")

    def proc_state(pid: int) -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    code, data = cluster.api("POST", f"/api/v1/jobs/{job_id}/pause/", token)
    assert code == 200 and data["state"] == "PAUSED"
    wait_for(lambda: all(proc_state(p) == "T" for p in pids), 10, what="SIGSTOP")

    code, data = cluster.api("POST", f"/api/v1/jobs/{job_id}/resume/", token)
    assert code == 200 and data["state"] == "RUNNING"
    wait_for(lambda: all(proc_state(p) != "T" for p in pids), 10, what="SIGCONT")

    code, data = cluster.api("POST", f"/api/v1/jobs/{job_id}/cancel/", token)
    assert code == 200 and data["state"] == "CANCELLED"
    wait_for(lambda: not procs_with(marker), 20, what="the cancelled job's process to die")
    # The agent's report of the kill is recorded on the attempt, and leaves CANCELLED alone.
    from portal.core.models import PlacementPart

    part = wait_for(
        lambda: PlacementPart.objects.filter(
            placement__job_id=job_id, reported_at__isnull=False
        ).first(),
        20,
        what="the agent's report of the kill",
    )
    assert part.outcome == "killed"
    assert job_row(job_id).state == "CANCELLED"


@pytest.mark.slow
def test_two_hundred_jobs_two_scheduler_workers_no_double_placement(cluster, user_token):
    from portal.core.models import JobEvent, Placement

    _, token = user_token
    ids = []
    for i in range(200):
        gpu = i % 2 == 0
        ids.append(
            submit(
                cluster,
                token,
                name=f"burst-{i}",
                gpus=1 if gpu else 0,
                gpu_memory_mb=1000 if gpu else None,
                command="sleep 0.3",
            )
        )
    wait_for(
        lambda: (
            all(job_row(i).state in {"COMPLETED", "FAILED"} for i in ids[-20:])
            and all(job_row(i).state in {"COMPLETED", "FAILED"} for i in ids)
        ),
        180,
        interval=1.0,
        what="200 jobs to finish",
    )
    assert {job_row(i).state for i in ids} == {"COMPLETED"}

    # Each job was placed exactly once.
    scheduled = defaultdict(int)
    for event in JobEvent.objects.filter(job_id__in=ids, to_state="SCHEDULED"):
        scheduled[event.job_id] += 1
    assert set(scheduled.values()) == {1} and len(scheduled) == 200
    assert Placement.objects.filter(job_id__in=ids).count() == 200

    # No GPU held by two exclusive jobs at once; no node over its cores.
    placements = list(
        Placement.objects.filter(job_id__in=ids).select_related("node").prefetch_related("gpus")
    )
    per_gpu = defaultdict(list)
    for p in placements:
        assert p.released_at is not None
        for g in p.gpus.all():
            per_gpu[g.pk].append((p.created_at, p.released_at))
    for intervals in per_gpu.values():
        intervals.sort()
        for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
            assert start >= end, "two exclusive jobs overlapped on one GPU"
    events = []
    for p in placements:
        events += [(p.created_at, 1, p.cpus, p.node.name), (p.released_at, -1, p.cpus, p.node.name)]
    in_use = defaultdict(int)
    for _, sign, cpus, node in sorted(events, key=lambda e: (e[0], e[1])):
        in_use[node] += sign * cpus
        limit = 16 if node == GPU_NODE else 32
        assert in_use[node] <= limit, f"{node} over-committed: {in_use[node]} cores"


# Among the heaviest live tests: in `make test-slow` (CI runs it after `make test`).
@pytest.mark.slow
def test_node_loss_requeues_and_the_job_runs_again(cluster, user_token):
    from portal.core.models import JobEvent, Node

    _, token = user_token
    marker = f"e2e-lost-{os.getpid()}-{time.time_ns()}"
    job_id = submit(
        cluster,
        token,
        name="survivor",
        gpus=1,
        command=f"python -c 'import time; time.sleep(3)' {marker}",
    )
    wait_state(job_id, {"RUNNING"})
    # The GPU node dies: agent, runners and job processes, no goodbye.
    cluster.kill_node(GPU_NODE)
    wait_for(lambda: not procs_with(marker), 10, what="the node's processes to die")

    wait_for(lambda: Node.objects.get(name=GPU_NODE).status == "down", 40, what="node marked down")
    wait_for(
        lambda: JobEvent.objects.filter(
            job_id=job_id, from_state="RUNNING", to_state="PENDING"
        ).exists(),
        20,
        what="the job to be requeued",
    )
    event = JobEvent.objects.filter(job_id=job_id, to_state="PENDING", from_state="RUNNING").get()
    assert GPU_NODE in event.message
    assert job_row(job_id).requeue_count == 1

    cluster.start_agent(GPU_NODE, gpus="TitanXpx8", cores="16")
    job = wait_state(job_id, {"COMPLETED", "FAILED"}, timeout=60)
    assert job.state == "COMPLETED"
    assert job.placements.count() == 2
