"""Rolling upgrades: the portal accepts node agents one protocol version older and answers them
in their own version. The previous release's agent itself (its files taken from git history at
the last commit of protocol 1, run as a separate process) registers with the new portal, runs a
job to completion and is shown as one version older on the cluster page."""

from __future__ import annotations

import subprocess
import tarfile
import time
from io import BytesIO
from pathlib import Path

import pytest

from portal.core.models import Job, Node
from portal.core.scheduling import run_cycle
from portal.core.services import job_submit
from tests.processes import cpu_agent_command
from workers.protocol import (
    OLDEST_AGENT_VERSION,
    PROTOCOL_VERSION,
    ProtocolError,
    SyncRequest,
)

REPO = Path(__file__).resolve().parents[2]
# The last commit whose node protocol is version 1 (before the version window of protocol 2).
PROTOCOL_1_COMMIT = "21aad3a386c60682bbd7da41d780a97f15300fa3"


def test_the_portal_accepts_one_version_older_and_refuses_the_rest():
    assert OLDEST_AGENT_VERSION == PROTOCOL_VERSION - 1
    base = {"node": "n", "instance": "i", "seq": 1, "sent_at": 1.0}
    assert SyncRequest.from_json({**base, "version": OLDEST_AGENT_VERSION}).version == 1
    assert SyncRequest.from_json({**base, "version": PROTOCOL_VERSION}).version == 2
    with pytest.raises(ProtocolError, match="upgrade the agent"):
        SyncRequest.from_json({**base, "version": OLDEST_AGENT_VERSION - 1})
    with pytest.raises(ProtocolError, match="upgrade the portal first"):
        SyncRequest.from_json({**base, "version": PROTOCOL_VERSION + 1})


def _old_tree(dest: Path) -> Path:
    """``workers/`` and ``scheduler/`` as they were at ``PROTOCOL_1_COMMIT``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", PROTOCOL_1_COMMIT, "workers", "scheduler"],
        capture_output=True,
        check=False,
    )
    assert archive.returncode == 0, (
        "this test needs the repository's history (a full clone): "
        + archive.stderr.decode(errors="replace")
    )
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    assert "PROTOCOL_VERSION = 1\n" in (dest / "workers" / "protocol.py").read_text()
    return dest


@pytest.mark.django_db(transaction=True)
def test_the_previous_agent_runs_a_job_against_the_new_portal(live_server, alice, staff, tmp_path):
    old = _old_tree(tmp_path / "old")
    argv, env = cpu_agent_command("v1-node", live_server.url, tmp_path)
    env["PYTHONPATH"] = str(old)
    log = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen(argv, cwd=old, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not Node.objects.filter(name="v1-node", agent_version__gt=0).exists():
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
            time.sleep(0.2)
        node = Node.objects.get(name="v1-node")
        assert node.agent_version == 1 and node.agent_outdated

        job, _ = job_submit(alice, name="on-v1", command="echo hello-from-v1", cpus=1)
        deadline = time.monotonic() + 60
        while Job.objects.get(pk=job.pk).state != "COMPLETED":
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            assert time.monotonic() < deadline, (
                f"job {Job.objects.get(pk=job.pk).state}: "
                + (tmp_path / "agent.log").read_text()[-3000:]
            )
            run_cycle()
            time.sleep(0.3)
        part = job.placements.get().parts.get()
        assert part.node.name == "v1-node" and part.exit_code == 0
        assert Job.objects.get(pk=job.pk).exit_code == 0

        from django.test import Client

        client = Client()
        client.force_login(staff)
        page = client.get("/cluster/").content.decode()
        assert f'id="node-outdated-{node.pk}"' in page
        assert "agent protocol 1: upgrade the agent" in page
    finally:
        agent.terminate()
        agent.wait(15)
        log.close()
