"""Isolation on the production-like stack: jobs submitted through the HTTP API, scheduled by the
Celery workers, run by a node agent started as a command (``python -m workers.agent
--run-jobs-as owner``, as root, syncing over HTTP with its node token). Mallory's job tries to
read Alice's running job's log and to kill it; both fail, and Alice's job completes."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.e2e.conftest import db_access, stack, stack_database, wait_for  # noqa: F401 (fixtures)
from tests.security.conftest import ACCOUNTS
from workers import runner as runner_files

pytestmark = pytest.mark.django_db

NODE = "iso-live-cpu"


@pytest.fixture(scope="module")
def live(stack, db_access, accounts):  # noqa: F811 (the fixtures imported above)
    """The stack with one CPU node whose agent runs jobs as their owners; API tokens of alice
    and mallory."""
    from django.contrib.auth import get_user_model

    from portal.core.models import Node, PolicySettings
    from portal.front.services import token_create
    from workers.agent import kill_marked_processes, marker_for

    tokens = {}
    for name in ACCOUNTS:
        user = get_user_model().objects.create_user(name, f"{name}@example.org", f"{name}-pw-123")
        tokens[name] = token_create(user, name="live")[1]
    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(name="iso", policy="fifo", active=True)
    data = Path(tempfile.mkdtemp(prefix="cosched-live-", dir="/tmp"))
    data.chmod(0o755)  # every account may traverse it: the agent's own modes must hold
    users_map = data / "users"
    users_map.write_text("".join(f"{p} {u}\n" for p, u in ACCOUNTS.items()))
    stack.start_agent(
        NODE,
        gpus=None,
        kind="cpu",
        cores="8",
        data_dir=str(data),
        run_jobs_as="owner",
        job_user_map=str(users_map),
        fallback_account="none",
    )
    wait_for(
        lambda: Node.objects.filter(name=NODE, status="up").exists(),
        60,
        what=f"the agent of {NODE} to register\n{stack.log_text(f'agent-{NODE}')}",
    )
    yield stack, tokens, data
    stack.stop(f"agent-{NODE}")
    kill_marked_processes(marker_for(data / "agent" / NODE))
    shutil.rmtree(data, ignore_errors=True)


def _submit(portal, token: str, command: str) -> int:
    code, body = portal.api(
        "POST", "/api/v1/jobs/", token, {"name": "iso", "command": command, "gpus": 0, "cpus": 1}
    )
    assert code == 201, body
    return body["id"]


def _job(job_id: int):
    from portal.core.models import Job

    return Job.objects.get(pk=job_id)


def _wait(job_id: int, states: set[str], timeout: float = 60):
    return wait_for(
        lambda: (j := _job(job_id)).state in states and j,
        timeout,
        what=f"job {job_id} to reach {sorted(states)} (now {_job(job_id).state})",
    )


# Among the heaviest live tests: in `make test-slow` (CI runs it after `make test`).
@pytest.mark.slow
def test_another_users_job_can_neither_read_nor_kill_a_running_job(live, accounts):
    portal, tokens, data = live
    secret = "ALICE-LIVE-2b8e"
    victim = _submit(portal, tokens["alice"], f"id -u; echo {secret}; sleep 15; echo done")
    _wait(victim, {"RUNNING"})
    job_file = data / "agent" / NODE / "attempts" / f"{victim}-1" / runner_files.JOB
    pid = wait_for(lambda: (runner_files.read_json(job_file) or {}).get("pid"), 20, what="pid")
    log = data / "logs" / f"job-{victim}.log"
    attack = f"cat {log}; echo read=$?; kill -KILL {pid}; echo kill=$?; env"
    attacker = _submit(portal, tokens["mallory"], attack)

    done = _wait(attacker, {"COMPLETED", "FAILED"})
    assert done.state == "COMPLETED", done.failure_reason
    text = (data / "logs" / f"job-{attacker}.log").read_text()
    assert "read=1" in text and "kill=1" in text, text
    assert secret not in text
    assert "DATABASE_URL" not in text and "REDIS_URL" not in text and "SECRET_KEY" not in text
    assert "USER=cst-mallory" in text

    ended = _wait(victim, {"COMPLETED", "FAILED"}, timeout=60)
    assert ended.state == "COMPLETED" and ended.exit_code == 0, ended.failure_reason
    lines = log.read_text().splitlines()
    assert str(accounts["alice"].pw_uid) in lines and secret in lines and "done" in lines
