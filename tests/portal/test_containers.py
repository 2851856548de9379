"""Container jobs in the portal (docs/containers.md): the image allow-list and the check that
some node has a container runtime (a 400 naming ``container_image``, the form says so before
submit), the runtimes a node reports (stored, shown on the cluster page), the image in the
attempt a node is sent, and the scheduler's input."""

from __future__ import annotations

import pytest
from django.test import override_settings

from portal.core.models import Job, Node
from portal.core.nodes import node_register

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/"
JOB = {"name": "ctr", "command": "python train.py", "gpus": 0, "cpus": 1}


def _register(name: str, runtimes: list[str]) -> Node:
    return node_register(
        name,
        kind="cpu",
        cores=8,
        memory_mb=16384,
        backend="virtual",
        gpus=[],
        container_runtimes=runtimes,
    )


def _cosched(**changes):
    from django.conf import settings

    return override_settings(COSCHED={**settings.COSCHED, **changes})


def test_an_image_off_the_allow_list_is_a_400_naming_the_field(alice_api):
    _register("ctr-1", ["podman"])
    with _cosched(CONTAINER_IMAGES=["docker.io/library/*", "localhost/*"]):
        bad = alice_api.post(URL, {**JOB, "container_image": "evil.io/miner:1"}, format="json")
        good = alice_api.post(URL, {**JOB, "container_image": "localhost/t:1"}, format="json")
    assert bad.status_code == 400
    assert "not allowed" in bad.json()["container_image"][0]
    assert "localhost/*" in bad.json()["container_image"][0]
    assert good.status_code == 201, good.json()
    assert Job.objects.get().container_image == "localhost/t:1"


def test_an_image_that_would_be_an_option_is_a_400(alice_api):
    _register("ctr-1", ["podman"])
    for image in ("--privileged", "-v/:/host", "a b"):
        response = alice_api.post(URL, {**JOB, "container_image": image}, format="json")
        assert response.status_code == 400, image
        assert "not an image reference" in response.json()["container_image"][0]
    assert Job.objects.count() == 0


def test_without_a_node_with_a_runtime_an_image_is_a_400_naming_the_field(alice_api):
    _register("plain-1", [])
    response = alice_api.post(URL, {**JOB, "container_image": "localhost/t:1"}, format="json")
    assert response.status_code == 400
    assert "no node here has a container runtime" in response.json()["container_image"][0]
    assert Job.objects.count() == 0
    # A job without an image is fine, and one node with a runtime is enough.
    assert alice_api.post(URL, JOB, format="json").status_code == 201
    _register("ctr-1", ["podman"])
    ok = alice_api.post(URL, {**JOB, "container_image": "localhost/t:1"}, format="json")
    assert ok.status_code == 201, ok.json()


def test_the_form_says_so_before_submit(client, alice):
    client.force_login(alice)
    _register("plain-1", [])
    html = client.get("/jobs/new/").content.decode()
    assert "no node here has a container runtime" in html
    assert (
        'name="container_image"' in html
        and "disabled" in html.split('name="container_image"')[1][:200]
    )
    _register("ctr-1", ["podman"])
    with _cosched(CONTAINER_IMAGES=["localhost/*"]):
        html = client.get("/jobs/new/").content.decode()
    assert "no node here has a container runtime" not in html
    assert "Allowed images: localhost/*" in html


def test_runtimes_are_stored_and_shown_and_updated_on_reregistration(client, alice):
    _register("ctr-1", ["podman", "apptainer"])
    client.force_login(alice)
    html = client.get("/cluster/").content.decode()
    assert "Containers" in html and '<span class="chip">apptainer</span>' in html
    _register("ctr-1", [])
    assert Node.objects.get(name="ctr-1").container_runtimes == []


def test_an_agents_runtimes_reach_the_node_row_and_the_scheduler(alice):
    import time

    from portal.core import adapters
    from portal.core.agent_sync import agent_sync
    from workers.protocol import NodeInfo, SyncRequest

    info = NodeInfo(
        kind="cpu", cores=4, memory_mb=8192, backend="virtual", container_runtimes=("podman",)
    )
    agent_sync(SyncRequest(node="ctr-2", instance="t", seq=1, sent_at=time.time(), info=info))
    node = Node.objects.get(name="ctr-2")
    assert node.container_runtimes == ["podman"]
    assert adapters.node_to_domain(node).container_runtimes == ("podman",)
    job = Job.objects.create(owner=alice, name="c", command="", container_image="localhost/t:1")
    plain = Job.objects.create(owner=alice, name="p", command="true")
    assert adapters.job_to_domain(job).container and not adapters.job_to_domain(plain).container


def test_the_api_and_cosched_nodes_list_each_nodes_runtimes(live_server, alice, alice_api):
    from portal.front.services import token_create
    from tests.portal.test_cli import run_cli

    _register("ctr-1", ["podman"])
    _register("plain-1", [])
    by_name = {n["name"]: n for n in alice_api.get("/api/v1/nodes/").json()["results"]}
    assert by_name["ctr-1"]["container_runtimes"] == ["podman"]
    assert by_name["plain-1"]["container_runtimes"] == []
    result = run_cli("nodes", url=live_server.url, token=token_create(alice, name="t")[1])
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert "CONTAINERS" in lines[0].split()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    # NODE STATUS KIND GPUS CORES MEMORY(2 words) CONTAINERS HEARTBEAT...
    assert rows["ctr-1"][:8] == ["ctr-1", "up", "cpu", "-", "8", "16", "GB", "podman"]
    assert rows["plain-1"][7] == "-"
