"""Node operations like scontrol: drain (finish running jobs, start none), down with a reason
(requeue now, stay down while the agent syncs) and resume, through the API, the CLI and the
scheduling loop with real job processes (the embedded loop, virtual CPU nodes)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from portal.core.models import Job, Node, Placement
from portal.core.node_ops import node_drain, node_resume
from portal.core.services import job_submit
from portal.front.services import token_create
from tests.embedded import embedded_loop
from tests.portal.test_cli import run_cli

WAIT_S = 60.0


def wait(condition: Any, what: str, timeout: float = WAIT_S) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _state(job: Job) -> str:
    job.refresh_from_db()
    return job.state


def _nodes_of(job: Job) -> set[str]:
    return set(
        Placement.objects.filter(job=job).values_list("parts__node__name", flat=True).distinct()
    )


# -- API --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_only_staff_operate_nodes_and_drain_needs_a_reason(alice_api, staff_api):
    node = Node.objects.create(name="ops-1", kind="cpu", cores=2, memory_mb=1024)
    assert alice_api.post(f"/api/v1/nodes/{node.name}/drain/", {"reason": "x"}).status_code == 403
    node.refresh_from_db()
    assert node.status == Node.Status.UP

    no_reason = staff_api.post(f"/api/v1/nodes/{node.name}/drain/", {}, format="json")
    assert no_reason.status_code == 400
    assert "reason" in no_reason.json()
    assert staff_api.post("/api/v1/nodes/nope/drain/", {"reason": "x"}).status_code == 404

    drained = staff_api.post(
        f"/api/v1/nodes/{node.name}/drain/", {"reason": "new fan"}, format="json"
    )
    assert drained.status_code == 200, drained.content
    body = drained.json()
    assert body["status"] == "draining" and body["state"] == "drained"  # nothing runs there
    assert body["state_reason"] == "new fan" and body["state_changed_by"] == "user:sam"
    # others see the reason but not who
    seen = alice_api.get(f"/api/v1/nodes/{node.pk}/").json()
    assert seen["state_reason"] == "new fan" and seen["state_changed_by"] is None

    resumed = staff_api.post(f"/api/v1/nodes/{node.pk}/resume/", format="json")
    assert resumed.status_code == 200 and resumed.json()["state"] == "up"
    again = staff_api.post(f"/api/v1/nodes/{node.pk}/resume/", format="json")
    assert again.status_code == 400 and "up already" in again.json()["node"][0]


@pytest.mark.django_db
def test_a_staff_down_survives_the_agents_sync_and_registration():
    from portal.core.agent_sync import _renew
    from portal.core.node_ops import node_down
    from portal.core.nodes import node_register

    node = Node.objects.create(name="ops-2", kind="cpu", cores=2, memory_mb=1024)
    node_down(node, actor="user:sam", reason="disk errors")
    node_register("ops-2", kind="cpu", cores=2, memory_mb=1024, backend="virtual", gpus=[])
    node.refresh_from_db()
    assert node.status == Node.Status.DOWN and node.held_down

    class Req:  # the fields _renew reads of a SyncRequest
        seq = 1
        instance = "agent-a"
        version = 2

    from django.utils import timezone

    _renew(node, Req(), timezone.now())  # type: ignore[arg-type]
    node.refresh_from_db()
    assert node.status == Node.Status.DOWN
    node_resume(node, actor="user:sam")
    node.refresh_from_db()
    assert node.status == Node.Status.UP and not node.held_down and node.state_reason == ""


# -- the loop: drained nodes finish their jobs and get none -----------------------------------


@pytest.fixture
def two_nodes(transactional_db, settings, tmp_path) -> Iterator[list[Any]]:
    for name in ("ops-a", "ops-b"):
        Node.objects.create(name=name, kind="cpu", cores=2, memory_mb=4096, backend="virtual")
    settings.COSCHED = {**settings.COSCHED, "STOP_GRACE_S": 1.0}
    with embedded_loop(settings, tmp_path / "logs") as agents:
        yield agents


def test_drain_lets_running_jobs_finish_and_down_requeues_them(alice, two_nodes):
    a = Node.objects.get(name="ops-a")
    b = Node.objects.get(name="ops-b")
    node_drain(b, actor="user:sam", reason="test: keep job 1 on ops-a")
    first, _ = job_submit(alice, name="first", command="sleep 4", cpus=2)
    wait(lambda: _state(first) == "RUNNING", "the first job running")
    assert _nodes_of(first) == {"ops-a"}

    # Drain ops-a while its job runs; resume ops-b: new work goes to ops-b only.
    node_resume(b, actor="user:sam")
    node_drain(a, actor="user:sam", reason="test: maintenance")
    second, _ = job_submit(alice, name="second", command="sleep 60", cpus=1)
    third, _ = job_submit(alice, name="third", command="sleep 60", cpus=1)
    wait(lambda: _state(second) == "RUNNING" and _state(third) == "RUNNING", "two more running")
    assert _nodes_of(second) == {"ops-b"} and _nodes_of(third) == {"ops-b"}

    wait(lambda: _state(first) == "COMPLETED", "the first job completed on the drained node")
    assert Placement.objects.filter(job=first).count() == 1  # never preempted
    a.refresh_from_db()
    assert a.status == Node.Status.DRAINING and a.state_reason == "test: maintenance"

    # Down ops-b: its jobs go back to the queue, and stay off it although its agent syncs.
    from portal.core.node_ops import node_down

    _, requeued = node_down(b, actor="user:sam", reason="test: PSU")
    assert sorted(requeued) == sorted([second.pk, third.pk])
    wait(lambda: _state(second) == "PENDING" and _state(third) == "PENDING", "both requeued")
    time.sleep(3)  # several agent syncs and cycles
    b.refresh_from_db()
    assert b.status == Node.Status.DOWN
    assert _state(second) == "PENDING" and _state(third) == "PENDING"
    assert "ops-b" not in {
        p.node.name
        for p in Placement.objects.filter(active=True).prefetch_related("parts__node")
        for p in p.parts.all()
    }
    # Resume ops-a: they run there.
    node_resume(a, actor="user:sam")
    wait(lambda: _state(second) == "RUNNING" and _state(third) == "RUNNING", "running on ops-a")
    assert Placement.objects.filter(job=second, active=True).get().parts.get().node.name == "ops-a"


# -- the CLI ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_cli_drain_down_resume(live_server, staff, alice):
    Node.objects.create(name="ops-cli", kind="cpu", cores=2, memory_mb=1024)
    _, key = token_create(staff, name="ops")
    _, alice_key = token_create(alice, name="mine")
    url = live_server.url

    missing = run_cli("nodes", "drain", "ops-cli", url=url, token=key)
    assert missing.code == 2 and "--reason" in missing.err

    drained = run_cli("nodes", "drain", "ops-cli", "--reason", "firmware", url=url, token=key)
    assert drained.code == 0, drained.err
    assert "ops-cli: drained" in drained.out
    listed = run_cli("nodes", url=url, token=key)
    assert "drained" in listed.out and "firmware" in listed.out

    refused = run_cli("nodes", "resume", "ops-cli", url=url, token=alice_key)
    assert refused.code != 0
    assert Node.objects.get(name="ops-cli").status == Node.Status.DRAINING

    down = run_cli("nodes", "down", "ops-cli", "--reason", "PSU", url=url, token=key)
    assert down.code == 0 and "down (staff)" in down.out and "requeued: none" in down.out
    resumed = run_cli("nodes", "resume", "ops-cli", url=url, token=key)
    assert resumed.code == 0 and "ops-cli: up" in resumed.out
    assert run_cli("nodes", "drain", "nope", "--reason", "x", url=url, token=key).code == 4


# -- node tokens from a staff page ------------------------------------------------------------


@pytest.mark.django_db
def test_staff_create_and_revoke_node_tokens_from_the_page(client, staff, alice):
    from portal.core.models import NodeToken
    from portal.core.nodes import node_token_node

    client.force_login(alice)
    assert client.get("/cluster/node-tokens/").status_code == 403
    client.force_login(staff)
    empty = client.get("/cluster/node-tokens/")
    assert empty.status_code == 200 and "No node tokens yet" in empty.content.decode()
    assert 'id="node-tokens-link"' in client.get("/cluster/").content.decode()

    bad = client.post("/cluster/node-tokens/", {"node_name": "gpu 1"})
    assert bad.status_code == 400 and "no spaces" in bad.content.decode()
    assert not NodeToken.objects.exists()

    made = client.post("/cluster/node-tokens/", {"node_name": "gpu-9"})
    assert made.status_code == 200 and made["Cache-Control"] == "no-store"
    key = re.search(r'id="new-node-key">([^<]+)<', made.content.decode()).group(1)
    assert node_token_node(key) == "gpu-9"  # the key shown works for that node
    token = NodeToken.objects.get()
    assert key not in client.get("/cluster/node-tokens/").content.decode()  # shown once

    revoked = client.post(f"/cluster/node-tokens/{token.pk}/revoke/", follow=True)
    assert "revoked" in revoked.content.decode()
    assert node_token_node(key) is None
    again = client.post(f"/cluster/node-tokens/{token.pk}/revoke/", follow=True)
    assert "was revoked already" in again.content.decode()
