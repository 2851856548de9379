"""How each node keeps its jobs apart, as its agent reports it at registration
(``NodeInfo.isolation``): stored on the node, shown to staff on the cluster page and in the
API, hidden from other users."""

from __future__ import annotations

import re
import time

import pytest

from portal.core.agent_sync import agent_sync
from portal.core.models import Node
from workers.isolation import GpuDevices, JobUsers, Limits, node_isolation
from workers.protocol import NodeInfo, SyncRequest

pytestmark = pytest.mark.django_db

WEAK_LIMITS = Limits("rlimit", reason="no cgroup v2 here")


def _register(name: str, isolation) -> Node:
    info = NodeInfo(
        "gpu", 8, 1024, "nvml", ({"index": 0, "model": "A30", "memory_mb": 24576},),
        isolation=isolation,
    )  # fmt: skip
    agent_sync(SyncRequest(node=name, instance="t", seq=1, sent_at=time.time(), info=info))
    return Node.objects.get(name=name)


def test_each_aspect_has_a_level_from_what_the_agent_detected():
    nodes = {0: "/dev/nvidia0", 1: "/dev/nvidia1"}
    owner = JobUsers.from_options("owner", fallback="none")
    strong = node_isolation(
        owner, Limits("cgroup", root="/sys/fs/cgroup/cosched"), GpuDevices("namespace", nodes)
    )
    assert [(a["what"], a["level"]) for a in strong] == [
        ("accounts", "ok"), ("limits", "ok"), ("gpu_devices", "ok"),
    ]  # fmt: skip
    weak = node_isolation(
        JobUsers.single("root"), WEAK_LIMITS, GpuDevices("none", nodes, reason="not root")
    )
    assert [a["level"] for a in weak] == ["weak", "weak", "weak"]
    assert weak[2]["text"] == "GPU devices: not constrained (not root)"
    virtual = node_isolation(JobUsers.single("root"), None, GpuDevices("none", {}, reason="x"))
    assert [(a["what"], a["level"]) for a in virtual] == [
        ("accounts", "weak"),
        ("gpu_devices", "n/a"),
    ]


def test_staff_see_each_nodes_isolation_and_users_do_not(
    client, alice, staff, alice_api, staff_api
):
    isolation = node_isolation(
        JobUsers.single("root"), WEAK_LIMITS, GpuDevices("namespace", {0: "/dev/nvidia0"})
    )
    node = _register("gpu-iso", isolation)
    assert [a["level"] for a in node.isolation] == ["weak", "weak", "ok"]
    _register("gpu-old", ())  # an agent that does not say

    client.force_login(staff)
    page = client.get("/cluster/").content.decode()
    row = page[page.index('id="nodes-table"') :]
    assert re.search(
        r'<span class="chip iso-weak" title="every job runs as root">accounts: weak', row
    )
    assert '<span class="chip iso-ok" title="GPU devices: constrained' in row
    assert "not reported" in row  # gpu-old
    client.force_login(alice)
    assert "iso-weak" not in client.get("/cluster/").content.decode()

    by_name = {n["name"]: n for n in staff_api.get("/api/v1/nodes/").json()["results"]}
    assert [a["what"] for a in by_name["gpu-iso"]["isolation"]] == [
        "accounts", "limits", "gpu_devices",
    ]  # fmt: skip
    assert by_name["gpu-old"]["isolation"] == []
    assert all(n["isolation"] is None for n in alice_api.get("/api/v1/nodes/").json()["results"])


@pytest.mark.django_db(transaction=True)
def test_cosched_nodes_lists_the_nodes_and_shows_staff_their_isolation(live_server, alice, staff):
    from portal.front.services import token_create
    from tests.portal.test_cli import run_cli

    isolation = node_isolation(
        JobUsers.single("root"), WEAK_LIMITS, GpuDevices("namespace", {0: "/dev/nvidia0"})
    )
    _register("gpu-iso", isolation)
    _register("gpu-old", ())
    as_staff = run_cli("nodes", url=live_server.url, token=token_create(staff, name="t")[1])
    assert as_staff.code == 0, as_staff.err
    lines = as_staff.out.splitlines()
    assert lines[0].split() == [
        "NODE", "STATUS", "KIND", "GPUS", "CORES", "MEMORY", "CONTAINERS", "HEARTBEAT",
        "ISOLATION",
    ]  # fmt: skip
    iso_row = next(line for line in lines if line.startswith("gpu-iso"))
    assert "1 A30" in iso_row and iso_row.endswith("weak: accounts, limits")
    assert next(line for line in lines if line.startswith("gpu-old")).endswith("not reported")
    as_user = run_cli("nodes", url=live_server.url, token=token_create(alice, name="t")[1])
    assert as_user.code == 0 and "ISOLATION" not in as_user.out and "gpu-iso" in as_user.out
