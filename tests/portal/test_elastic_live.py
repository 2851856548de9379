"""An elastic job live (issue 17, part 4): two node agents with two virtual V100 each start one
process per GPU (``workers.emulate_elastic`` ranks, which only train once every rank of the
group has joined rank 0 at ``MASTER_ADDR:MASTER_PORT``); the job reports its windows through
the training SDK over HTTP (pytest-django's live server) with its job token; the ``elastic``
policy's cycle answers; each change regroups the job into its next attempt.

Checked: it grows 1 -> 2 -> 3 -> 4 workers while S holds (across the two nodes: WORLD_SIZE 3
and 4 span them), falls back to 3 when 3 -> 4 does not pay (S = 0.05), and a rank on a GPU
slowed on purpose is replaced by the idle spare, after which the group runs at full speed.
Real agents, runners, rank processes, sockets and HTTP; only the GPUs are virtual.
"""

from __future__ import annotations

import time

import pytest

from portal.core.agent_sync import InProcessTransport
from portal.core.models import ElasticChange, Gpu, Job, JobEvent, Node, Placement, PolicySettings
from portal.core.scheduling import run_cycle
from scheduler.catalog import gpu_spec
from workers.agent import NodeAgent, kill_marked_processes
from workers.gpu.virtual_backend import VirtualBackend
from workers.report_lines import parse_report

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NODES = ("el-a", "el-b")
CURVE = "1:10,2:20,3:29,4:29.5"  # S: 1->2 1.0, 2->3 0.9, 3->4 0.05 (not above 0.1)


@pytest.fixture
def agents(live_server, tmp_path):
    made = []
    for name in NODES:
        node = Node.objects.create(name=name, kind="gpu", cores=8, address="127.0.0.1")
        for index in range(2):
            Gpu.objects.create(
                node=node, index=index, model="V100", memory_mb=gpu_spec("V100").memory_mb
            )
        made.append(
            NodeAgent(
                name,
                VirtualBackend("V100x2", node=name),
                InProcessTransport(portal_url=live_server.url),
                cores=8,
                data_dir=tmp_path,  # one checkpoint root: the nodes' shared storage
                address="127.0.0.1",
                sample_every_s=0.0,
            )
        )
    for agent in made:
        agent.stop_grace_s = 2.0
    yield made
    for agent in made:
        agent.shutdown(kill_jobs=True)
        kill_marked_processes(agent.marker)


def test_an_elastic_job_regroups_its_ranks_grows_falls_back_and_replaces_a_straggler(
    agents, alice, tmp_path
):
    PolicySettings.objects.create(
        name="e",
        policy="elastic",
        params={"scale_step_workers": 1, "scale_interval_batches": 20},
        active=True,
    )
    job = Job.objects.create(
        owner=alice,
        name="elastic-live",
        kind="dl-train",
        gpus=1,
        gpu_memory_mb=2000,
        elastic_min_workers=1,
        elastic_max_workers=4,
        command=f"python -m workers.emulate_elastic --curve {CURVE} --steps 700 --warmup-s 0.3"
        " --slow-gpu el-b/0 --slow-factor 0.4 --slow-after-s 9 --rendezvous-timeout-s 30",
    )
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        for agent in agents:
            agent.step()
        run_cycle()
        job.refresh_from_db()
        if job.state in ("COMPLETED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.1)
    log = (tmp_path / "logs" / f"job-{job.pk}.log").read_text()
    assert job.state == "COMPLETED", (job.state, job.failure_reason, log[-3000:])

    changes = list(ElasticChange.objects.filter(job=job).order_by("id"))
    summary = [(c.kind, c.workers_from, c.workers_to, c.ranks, c.applied) for c in changes]
    scales = [(c.workers_from, c.workers_to) for c in changes if c.kind == "scale"]
    assert scales[:4] == [(1, 2), (2, 3), (3, 4), (4, 3)], summary
    assert "S=0.05" in [c for c in changes if c.kind == "scale"][3].reason
    assert all(c.applied and c.attempt for c in changes), summary

    # every change is an attempt of its own, with the new group's GPUs; the old one regrouped
    attempts = list(Placement.objects.filter(job=job).order_by("attempt"))
    assert len(attempts) == len(changes) + 1
    assert all(p.outcome == "regrouped" for p in attempts[:-1])
    sizes = [p.gpus.count() for p in attempts]
    assert sizes[:5] == [1, 2, 3, 4, 3]
    assert [p.parts.count() for p in attempts[:5]] == [1, 1, 2, 2, 2]  # 3 and 4 span the nodes

    # the ranks really formed each group: rank 0 says how many joined and on which GPUs
    groups = [parse_report(line) for line in log.splitlines() if "change=group_of_" in line]
    assert [r.get("workers") for r in groups][:5] == [1, 2, 3, 4, 3]
    assert groups[3].get("gpus").split(",") == ["el-a/0", "el-a/1", "el-b/0", "el-b/1"]

    # the rank on the slow GPU (el-b/0) was replaced by the spare (el-b/1 was idle again)
    replaced = [c for c in changes if c.kind == "replace"]
    assert replaced, summary
    assert "rank 2" in replaced[0].reason and replaced[0].ranks == [2]
    last = attempts[-1]
    held = {f"{g.node.name}/{g.index}" for g in last.gpus.select_related("node")}
    assert "el-b/0" not in held and len(held) == 3
    progress = [parse_report(line) for line in log.splitlines() if "@cosched progress" in line]
    assert progress[-1].get("slowest") == 1.0  # healthy again after the replacement
    assert any(r.get("slowest") == 0.4 for r in progress)  # it was slow before
    assert JobEvent.objects.filter(job=job, message__contains="regrouped: attempt").exists()
