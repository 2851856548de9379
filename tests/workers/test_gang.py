"""A gang job live (issue 10, part 4): one attempt over two nodes, each node's agent starting
its rank with the launcher environment; the job runs when every rank has started; one rank's
failure, a cancel, or the loss of a node stops every rank. Two real agents (in-process
transport), runners and job processes; the GPUs are the virtual backend's."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from portal.core import services
from portal.core.agent_sync import InProcessTransport
from portal.core.models import Gpu, Job, JobEvent, Node, Placement, PlacementPart
from portal.core.nodes import nodes_mark_lost
from scheduler.catalog import gpu_spec
from workers import runner as runner_files
from workers.agent import NodeAgent, kill_marked_processes
from workers.gpu.virtual_backend import VirtualBackend

NODES = ("gang-a", "gang-b")
ENV_NAMES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "NODE_RANK",
    "LOCAL_RANK",
    "COSCHED_NODES",
    "CUDA_VISIBLE_DEVICES",
    "COSCHED_ATTEMPT",
)


@pytest.fixture
def agents(db, tmp_path):
    made = []
    for i, name in enumerate(NODES):
        node = Node.objects.create(name=name, kind="gpu", cores=8, address=f"10.0.0.{i + 1}")
        spec = gpu_spec("V100")
        for index in range(2):
            Gpu.objects.create(node=node, index=index, model="V100", memory_mb=spec.memory_mb)
        agent = NodeAgent(
            name,
            VirtualBackend("V100x2", node=name),
            InProcessTransport(),
            cores=8,
            data_dir=tmp_path,
            address=f"10.0.0.{i + 1}",
            sample_every_s=0.0,
        )
        made.append(agent)
    yield made
    for agent in made:
        agent.shutdown(kill_jobs=True)
        kill_marked_processes(agent.marker)


def _gang(owner, command: str) -> Job:
    """A SCHEDULED job whose attempt spans both nodes (2 GPUs each), as the scheduler writes a
    gang decision."""
    job = Job.objects.create(owner=owner, name="gang", command=command, gpus=4, state="SCHEDULED")
    nodes = [Node.objects.get(name=n) for n in NODES]
    placement = Placement.objects.create(job=job, node=nodes[0], policy="test", cpus=2)
    for rank, node in enumerate(nodes):
        PlacementPart.objects.create(
            placement=placement, node=node, node_rank=rank, gpu_indices=[0, 1], cpus=2
        )
        placement.gpus.add(*Gpu.objects.filter(node=node))
    return job


def _state(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def _until(agents, predicate, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for agent in agents:
            agent.step()
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _pids(agents, job: Job) -> list[int]:
    return _until(
        agents,
        lambda: (pids := [a.job_pid(job.pk) for a in agents]) and all(pids) and pids,
        what="both ranks' processes",
    )


def test_every_rank_starts_with_the_launcher_environment(alice, agents, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    names = "|".join(ENV_NAMES)
    job = _gang(alice, f"env | grep -E '^({names})=' | sort > {out}/rank-$NODE_RANK; sleep 30")
    first, second = agents
    first.step()
    assert _state(job) == "SCHEDULED"  # rank 0 started, rank 1 not yet: not running
    _until(agents, lambda: _state(job) == "RUNNING", what="the gang to run")
    event = JobEvent.objects.filter(job=job, from_state="SCHEDULED", to_state="RUNNING").get()
    assert event.message == "all 2 ranks started on gang-a, gang-b, attempt 1"

    files = _until(agents, lambda: len(list(out.iterdir())) == 2 and sorted(out.iterdir()))
    envs = [
        dict(line.split("=", 1) for line in f.read_text().splitlines())
        for f in _until(agents, lambda: all(f.read_text() for f in files) and files)
    ]
    port = envs[0]["MASTER_PORT"]
    for rank, env in enumerate(envs):
        assert env == {
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "NODE_RANK": str(rank),
            "LOCAL_RANK": "0",
            "COSCHED_NODES": "gang-a,gang-b",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "COSCHED_ATTEMPT": "1",
        }
    assert first.log_path(job.pk).exists() and second.log_path(job.pk, 1).exists()


def test_one_ranks_failure_fails_the_job_and_stops_the_other(alice, agents, tmp_path):
    go = tmp_path / "go"
    fail = f'if [ "$NODE_RANK" = 1 ]; then while [ ! -e {go} ]; do sleep 0.05; done; exit 3; fi'
    job = _gang(alice, f"{fail}; sleep 30")
    rank0, _ = _pids(agents, job)
    go.touch()  # rank 1 fails now
    _until(agents, lambda: _state(job) == "FAILED", what="the job to fail")
    job.refresh_from_db()
    assert job.failure_reason == "exit code 3 (node rank 1)" and job.exit_code == 3
    _until(agents, lambda: not _alive(rank0), what="rank 0 to be stopped")
    part0 = PlacementPart.objects.get(placement__job=job, node_rank=0)
    _until(agents, lambda: PlacementPart.objects.get(pk=part0.pk).outcome == "killed")
    assert _state(job) == "FAILED"


def test_cancel_stops_every_rank(alice, agents):
    job = _gang(alice, "sleep 30")
    pids = _pids(agents, job)
    services.job_cancel(Job.objects.get(pk=job.pk), actor="user:alice")
    _until(agents, lambda: not any(_alive(p) for p in pids), what="both ranks to stop")
    assert _state(job) == "CANCELLED"


def test_no_rank_survives_the_loss_of_its_peers_node(alice, agents, settings):
    settings.COSCHED = {**settings.COSCHED, "LEASE_S": 3.0, "LEASE_MARGIN_S": 1.0}
    job = _gang(alice, "sleep 60")
    pid_a, pid_b = _pids(agents, job)
    first, second = agents
    # gang-b's agent goes silent (only gang-a's steps, keeping its lease): its runner stops
    # rank 1 when the lease runs out, and then writes the result (the job's exit comes first:
    # on a loaded machine the file appears well after).
    _until([first], lambda: not _alive(pid_b), timeout=30, what="rank 1 to be stopped")
    result_file = second.attempts_dir / f"{job.pk}-1" / "result.json"
    result = _until([first], lambda: runner_files.read_json(result_file), what="rank 1's result")
    assert result["outcome"] == "lease_expired"
    # ... the portal declares gang-b lost after the margin, and rank 0 on gang-a goes too.
    Node.objects.filter(name="gang-b").update(
        lease_expires_at=timezone.now() - timedelta(seconds=2)
    )
    assert nodes_mark_lost() == ["gang-b"]
    assert _state(job) == "PENDING"
    requeue = JobEvent.objects.filter(job=job, from_state="RUNNING", to_state="PENDING").get()
    assert requeue.message.startswith("node gang-b lost")
    _until([first], lambda: not _alive(pid_a), what="rank 0 to be stopped")
    # Rank 0's end lands on its superseded attempt and the timeline as a note; the job stays
    # requeued.
    part0 = PlacementPart.objects.get(placement__job=job, node_rank=0)
    _until([first], lambda: PlacementPart.objects.get(pk=part0.pk).reported_at, what="rank 0's end")
    assert _state(job) == "PENDING"
    notes = JobEvent.objects.filter(job=job, from_state="PENDING", to_state="PENDING")
    assert [e.message.split(" ended: ")[0] for e in notes] == [
        "attempt 1 on gang-a (no longer current)"
    ]


def test_the_scheduler_places_a_gang_whole_and_both_ranks_run_it(alice, agents, tmp_path):
    """A 4-GPU job on nodes of 2 GPUs: the policy (fifo, through the framework) spreads it
    over both nodes, the cycle writes one attempt with a part per node, and each node's agent
    starts its rank; the job completes when both have."""
    from portal.core.models import PolicySettings
    from portal.core.scheduling import run_cycle

    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(name="t", policy="fifo", active=True)
    for agent in agents:
        agent.step()  # registered, leases fresh
    out = tmp_path / "ranks"
    out.mkdir()
    job, _ = services.job_submit(
        alice, name="spread", command=f"echo $NODE_RANK > {out}/$NODE_RANK", gpus=4
    )
    assert run_cycle().placed == [job.pk]
    placement = Placement.objects.get(job=job)
    assert sorted(p.node.name for p in placement.parts.all()) == list(NODES)
    _until(agents, lambda: _state(job) == "COMPLETED", what="the gang to complete")
    assert sorted(f.name for f in out.iterdir()) == ["0", "1"]
    assert all(p.outcome == "exited" and p.exit_code == 0 for p in placement.parts.all())
